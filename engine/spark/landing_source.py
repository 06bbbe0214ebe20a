"""The landing query's streaming source: new landing files as (stream, file, line) rows,
with offsets that name only the backlog (`engine/landing_offsets.py` says why and how).

A simple Python data source: Spark calls every method in one Python process beside the
driver, which reads a batch's files when it plans the batch and hands their lines to the
JVM, so no Python worker task runs per batch (that task cost a landing batch 35-75 ms
here; the landing query collects every line on the driver anyway). Committing an offset
deletes the files it names, or moves them to the archive folder, once every table the
batch wrote holds their lines.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from functools import cached_property
from typing import Any

import pyarrow as pa
from pyarrow import fs as pafs
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from engine.landing_offsets import batch_files, committed_files, initial_offset, next_offset
from lookout.config import S3Config
from lookout.storage import filesystem

log = logging.getLogger("lookout.engine")

NAME = "lookout_landing"
SCHEMA = "stream STRING, file STRING, value BINARY"
ARROW_SCHEMA = pa.schema([("stream", pa.string()), ("file", pa.string()), ("value", pa.binary())])
STREAM_FOLDER = "stream="
# New files a batch admits at most (`next_offset`). At 17k readings/s ingest lands files
# of ≈ 4,300 readings (≈ 0.8 MB): 40 of them are ≈ 30 MB of lines, which the driver
# holds twice (Spark's rows, then the Arrow it collects); 215 were too many for 1 GB.
MAX_FILES_PER_BATCH = 40
_S3_OPTIONS = ("endpoint", "region", "access_key", "secret_key")


def source_options(landing: str, archive: str, s3: S3Config) -> dict[str, str]:
    """The options `LandingSource` takes: where the landing folder (and the archive) is,
    and how to reach S3 (`secret_key` is among the option names Spark redacts)."""
    options = {"path": landing, "archive": archive}
    options.update({f"s3.{key}": getattr(s3, key) for key in _S3_OPTIONS})
    return options


def landing_files(fs: pafs.FileSystem, root: str) -> list[str]:
    """Every landing file under `root`, as `stream=<name>/<file>`, skipping hidden and
    temporary names (`.part-*.tmp` while ingest writes one) as Spark's file source did."""
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    found = []
    for info in fs.get_file_info(selector):
        relative = info.path[len(root) :].lstrip("/")
        folder, _, name = relative.partition("/")
        if (
            info.type == pafs.FileType.File
            and folder.startswith(STREAM_FOLDER)
            and name
            and "/" not in name
            and not name.startswith((".", "_"))
        ):
            found.append(relative)
    return found


class LandingSource(DataSource):
    """`spark.readStream.format("lookout_landing")`: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def simpleStreamReader(self, schema: Any) -> SimpleDataSourceStreamReader:
        return LandingReader(self.options)


class LandingReader(SimpleDataSourceStreamReader):
    """Lists the landing folder for offsets, reads a batch's files, removes committed ones."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.landing = options["path"]
        self.archive = options.get("archive", "")
        self.s3 = S3Config(**{key: options.get(f"s3.{key}", "") for key in _S3_OPTIONS})

    @cached_property
    def _landing(self) -> tuple[pafs.FileSystem, str]:
        """The landing folder's filesystem and root, made once: the reader lives as long
        as the query, in one process, and every batch lists, reads and removes there."""
        return self._filesystem(self.landing)

    def _filesystem(self, location: str) -> tuple[pafs.FileSystem, str]:
        fs, root = filesystem(location, self.s3)
        return fs, root.rstrip("/")

    def initialOffset(self) -> dict:
        return initial_offset()

    def read(self, start: dict) -> tuple[Iterator[pa.RecordBatch], dict]:
        """The lines of the files new since `start` (the oldest `MAX_FILES_PER_BATCH` of
        them), and the offset that admits them."""
        fs, root = self._landing
        end = dict(next_offset(start, landing_files(fs, root), MAX_FILES_PER_BATCH))
        # Read now, while planning: Spark keeps these until the batch commits.
        return iter(list(self.readBetweenOffsets(start, end))), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[pa.RecordBatch]:
        """The lines of the batch from `start` to `end` (also a re-run after a restart:
        its files leave the folder only once it is committed)."""
        files = batch_files(start, end)  # at most MAX_FILES_PER_BATCH: one Arrow batch
        if files:
            yield _lines(*self._landing, files)

    def commit(self, end: dict) -> None:
        fs, root = self._landing
        archive = self._filesystem(self.archive) if self.archive else None
        for relative in committed_files(end):
            try:
                if archive is None:
                    fs.delete_file(f"{root}/{relative}")
                else:
                    target = f"{archive[1]}/{relative}"
                    archive[0].create_dir(target.rsplit("/", 1)[0], recursive=True)
                    _move(fs, f"{root}/{relative}", archive[0], target)
            except FileNotFoundError:
                pass  # removed by an earlier commit of an offset that named it too


def _lines(fs: pafs.FileSystem, root: str, files: list[str]) -> pa.RecordBatch:
    """Every non-blank line of `files` (under `root`) as (stream, file, value) rows."""
    streams, names, lines = [], [], []
    for relative in files:
        folder, _, name = relative.partition("/")
        with fs.open_input_stream(f"{root}/{relative}") as f:
            data = f.read()
        for line in data.split(b"\n"):
            if line.strip():
                streams.append(folder[len(STREAM_FOLDER) :])
                names.append(name)
                lines.append(line)
    return pa.RecordBatch.from_arrays(
        [pa.array(streams, pa.string()), pa.array(names, pa.string()), pa.array(lines)],
        schema=ARROW_SCHEMA,
    )


def _move(fs: pafs.FileSystem, source: str, target_fs: pafs.FileSystem, target: str) -> None:
    """Move a file, across filesystems (a local landing, an S3 archive) if need be."""
    if type(fs) is type(target_fs) and isinstance(fs, pafs.LocalFileSystem):
        fs.move(source, target)
        return
    pafs.copy_files(source, target, source_filesystem=fs, destination_filesystem=target_fs)
    fs.delete_file(source)
