"""A full or read-only disk under the engine: how it is recognised, probed and cleaned up
after (`engine.spark.job.EngineJob` waits it out and resumes).

Every write of the engine (Spark's offsets, commits and state store files, the Parquet
files of a batch, the Delta commits, the landing files' deletion) fails the same way
when the disk is full (ENOSPC, or the user's quota: EDQUOT) or mounted read-only
(EROFS), but each library says so in its own words: Java's `IOException: No space left
on device`, pyarrow's `[errno 28]`, delta-rs's `(os error 28)`. `fault_of` reads any of
them from an error or from the text of a failed query.

Whether the disk takes writes again is found out by writing a small file
(`probe`) rather than by restarting the query each time. What a failed write left
behind is removed before the query starts again: Spark's hidden `.tmp` files in the
checkpoint folders (`remove_temporaries`) and the Parquet files of the batches that
never committed (`engine.tables.remove_orphans`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from lookout.config import S3Config
from lookout.storage import filesystem

DISK_FULL = "disk full"
READ_ONLY = "read-only"

PROBLEMS = {errno.ENOSPC: DISK_FULL, errno.EDQUOT: DISK_FULL, errno.EROFS: READ_ONLY}
"""The errors the engine waits out, by errno, and what it calls each."""

_TEXT = re.compile(
    r"No space left on device|Disk quota exceeded|Read-only file system"
    r"|\[errno (28|122|30)\]|os error (28|122|30)\b",
    re.IGNORECASE,
)
_BY_TEXT = {
    "no space left on device": DISK_FULL,
    "disk quota exceeded": DISK_FULL,
    "read-only file system": READ_ONLY,
}

PROBE_BYTES = 1 << 20
"""A probe writes this much: a disk with less room than that cannot run a batch (and
the room the engine frees on a full disk, its reserve and what failed writes left, is
not mistaken for space come back)."""

RESERVE_BYTES = 64 << 10
"""The room the engine keeps in `_health` for its health record on a full disk."""

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 16.0
"""Pauses between tries while the disk fails: the first, doubling up to the last."""


def fault_of(error: BaseException | str) -> str | None:
    """`disk full` or `read-only` when `error` (an exception, or the text of one: a
    failed query's, with its Java and Python causes) says so; else None."""
    if isinstance(error, OSError) and error.errno in PROBLEMS:
        return PROBLEMS[error.errno]
    found = _TEXT.search(str(error))
    if found is None:
        return None
    code = found.group(1) or found.group(2)
    if code is not None:
        return PROBLEMS[int(code)]
    return _BY_TEXT[found.group(0).lower()]


def fault_line(text: str, limit: int = 300) -> str:
    """The line of `text` that names the fault (the first line when none does), cut to
    `limit` characters: what the log and the health record quote."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = next((x for x in lines if _TEXT.search(x)), lines[0] if lines else "")
    line = line.removeprefix("Caused by: ")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def probe(folder: str, s3: S3Config) -> OSError | None:
    """Write (and delete) a `PROBE_BYTES` file in `folder`: None when that worked, else
    the error."""
    fs, root = filesystem(folder, s3)
    path = f"{root.rstrip('/')}/.lookout-probe-{os.getpid()}"
    try:
        fs.create_dir(root, recursive=True)
        with fs.open_output_stream(path) as out:
            out.write(b"\0" * PROBE_BYTES)
    except OSError as err:
        return err
    finally:
        with contextlib.suppress(OSError):
            fs.delete_file(path)
    return None


def remove_temporaries(folder: str, s3: S3Config) -> list[str]:
    """Delete the hidden temporary files under `folder` (a query's checkpoint): Spark
    writes each checkpoint file as `.<name>.<uuid>.tmp` (with checksums also its
    `..<name>.<uuid>.tmp.crc`) and renames it, and a write that failed leaves it there.
    Only while no query writes there. Returns the paths deleted (best effort: a file
    that cannot be deleted stays)."""
    fs, root = filesystem(folder, s3)
    try:
        found = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except OSError:
        return []
    deleted = []
    for info in found:
        name = info.base_name
        if info.type == pafs.FileType.File and name.startswith(".") and ".tmp" in name:
            try:
                fs.delete_file(info.path)
            except OSError:
                continue
            deleted.append(info.path)
    return deleted


def keep_reserve(path: str, s3: S3Config) -> bool:
    """Make sure the reserve file at `path` holds `RESERVE_BYTES` (only on a local disk:
    an object store is never full); whether it does (a disk without the room keeps no
    half reserve)."""
    fs, local = filesystem(path, s3)
    if not isinstance(fs, pafs.LocalFileSystem):
        return True
    with contextlib.suppress(OSError):
        if os.path.getsize(local) >= RESERVE_BYTES:
            return True
    try:
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with open(local, "wb") as out:
            out.write(b"\0" * RESERVE_BYTES)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(local)
        return False
    return True


def release_reserve(path: str, s3: S3Config) -> bool:
    """Delete the reserve file at `path`, so that what must be written on a full disk
    (the health record saying so) finds room; whether there was one."""
    fs, local = filesystem(path, s3)
    if not isinstance(fs, pafs.LocalFileSystem):
        return False
    try:
        os.unlink(local)
    except OSError:
        return False
    return True


@dataclass
class StorageFault:
    """The engine's writes failing for a full or read-only disk: since when, where, what
    the failure said, and when to try again (monotonic seconds, doubling pauses)."""

    problem: str  # DISK_FULL or READ_ONLY
    path: str  # the location that failed
    error: str  # the failure, one line
    since_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    tries: int = 0  # restarts of the query so far
    delay_s: float = RETRY_FIRST_S
    retry_at: float = field(default_factory=lambda: time.monotonic() + RETRY_FIRST_S)
    restarted_at: float | None = None  # the query restarted, not yet through a batch
    batches_at_restart: int = 0

    def wait_longer(self) -> None:
        """Try again after the next pause (doubled, up to `RETRY_MAX_S`)."""
        self.retry_at = time.monotonic() + self.delay_s
        self.delay_s = min(self.delay_s * 2, RETRY_MAX_S)

    def describe(self) -> str:
        """The fault in a sentence (log lines, the dashboard's health problems)."""
        return f"{self.problem} at {self.path}: {self.error}"

    def record(self) -> dict[str, Any]:
        """What the health record says of it."""
        return {
            "problem": self.problem,
            "path": self.path,
            "error": self.error,
            "since_ms": self.since_ms,
            "retries": self.tries,
            "next_retry_ms": int((time.time() + max(self.retry_at - time.monotonic(), 0)) * 1000),
        }
