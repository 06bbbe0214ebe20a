"""The Delta tables of the lakehouse: their schemas and exactly-once appends.

Schemas are Arrow schemas (timestamps as UTC microseconds, which Spark reads as
TIMESTAMP). A batch's rows are written where they are computed, as Parquet files in the
table's folder (`write_data_file`), and the driver adds them to the table in one
delta-rs commit per table (`commit_files`): one small commit costs milliseconds where a
Spark write job costs a good part of a second, and no row passes through the driver.

Every commit names its writer and batch (`app_id`, `version`: Delta's transaction
identifiers, the same ones Spark's `txnAppId`/`txnVersion` use). When a batch is run
again after a crash, a table that already holds that writer's version is skipped (and
the files written again deleted), so a restart never duplicates a row. Tables are
created without deletion vectors or column mapping, which the dashboard's reader
(delta-rs) does not support.

A table on S3 is reached with delta-rs's storage options (`lookout.storage.delta_options`,
from `[s3]`), passed as `options` (or `[s3]` itself, `s3`); None for a local path.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from engine.core.plan import ColumnType, Plan, StreamSchema
from engine.core.schema import ARROW_TYPES
from lookout.config import S3Config
from lookout.storage import DEFAULT_S3, delta_options, filesystem

TIMESTAMP = ARROW_TYPES[ColumnType.TIMESTAMP]

LATE_READINGS = pa.schema(
    [
        ("stream", pa.string()),
        ("source", pa.string()),
        ("epoch", pa.string()),
        ("seq", pa.int64()),
        ("ts", TIMESTAMP),
        ("watermark", TIMESTAMP),
        ("late_by_ms", pa.int64()),
        ("reading", pa.string()),
        ("topic", pa.string()),
        ("received_at", TIMESTAMP),
    ]
)

CONFLICTS = pa.schema(
    [
        ("stream", pa.string()),
        ("source", pa.string()),
        ("epoch", pa.string()),
        ("seq", pa.int64()),
        ("ts", TIMESTAMP),
        ("reason", pa.string()),
        ("original_ts", TIMESTAMP),
        ("reading", pa.string()),
        ("topic", pa.string()),
        ("received_at", TIMESTAMP),
    ]
)
"""Readings whose id (source, epoch, seq) came before with other content: the new one
as JSON, the first one's event time (its row is in the stream's readings table)."""

QUARANTINE = pa.schema(
    [
        ("topic", pa.string()),
        ("reason", pa.string()),
        ("payload", pa.string()),
        ("payload_b64", pa.string()),
        ("received_at", TIMESTAMP),
        # `payload`/`payload_b64` hold the first bytes only (ingest's
        # quarantine_payload_bytes): the whole payload's size and SHA-256.
        ("payload_bytes", pa.int64()),
        ("payload_sha256", pa.string()),
    ]
)

ALERTS = pa.schema(
    [
        ("alert_id", pa.string()),
        ("rule", pa.string()),
        ("severity", pa.string()),
        ("key", pa.string()),
        ("event_time", TIMESTAMP),
        ("detected_at", TIMESTAMP),
        ("message", pa.string()),
        ("payload", pa.string()),
    ]
)

INCIDENTS = pa.schema(
    [
        ("incident_id", pa.string()),
        ("rule", pa.string()),
        ("key", pa.string()),
        ("severity", pa.string()),
        ("message", pa.string()),
        ("opened_at", TIMESTAMP),
        ("last_report_at", TIMESTAMP),
        ("resolved_at", TIMESTAMP),
        ("reports", pa.int64()),
        # Written by operators (the engine inserts them empty and never updates them).
        ("acknowledged_by", pa.string()),
        ("acknowledged_at", TIMESTAMP),
        ("ack_note", pa.string()),
        ("silenced_by", pa.string()),
    ]
)
"""One row per incident in its latest state (`engine.core.incidents`), merged by id."""
INCIDENT_STATE = tuple(INCIDENTS.names[1:9])
"""The columns the engine keeps up to date (the others are the operators')."""

# The tables every engine writes, whatever the rules, with their schemas.
SHARED = {
    "late_readings": LATE_READINGS,
    "conflicts": CONFLICTS,
    "quarantine": QUARANTINE,
    "alerts": ALERTS,
    "incidents": INCIDENTS,
}
MERGED = {"incidents": ("incident_id", INCIDENT_STATE)}
"""Tables whose batches update rows by a key column (a merge) instead of appending: the
key, and the columns a batch's row sets in the row it updates."""

_TABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "false",
    "delta.columnMapping.mode": "none",
    # A commit reads every commit since the last checkpoint: with Delta's default of a
    # checkpoint per 100 commits, an append took 12-15 ms on average and 47 ms at p99
    # here (delta-rs, a table of 500-1000 files), with one per 10 commits 5-9 ms and 25.
    # The engine appends to a dozen tables every batch.
    "delta.checkpointInterval": "10",
    # A file compaction replaced stays on disk, and its remove in every checkpoint, for
    # this long (Delta's default: 7 days). The engine replaces some 7,000 files an hour
    # per busy table, and each append reads the checkpoint: with 7 days the appends
    # would slow for a week (+0.3 ms per 1,000 removes here, delta-rs) and the files on
    # disk reach millions. A reader of a version older than this may find its files gone.
    "delta.deletedFileRetentionDuration": "interval 1 hours",
}


