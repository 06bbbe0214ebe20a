"""The streaming source of the engine query: new landing files, one row per file
(`engine/landing_offsets.py` says which files a batch reads, and why offsets name only
the backlog).

A Python data source: the driver lists the query's stream folders and plans a batch
(its offsets); the batch's one partition hands Spark one row per file: which component
of the rules and which stream it feeds, and the file's name. The stateful step of the
component reads and parses its files (`engine.landed_files.read_landed`), on its
executor: no reading passes through the driver, and none through Spark's rows and
shuffle. Committing an offset deletes the files it names, or moves them to the archive
folder, once every table the batch wrote holds their rows.

A batch admits the oldest new files up to `MAX_FILES_PER_BATCH` and `MAX_BYTES_PER_BATCH`
(about rows: a landed reading is ~75 bytes), so a backlog after a restart or a burst is
read in batches of bounded size.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson
import pyarrow as pa
from pyarrow import fs as pafs
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from engine.core.plan import StreamSchema
from engine.landing_offsets import batch_files, committed_files, initial_offset, next_offset
from ingest.landing import QUARANTINE as QUARANTINE_FOLDER
from ingest.landing import STREAM_FOLDER
from lookout.config import S3Config
from lookout.storage import filesystem

log = logging.getLogger("lookout.engine")

NAME = "lookout_landing"
SCHEMA = "component STRING, stream STRING, file STRING"
ARROW_SCHEMA = pa.schema(
    [("component", pa.string()), ("stream", pa.string()), ("file", pa.string())]
)
# New files a batch admits at most, and their size together: ingest lands a file per
# stream every `flush_ms` (200 ms), so a live batch holds a few; a backlog (after a
# restart, a burst, or the engine falling behind) is read 256 MB (≈ 3.4M readings of
# ~75 bytes) at a time. A batch has a fixed cost of half a second or more here: a
# 2M-reading backlog of the 15-minute tumble took 2.98-3.19 s in one batch of 256 MB,
# 3.43-3.61 s in batches of 128 MB; the Python workers together peaked at 1.8 GB and
# 1.5 GB.
MAX_FILES_PER_BATCH = 200
MAX_BYTES_PER_BATCH = 256 << 20
_S3_OPTIONS = ("endpoint", "region", "access_key", "secret_key")


def source_options(
    landing: str,
    archive: str,
    s3: S3Config,
    components: Mapping[str, Sequence[StreamSchema]],
    quarantine: str,
) -> dict[str, str]:
    """The options `LandingSource` takes: where the landing folder (and the archive) is,
    how to reach S3 (`secret_key` is among the option names Spark redacts), the source
    streams' names with the component each belongs to (`components`: name -> its
    streams), the component that also takes the quarantine folder's files (empty:
    none)."""
    streams = [
        {"name": stream.name, "component": name}
        for name, schemas in components.items()
        for stream in schemas
    ]
    options = {
        "path": landing,
        "archive": archive,
        "streams": orjson.dumps(streams).decode(),
        "quarantine": quarantine,
    }
    options.update({f"s3.{key}": getattr(s3, key) for key in _S3_OPTIONS})
    return options


@lru_cache(maxsize=8)
def folder_filesystem(location: str, s3: S3Config) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding the folder at `location` (the landing, its archive; local
    or S3) and the folder's path there without a trailing slash, made once per process:
    the driver's source lists with it, the stateful step reads with it."""
    fs, root = filesystem(location, s3)
    return fs, root.rstrip("/")


def landing_files(fs: pafs.FileSystem, root: str, folders: Sequence[str]) -> dict[str, int]:
    """Every landing file in `folders` (stream names) under `root`, as
    `stream=<name>/<file>` -> size, skipping hidden and temporary names (`.part-*.tmp`
    while ingest writes one)."""
    found: dict[str, int] = {}
    for folder in folders:
        selector = pafs.FileSelector(f"{root}/{STREAM_FOLDER}{folder}", allow_not_found=True)
        for info in fs.get_file_info(selector):
            name = info.base_name
            if info.type == pafs.FileType.File and not name.startswith((".", "_")):
                found[f"{STREAM_FOLDER}{folder}/{name}"] = info.size or 0
    return found


@dataclass(frozen=True)
class FilesPartition(InputPartition):
    """Landing files one executor task reads, in landing order."""

    files: tuple[str, ...]


class LandingSource(DataSource):
    """`spark.readStream.format("lookout_landing")`: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return LandingReader(self.options)


class LandingReader(DataSourceStreamReader):
    """Lists the landing folders for offsets, plans a batch (one partition naming its
    files), and removes committed ones."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.landing = options["path"]
        self.archive = options.get("archive", "")
        found = orjson.loads(options["streams"])
        self.component_of = {s["name"]: s["component"] for s in found}
        self.folders = [s["name"] for s in found]
        if options.get("quarantine"):
            self.component_of[QUARANTINE_FOLDER] = options["quarantine"]
            self.folders.append(QUARANTINE_FOLDER)
        self.s3 = S3Config(**{key: options.get(f"s3.{key}", "") for key in _S3_OPTIONS})

    @property
    def _landing(self) -> tuple[pafs.FileSystem, str]:
        return folder_filesystem(self.landing, self.s3)

    def initialOffset(self) -> dict:
        return initial_offset()

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        """The offset admitting the oldest new files (bounded in count and bytes)."""
        present = landing_files(*self._landing, self.folders)
        return dict(next_offset(start, present, MAX_FILES_PER_BATCH, present, MAX_BYTES_PER_BATCH))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        files = batch_files(start, end)
        return [FilesPartition(tuple(files))] if files else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """One row per file of the partition: its component, stream and name."""
        assert isinstance(partition, FilesPartition)
        rows: dict[str, list[str]] = {name: [] for name in ARROW_SCHEMA.names}
        for relative in partition.files:
            folder, _, name = relative.partition("/")
            stream = folder[len(STREAM_FOLDER) :]
            rows["component"].append(self.component_of[stream])
            rows["stream"].append(stream)
            rows["file"].append(name)
        yield pa.RecordBatch.from_pydict(rows, schema=ARROW_SCHEMA)

    def commit(self, end: dict) -> None:
        fs, root = self._landing
        archive = folder_filesystem(self.archive, self.s3) if self.archive else None
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


def _move(fs: pafs.FileSystem, source: str, target_fs: pafs.FileSystem, target: str) -> None:
    """Move a file, across filesystems (a local landing, an S3 archive) if need be."""
    if type(fs) is type(target_fs) and isinstance(fs, pafs.LocalFileSystem):
        fs.move(source, target)
        return
    pafs.copy_files(source, target, source_filesystem=fs, destination_filesystem=target_fs)
    fs.delete_file(source)
