"""Which landing files each engine batch reads, as offsets that stay the size of the
backlog (pure; the Spark source in `engine/spark/landing_source.py` does the I/O).

Spark's own file source remembers every file it ever read: its checkpoint record grows
without bound and is rewritten every tenth batch (8 MB and 0.2-0.3 s a rewrite after
60,000 files here, some 430,000 files a day at five a second), and its driver keeps a
week of names in memory. Lookout needs no such memory, because a committed batch's files
leave the landing folder: a file still in the folder is either new or named by an offset
whose batch is not yet committed.

So an offset is the sorted list of the landing files admitted so far that were still in
the folder when it was made. The next offset keeps the files of the previous one that
are still there and adds the files the folder holds that it does not name, the oldest
first and at most so many files and bytes (a backlog, after a stop or a burst, is read
in batches the engine can hold); a batch reads the files its end offset names and its
start does not; committing an offset removes every file it names. After a restart
Spark hands back the last offsets from its log, and the same rules give the same
batches: a re-run batch reads exactly its files (they leave only once its commit is
done), and a file its start still names, whether or not it has been removed yet, is
never taken for new.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

FILES = "files"


def initial_offset() -> dict[str, Any]:
    """The offset before any batch: no file admitted."""
    return {FILES: []}


def next_offset(
    start: Mapping[str, Any],
    present: Iterable[str],
    max_new: int,
    sizes: Mapping[str, int] | None = None,
    max_bytes: int | None = None,
) -> Mapping[str, Any]:
    """The offset after `start` given the files now in the folder: `start`'s files still
    present plus the oldest present files it does not name, at most `max_new` of them
    and, with `sizes`, at most `max_bytes` together (always at least one); `start`
    itself when there is no new file (Spark then plans no batch).

    Oldest is by file name (`part-<landing time>-...`, whatever the stream folder), so
    each stream's files are admitted in the order they landed, which is the order the
    landing judges them in."""
    admitted = set(start[FILES])
    folder = set(present)
    new = sorted(folder - admitted, key=_landing_order)[:max_new]
    if sizes is not None and max_bytes is not None:
        total = 0
        for count, path in enumerate(new):
            total += sizes.get(path, 0)
            if count and total > max_bytes:
                new = new[:count]
                break
    if not new:
        return start
    return {FILES: sorted((folder & admitted).union(new))}


def _landing_order(path: str) -> tuple[str, str]:
    """A landing file's place in landing order: its name, then its stream folder."""
    folder, _, name = path.rpartition("/")
    return name, folder


def batch_files(start: Mapping[str, Any], end: Mapping[str, Any]) -> list[str]:
    """The files a batch from `start` to `end` reads, in name order."""
    return sorted(set(end[FILES]) - set(start[FILES]))


def committed_files(end: Mapping[str, Any]) -> list[str]:
    """The files that may leave the folder once the batch ending at `end` is committed."""
    return list(end[FILES])