def readings_table(stream: str) -> str:
    """Name of the table holding the accepted readings of a source stream."""
    return f"readings_{stream}"


def engine_tables(plan: Plan) -> list[str]:
    """Every table `lookout engine` appends to for `plan`: per source stream its
    readings, per derived stream its rows, and the shared ones."""
    sources = {s.name for s in plan.sources()}
    return [*SHARED, *(readings_table(n) if n in sources else n for n in plan.streams)]


def stream_schema(schema: StreamSchema) -> pa.Schema:
    """Arrow schema of a stream's rows: its declared columns."""
    return pa.schema([(c.name, ARROW_TYPES[c.type]) for c in schema.columns])


def derived_schema(schema: StreamSchema) -> pa.Schema:
    """Schema of a derived stream's table: its SELECT list plus the tie order (`source`,
    `seq`) its rows carry into the stages that read it."""
    return pa.schema(
        [*stream_schema(schema), pa.field("source", pa.string()), pa.field("seq", pa.int64())]
    )


def readings_schema(schema: StreamSchema) -> pa.Schema:
    """Schema of `readings_<stream>`: the declared columns plus provenance, and the
    stream's watermark once the reading had arrived (no on-time reading after it is
    older: the rules runtime may finalise every instant below it)."""
    provenance = [
        ("source", pa.string()),
        ("epoch", pa.string()),
        ("seq", pa.int64()),
        ("topic", pa.string()),
        ("received_at", TIMESTAMP),
        ("arrival_watermark", TIMESTAMP),
    ]
    return pa.schema([*stream_schema(schema), *(pa.field(n, t) for n, t in provenance)])


def ms_columns(rows: Sequence[Mapping[str, Any]], fields: Iterable[pa.Field]) -> list[pa.Array]:
    """The columns `fields` of dict `rows` whose timestamps are epoch ms (ints): built
    column by column, with no datetime made per value (a batch can hold a million rows).
    A missing key is NULL."""
    return [ms_array([row.get(f.name) for row in rows], f.type) for f in fields]


