"""Table maintenance: the lakehouse's small files compacted, and later deleted, while
the engine runs.

Every micro-batch appends a small file to each table it writes, about two a second per
table under load (some 170,000 a day), and a Delta table costs more to open and to
append to the more files it holds: with delta-rs on this machine
(`benchmarks/table_files.py`), 10,000 files took 12 ms to open and 8 ms per append,
80,000 files 80 and 44 ms, and the engine's writers open a table for every append.
Compaction (delta-rs ``optimize.compact``) rewrites the small files into a few; its
commit marks every file it adds or removes ``dataChange = false``, so a streaming reader
(the rules queries' Delta source) skips it and reads no row twice. A checkpoint right
after keeps the next opens from replaying the compaction's removes: the 80,000-file
table then opened in 25 ms and took appends in 2 ms.

Compaction commits concurrently with the queries' appends (it removes only files it
read, which an append never touches). The files it replaces stay on disk, and their
removes in the checkpoints, for the table's retention (``delta.deletedFileRetentionDuration``,
7 days by default): a streaming reader that far behind may still need them. After that
each round's ``VACUUM`` deletes them (delta-rs's lite vacuum: only files the log removed,
never one an append is writing).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

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


class TableMaintenance:
    """A daemon thread compacting and vacuuming ``paths`` (reached with delta-rs's
    ``options``) every ``every_s`` seconds (never when 0).

    A table that fails to compact (a commit conflict, storage trouble) is logged with
    its path and the error and tried again next round; its last error is in ``health``.
    """

    def __init__(
        self,
        paths: Sequence[str],
        every_s: float,
        min_files: int,
        options: dict[str, str] | None = None,
    ) -> None:
        self.paths = list(paths)
        self.options = options  # delta-rs storage options (S3), None for local tables
        self.every_s = every_s
        self.min_files = min_files
        self.last: dict[str, Compaction] = {}
        self.errors: dict[str, str] = {}
        self.vacuumed: dict[str, int] = {}  # files deleted, per table, since the start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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

    def run_once(self) -> list[tuple[str, Compaction]]:
        """One round over every table (each opened once, and skipped while it does not
        exist yet); returns the compactions it made, by table path."""
        done = []
        for path in self.paths:
            try:
                table = DeltaTable(path, storage_options=self.options)
            except TableNotFoundError:
                continue
            except Exception as err:  # any failure: reported, retried next round
                self._failed(path, err)
                continue
            try:
                result = compact(table, self.min_files)
                deleted = vacuum(table)
            except Exception as err:  # any failure: reported, retried next round
                self._failed(path, err)
                continue
            self.errors.pop(path, None)
            if deleted:
                self.vacuumed[path] = self.vacuumed.get(path, 0) + deleted
                log.info("vacuumed %s: %d files past their retention deleted", path, deleted)
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

    def _failed(self, path: str, err: Exception) -> None:
        self.errors[path] = f"{type(err).__name__}: {err}"
        log.warning("maintenance of %s failed (retried next round): %s", path, err)

    def health(self) -> dict[str, Any]:
        """Each table's last compaction, files vacuumed and last error, for the health
        record."""
        return {
            "every_s": self.every_s,
            "compactions": [{"table": path, **asdict(c)} for path, c in self.last.items()],
            "vacuumed": dict(self.vacuumed),
            "errors": dict(self.errors),
        }

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.run_once()
