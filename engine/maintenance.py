"""Table maintenance: the lakehouse's small files compacted, and later deleted, while
the engine runs.

Every batch appends a small file to each table it writes, about two a second per table
under load (some 170,000 a day), and a Delta table costs more to open, to read and to
append to the more files it holds: with delta-rs on this machine
(`benchmarks/table_files.py`), 10,000 files took 12 ms to open and 8 ms per append,
80,000 files 80 and 44 ms. Compaction (delta-rs ``optimize.compact``) rewrites the small
files into a few; a checkpoint right after keeps the next opens from replaying the
compaction's removes: the 80,000-file table then opened in 25 ms and took appends in
2 ms.

Compaction commits concurrently with the engine's appends (it removes only files it
read, which an append never touches). The files it replaces stay on disk, and their
removes in the checkpoints, for the table's retention (``delta.deletedFileRetentionDuration``,
1 hour on the tables Lookout makes: ``engine.tables``): a reader holding an older version
may still read them. After that each round's ``VACUUM`` deletes them (delta-rs's lite
vacuum: only files the log removed, never one an append is writing).

A round's work (reading and rewriting minutes of readings) runs in a child process
at the lowest CPU priority (:class:`MaintenanceProcess`), not in the engine's driver:
it then takes only the CPU the engine's batches leave, instead of stalling them for
seconds every round.

The log itself grows by a commit file per append, and every reader lists the
``_delta_log`` folder; Delta's own cleanup keeps 30 days of commits. So each round also
deletes the commit and checkpoint files below the newest settled checkpoint
(:func:`clean_log`): every version from that checkpoint on stays readable.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from lookout.config import S3Config
from lookout.storage import DEFAULT_S3, delta_options, filesystem

log = logging.getLogger("lookout.maintenance")


@dataclass(frozen=True)
class Compaction:
    """One table's last compaction: files before, removed and added, and how long."""

    at_ms: int
    files_before: int
    files_removed: int
    files_added: int
    seconds: float


def compact(table: DeltaTable, min_files: int) -> Compaction | None:
    """Compact ``table`` and checkpoint it, if it holds at least ``min_files`` files;
    None if it does not."""
    files = len(table.file_uris())
    if files < min_files:
        return None
    started = time.perf_counter()
    metrics = table.optimize.compact()
    table.create_checkpoint()  # `table` is at the compaction's version now
    return Compaction(
        at_ms=int(time.time() * 1000),
        files_before=files,
        files_removed=int(metrics["numFilesRemoved"]),
        files_added=int(metrics["numFilesAdded"]),
        seconds=round(time.perf_counter() - started, 3),
    )


def vacuum(table: DeltaTable) -> int:
    """Delete the files ``table`` removed longer ago than its retention; how many."""
    return len(table.vacuum(dry_run=False))


# A log file of one version: its commit, checksum or checkpoint (any form of checkpoint).
_LOG_FILE = re.compile(r"^(\d{20})\.(?:json|crc|checkpoint\..+)$")
# A single-file checkpoint: what delta-rs and Spark write for tables of our size.
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.parquet$")


def clean_log(table: DeltaTable, settle_s: float, s3: S3Config = DEFAULT_S3) -> int:
    """Delete ``table``'s commit, checksum and checkpoint files of the versions below its
    newest checkpoint written at least ``settle_s`` seconds ago.
    Every version from that checkpoint on stays readable: its checkpoint and every later
    commit are kept. The wait covers a reader that found an older checkpoint in
    ``_last_checkpoint`` just before this one was written and is still loading it.
    ``s3`` says how to reach a table on S3. Returns how many files."""
    fs, root = filesystem(table.table_uri, s3)
    log_dir = f"{root.rstrip('/')}/_delta_log"
    infos = [
        info
        for info in fs.get_file_info(pafs.FileSelector(log_dir))
        if info.type == pafs.FileType.File
    ]
    names = [info.base_name for info in infos]
    settled = time.time() - settle_s
    checkpoints = [
        int(m[1])
        for info in infos
        if (m := _CHECKPOINT.match(info.base_name)) and info.mtime.timestamp() <= settled
    ]
    if not checkpoints or "_last_checkpoint" not in names:
        return 0
    # Never past the checkpoint readers start from (`_last_checkpoint`), should it lag.
    with fs.open_input_stream(f"{log_dir}/_last_checkpoint") as f:
        last = int(json.loads(f.read())["version"])
    usable = [v for v in checkpoints if v <= last]
    if not usable:
        return 0
    cut = max(usable)
    doomed = [n for n in names if (m := _LOG_FILE.match(n)) and int(m[1]) < cut]
    for name in doomed:
        fs.delete_file(f"{log_dir}/{name}")
    return len(doomed)


@dataclass(frozen=True)
class Round:
    """What one round did to one table (:func:`maintain_table`)."""

    missing: bool = False  # the table does not exist (yet)
    compaction: Compaction | None = None
    vacuumed: int = 0
    log_cleaned: int = 0
    error: str = ""  # why the round failed ("": it did not)


def maintain_table(path: str, min_files: int, settle_s: float, s3: S3Config) -> Round:
    """One round over the table at ``path``: compact, vacuum, clean the log. Every
    failure is returned as text (this runs in another process: an exception of
    delta-rs's need not survive the trip back)."""
    try:
        table = DeltaTable(path, storage_options=delta_options(path, s3))
        result = compact(table, min_files)
        deleted = vacuum(table)
        cleaned = clean_log(table, settle_s, s3)
    except TableNotFoundError:
        return Round(missing=True)
    except Exception as err:  # any failure: reported, retried next round
        return Round(error=f"{type(err).__name__}: {err}")
    return Round(compaction=result, vacuumed=deleted, log_cleaned=cleaned)