def ms_array(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    """`values` as an array of `type_`, timestamps given as epoch ms (ints)."""
    given = pa.timestamp("ms", tz="UTC") if pa.types.is_timestamp(type_) else type_
    return pa.array(values, given).cast(type_)


def ms_table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """Dict `rows` whose timestamps are epoch ms as a table of `schema` (:func:`ms_columns`)."""
    return pa.Table.from_arrays(ms_columns(rows, schema), schema=schema)


def to_timestamp(ms: int | None) -> datetime | None:
    """Epoch milliseconds as an aware UTC datetime (what Arrow's TIMESTAMP takes)."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


class TableSchemaError(ValueError):
    """A table in the lakehouse lacks a column this version of Lookout writes."""


def ensure_table(path: str, schema: pa.Schema, options: dict[str, str] | None = None) -> None:
    """Create an empty Delta table at `path` if none is there (readers may start first);
    refuse one that lacks a column of `schema` (an older Lookout's, or other rules'),
    which would otherwise fail later, mid-stream, with a schema mismatch."""
    try:
        table = DeltaTable(path, storage_options=options)
    except TableNotFoundError:
        write_deltalake(
            path,
            schema.empty_table(),
            mode="append",
            configuration=_TABLE_PROPERTIES,
            storage_options=options,
        )
        return
    have = {field.name for field in table.schema().fields}
    missing = [name for name in schema.names if name not in have]
    if missing:
        raise TableSchemaError(
            f"the Delta table at {path} has no column {', '.join(map(repr, missing))}: it was "
            "written by an older Lookout or for other rules; move it (or the whole lakehouse) "
            "aside and start again"
        )
    # A table an earlier Lookout made: its checkpoints as often as a new table's, and its
    # removes kept an hour unless someone chose how long.
    interval, retention = "delta.checkpointInterval", "delta.deletedFileRetentionDuration"
    properties = table.metadata().configuration
    changed = {}
    if properties.get(interval) != _TABLE_PROPERTIES[interval]:
        changed[interval] = _TABLE_PROPERTIES[interval]
    if retention not in properties:
        changed[retention] = _TABLE_PROPERTIES[retention]
    if changed:
        table.alter.set_table_properties(changed)


def append_once(
    path: str,
    schema: pa.Schema,
    rows: Sequence[Mapping[str, Any]] | pa.Table,
    writer_id: str,
    batch_id: int,
    s3: S3Config = DEFAULT_S3,
) -> bool:
    """Append `rows` (dicts, or a table already in `schema`) to the table at `path`
    exactly once for (writer_id, batch_id): :func:`write_data_file`, then
    :func:`commit_files`, as the engine's batches do. `s3` says how to reach a table on
    S3. Returns False when the table already holds this writer's batch (a re-run)."""
    if len(rows) == 0:
        return False
    data = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows), schema=schema)
    file = write_data_file(path.rstrip("/").rsplit("/", 1)[-1], path, data, s3)
    return commit_files(path, schema, [file], writer_id, batch_id, s3)


@dataclass(frozen=True)
class DataFile:
    """A Parquet file written into a table's folder, not yet part of the table: what a
    commit needs to add it (`path` relative to the table)."""

    table: str
    path: str
    size: int
    records: int
    modified_ms: int
    stats: str


def data_file_name(batch_id: int | None = None) -> str:
    """A new data file's name; with the batch that writes it, which lets
    :func:`remove_orphans` tell a batch that never committed."""
    if batch_id is None:
        return f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    return f"part-b{batch_id}-{uuid.uuid4()}-c000.snappy.parquet"


_BATCH_FILE = re.compile(r"^part-b(\d+)-[0-9a-f-]{36}-c000\.snappy\.parquet$")


def write_data_file(
    table: str,
    location: str,
    data: pa.Table,
    s3: S3Config = DEFAULT_S3,
    batch_id: int | None = None,
) -> DataFile:
    """Write `data` as a new Parquet file in the folder of the table `table` at
    `location` (named after `batch_id` when given: :func:`data_file_name`). It is not
    part of the table until :func:`commit_files` adds it. A write that fails (a full
    disk) leaves no half file: pyarrow deletes it."""
    name = data_file_name(batch_id)
    fs, root = filesystem(location, s3)
    target = f"{root.rstrip('/')}/{name}"
    pq.write_table(data, target, filesystem=fs, compression="snappy")
    size = fs.get_file_info(target).size or 0
    return DataFile(table, name, size, data.num_rows, int(time.time() * 1000), file_stats(data))


def remove_orphans(
    location: str,
    writer_ids: Sequence[str],
    s3: S3Config = DEFAULT_S3,
    inherits: str | None = None,
) -> list[str]:
    """Delete the data files in the table's folder at `location` that batches of the
    writers `writer_ids` wrote and never committed: named after a batch
    (:func:`data_file_name`) later than the last one the table holds of some writer
    (the least of their last batches), and not in the table. Only while those writers
    run no batch (a batch in flight would lose its files). The table and its folder are
    read once for all the writers; `inherits` as for :func:`commit_files`. Returns the
    names deleted; a file that cannot be deleted stays."""
    try:
        table = DeltaTable(location, storage_options=delta_options(location, s3))
    except TableNotFoundError:
        return []
    versions = [committed_version(table, writer, inherits) for writer in writer_ids]
    known = [version for version in versions if version is not None]
    done = min(known) if known and len(known) == len(versions) else None
    live = {uri.rsplit("/", 1)[-1] for uri in table.file_uris()}
    fs, root = filesystem(location, s3)
    deleted = []
    for info in fs.get_file_info(pafs.FileSelector(root.rstrip("/"), allow_not_found=True)):
        found = _BATCH_FILE.match(info.base_name)
        if found is None or info.base_name in live:
            continue
        if done is not None and int(found[1]) <= done:
            continue  # a committed batch's: compacted away, or kept for a re-run to skip
        try:
            fs.delete_file(info.path)
        except OSError:
            continue
        deleted.append(info.base_name)
    return deleted


def file_stats(data: pa.Table) -> str:
    """Delta's per-file statistics (record count, nulls, and the bounds of numbers and
    timestamps, as delta-rs writes them) for a reader's data skipping."""
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for field in data.schema:
        column = data.column(field.name)
        nulls[field.name] = column.null_count
        numeric = pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
        if column.null_count == len(column) or not (numeric or pa.types.is_timestamp(field.type)):
            continue
        bounds = pc.min_max(column)
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
        if pa.types.is_floating(field.type) and not (math.isfinite(lo) and math.isfinite(hi)):
            continue
        if pa.types.is_timestamp(field.type):
            lo = lo.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            # Stats hold milliseconds; round the upper bound up so it still bounds.
            top = hi.astimezone(UTC)
            if top.microsecond % 1000:
                top += timedelta(microseconds=1000 - top.microsecond % 1000)
            hi = top.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        low[field.name], high[field.name] = lo, hi
    stats = {"numRecords": data.num_rows, "minValues": low, "maxValues": high, "nullCount": nulls}
    return orjson.dumps(stats).decode()


class OpenTables:
    """Delta tables kept open between a writer's commits. Opening a table reads its log
    from the last checkpoint on (up to a hundred commits); an open table only reads the
    commits made since its last use (`update_incremental`, which sees other writers'
    too). That halves a small commit's time.

    One user at a time per table. A table whose use failed, or unused for
    `max_idle_s` (the log cleanup deletes commits only below a checkpoint at least
    30 s old, so an open table never misses one it has not read), is opened afresh."""

    def __init__(self, s3: S3Config = DEFAULT_S3, max_idle_s: float = 10.0) -> None:
        self.s3 = s3
        self.max_idle_s = max_idle_s
        self._open: dict[str, tuple[DeltaTable, float]] = {}

    @contextlib.contextmanager
    def use(self, location: str) -> Iterator[DeltaTable]:
        """The table at `location`, up to date."""
        table, used = self._open.pop(location, (None, 0.0))
        if table is not None and time.monotonic() - used < self.max_idle_s:
            table.update_incremental()
        else:
            table = DeltaTable(location, storage_options=delta_options(location, self.s3))
        yield table
        self._open[location] = (table, time.monotonic())