RoundRunner = Callable[[str, int, float, S3Config], Round]
"""Runs one table's round: :func:`maintain_table` or a :class:`MaintenanceProcess`."""

LOWEST_PRIORITY = 19
"""The nice value of the maintenance process: it runs on what the engine leaves."""


class MaintenanceProcess:
    """Runs :func:`maintain_table` in a child process (:func:`serve`) at the lowest CPU
    priority: started at the first round, and again at the round after it died. A round
    it dies in returns the death as its error."""

    def __init__(self) -> None:
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The child's process id (None: none started yet)."""
        child = self._child
        return None if child is None else child.pid

    def __call__(self, path: str, min_files: int, settle_s: float, s3: S3Config) -> Round:
        with self._lock:
            if self._child is None or self._child.poll() is not None:
                self._child = subprocess.Popen(
                    [sys.executable, "-c", "from engine.maintenance import serve; serve()"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
            child = self._child
            assert child.stdin is not None and child.stdout is not None
            try:
                pickle.dump((path, min_files, settle_s, s3), child.stdin)
                child.stdin.flush()
                done: Round = pickle.load(child.stdout)
                return done
            except (EOFError, OSError, pickle.UnpicklingError):  # it died (killed, OOM)
                child.kill()  # should it live on, its pipes are broken
                return Round(error=f"the maintenance process died (exit {child.wait()})")

    def close(self) -> None:
        """Let the child end (it ends at the end of its input), or kill it after 10 s."""
        with self._lock:
            child, self._child = self._child, None
        if child is None:
            return
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def serve() -> None:
    """The maintenance process: rounds asked on stdin, their results on stdout
    (pickled), until stdin ends. Anything else written to stdout goes to stderr."""
    os.nice(LOWEST_PRIORITY)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while True:
        try:
            path, min_files, settle_s, s3 = pickle.load(requests)
        except EOFError:
            return
        pickle.dump(maintain_table(path, min_files, settle_s, s3), replies)
        replies.flush()


class TableMaintenance:
    """A daemon thread compacting and vacuuming ``paths`` (on S3: reached as ``s3``
    says) every ``every_s`` seconds (never when 0), and cleaning their logs. Each
    table's round runs through ``run_round`` (the engine's: a
    :class:`MaintenanceProcess`; by default in the rounds' thread).

    A table that fails to compact (a commit conflict, storage trouble) is logged with
    its path and the error and tried again next round; its last error is in ``health``.
    """

    def __init__(
        self,
        paths: Sequence[str],
        every_s: float,
        min_files: int,
        s3: S3Config = DEFAULT_S3,
        settle_s: float = 30.0,
        run_round: RoundRunner = maintain_table,
    ) -> None:
        self.paths = list(paths)
        self.s3 = s3  # how to reach tables on S3 (delta-rs's options, pyarrow's filesystem)
        self.every_s = every_s
        self.min_files = min_files
        self.settle_s = settle_s  # a checkpoint's age before the log below it goes
        self.last: dict[str, Compaction] = {}
        self.errors: dict[str, str] = {}
        self.vacuumed: dict[str, int] = {}  # files deleted, per table, since the start
        self.log_cleaned: dict[str, int] = {}  # log files deleted, per table, since the start
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._thread: threading.Thread | None = None
        self._run_round = run_round

    def start(self) -> None:
        """Start the rounds (a no-op when ``every_s`` is 0)."""
        if self.every_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="table-maintenance", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the compaction in progress, if any."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def pause(self) -> None:
        """Skip the rounds until `resume` (the engine's disk is full or read-only: a
        compaction would only fail, and leave half-written files)."""
        self._paused.set()

    def resume(self) -> None:
        """Run the rounds again."""
        self._paused.clear()

    def run_once(self) -> list[tuple[str, Compaction]]:
        """One round over every table (skipped while it does not exist yet); returns the
        compactions it made, by table path."""
        done = []
        for path in self.paths:
            outcome = self._run_round(path, self.min_files, self.settle_s, self.s3)
            if outcome.missing:
                continue
            if outcome.error:
                self._failed(path, outcome.error)
                continue
            self.errors.pop(path, None)
            self.log_cleaned[path] = self.log_cleaned.get(path, 0) + outcome.log_cleaned
            if outcome.log_cleaned:
                log.info("cleaned %s's log: %d files deleted", path, outcome.log_cleaned)
            if outcome.vacuumed:
                self.vacuumed[path] = self.vacuumed.get(path, 0) + outcome.vacuumed
                log.info("vacuumed %s: %d files past their retention deleted", path,
                         outcome.vacuumed)  # fmt: skip
            result = outcome.compaction
            if result is not None:
                self.last[path] = result
                done.append((path, result))
                log.info(
                    "compacted %s: %d files -> %d (%d removed, %d added) in %.2f s",
                    path,
                    result.files_before,
                    result.files_before - result.files_removed + result.files_added,
                    result.files_removed,
                    result.files_added,
                    result.seconds,
                )
        return done

    def _failed(self, path: str, error: str) -> None:
        self.errors[path] = error
        log.warning("maintenance of %s failed (retried next round): %s", path, error)

    def health(self) -> dict[str, Any]:
        """Each table's last compaction, files vacuumed, log files deleted and last error,
        for the health record."""
        return {
            "every_s": self.every_s,
            "compactions": [{"table": path, **asdict(c)} for path, c in self.last.items()],
            "vacuumed": dict(self.vacuumed),
            "log_cleaned": dict(self.log_cleaned),
            "errors": dict(self.errors),
        }

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            if not self._paused.is_set():
                self.run_once()