def committed_version(table: DeltaTable, writer_id: str, inherits: str | None = None) -> int | None:
    """The last batch the writer `writer_id` committed to `table` (its transaction
    version), or, while it has committed none, that of the writer `inherits` names: a
    writer that took over another's batches (the engine's per-partition writers from the
    single writer that committed every partition's files before them)."""
    done = table.transaction_version(writer_id)
    if done is None and inherits is not None:
        return table.transaction_version(inherits)
    return done


def commit_files(
    location: str,
    schema: pa.Schema,
    files: Sequence[DataFile],
    writer_id: str,
    batch_id: int,
    s3: S3Config = DEFAULT_S3,
    opened: OpenTables | None = None,
    inherits: str | None = None,
) -> bool:
    """Add `files` (written by :func:`write_data_file`) to the table at `location` in
    one commit, exactly once for (writer_id, batch_id): when the table already holds that
    writer's batch (a re-run after a crash), the files are deleted instead. Returns
    whether it committed. `opened`: the writer's open tables (else the table is opened
    for this commit). `inherits`: a writer id whose version stands for `writer_id`'s
    until that has committed (:func:`committed_version`)."""
    if not files:
        return False
    with (opened or OpenTables(s3)).use(location) as table:
        done = committed_version(table, writer_id, inherits)
        if done is not None and done >= batch_id:
            fs, root = filesystem(location, s3)
            for file in files:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(f"{root.rstrip('/')}/{file.path}")
            return False
        actions: list[AddAction | RemoveAction] = [
            AddAction(f.path, f.size, {}, f.modified_ms, True, f.stats) for f in files
        ]
        table.create_write_transaction(
            actions,
            "append",
            schema,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id=writer_id, version=batch_id)]
            ),
        )
        return True


MERGE_ATTEMPTS = 5
"""How often a merge is tried when another writer (compaction, an operator) committed
first: the batch fails only after that."""


def merge_files(
    location: str,
    schema: pa.Schema,
    files: Sequence[DataFile],
    key: str,
    update: Sequence[str],
    writer_id: str,
    batch_id: int,
    s3: S3Config = DEFAULT_S3,
    opened: OpenTables | None = None,
    inherits: str | None = None,
) -> bool:
    """Merge the rows of `files` (written by :func:`write_data_file`, each row a whole
    state, at most one per `key`) into the table at `location` by `key`, exactly once
    for (writer_id, batch_id): new keys are inserted, known ones get the columns
    `update` (the table's other columns are left as they are). The
    merge and the writer's version are one commit, so a batch run again after a crash
    finds it done; the files are deleted either way (they are never part of the table).
    Returns whether it merged. `opened` and `inherits`: as for :func:`commit_files`."""
    if not files:
        return False
    fs, root = filesystem(location, s3)
    paths = [f"{root.rstrip('/')}/{file.path}" for file in files]
    try:
        source = pa.concat_tables(pq.read_table(p, filesystem=fs, schema=schema) for p in paths)
        for attempt in range(MERGE_ATTEMPTS):
            try:
                with (opened or OpenTables(s3)).use(location) as table:
                    done = committed_version(table, writer_id, inherits)
                    if done is not None and done >= batch_id:
                        return False
                    (
                        table.merge(
                            source,
                            f"t.{key} = s.{key}",
                            source_alias="s",
                            target_alias="t",
                            commit_properties=CommitProperties(
                                app_transactions=[Transaction(app_id=writer_id, version=batch_id)]
                            ),
                        )
                        .when_matched_update({c: f"s.{c}" for c in update})
                        .when_not_matched_insert({c: f"s.{c}" for c in schema.names})
                        .execute()
                    )
                    return True
            except CommitFailedError:
                # Another writer committed first: a fresh table at the next attempt.
                if attempt == MERGE_ATTEMPTS - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))
        return False
    finally:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(path)
