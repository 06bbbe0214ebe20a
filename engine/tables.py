"""The Delta tables of the lakehouse: their schemas and exactly-once appends.

Schemas are Arrow schemas (timestamps as UTC microseconds, which Spark reads as
TIMESTAMP). Writes go through delta-rs from the driver: a micro-batch's rows are few
and already in Python, and one small commit costs milliseconds where a Spark write job
costs a good part of a second.

Every append names its writer and batch (`app_id`, `version`: Delta's transaction
identifiers, the same ones Spark's `txnAppId`/`txnVersion` use). When a batch is run
again after a crash, a table that already holds that writer's version is skipped, so a
restart never duplicates a row. Tables are created without deletion vectors or column
mapping, which the dashboard's reader does not support (DESIGN §7).

A table on S3 is reached with delta-rs's storage options (`lookout.storage.delta_options`,
from `[s3]`), passed as `options` (or `[s3]` itself, `s3`); None for a local path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from engine.core.plan import ColumnType, Plan, StreamSchema
from lookout.config import S3Config
from lookout.storage import DEFAULT_S3, delta_options, put_whole

TIMESTAMP = pa.timestamp("us", tz="UTC")

ARROW_TYPES: dict[ColumnType, pa.DataType] = {
    ColumnType.INT: pa.int32(),
    ColumnType.BIGINT: pa.int64(),
    ColumnType.DOUBLE: pa.float64(),
    ColumnType.STRING: pa.string(),
    ColumnType.BOOLEAN: pa.bool_(),
    ColumnType.TIMESTAMP: TIMESTAMP,
}

LATE_READINGS = pa.schema(
    [
        ("stream", pa.string()),
        ("source", pa.string()),
        ("seq", pa.int64()),
        ("ts", TIMESTAMP),
        ("watermark", TIMESTAMP),
        ("late_by_ms", pa.int64()),
        ("reading", pa.string()),
        ("topic", pa.string()),
        ("received_at", TIMESTAMP),
    ]
)

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

HEARTBEATS = pa.schema(
    [
        ("stream", pa.string()),
        ("source", pa.string()),
        ("ts", TIMESTAMP),
        ("received_at", TIMESTAMP),
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

# Internal: each stream's highest event time after each landing batch (restart state).
STREAM_PROGRESS = pa.schema(
    [("stream", pa.string()), ("batch_id", pa.int64()), ("max_event_ms", pa.int64())]
)

# The tables the landing writes for every stream together, with their schemas.
LANDING_SHARED = {
    "late_readings": LATE_READINGS,
    "quarantine": QUARANTINE,
    "_stream_progress": STREAM_PROGRESS,
}

_TABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "false",
    "delta.columnMapping.mode": "none",
}


def readings_table(stream: str) -> str:
    """Name of the table holding the accepted readings of a source stream."""
    return f"readings_{stream}"


def heartbeats_table(stream: str) -> str:
    """Name of the table holding a stream's heartbeats: one table per stream, so a
    stream's rules query wakes for its own heartbeats only (Delta's streaming source
    reads every commit of its table; it cannot skip another stream's rows unread)."""
    return f"heartbeats_{stream}"


def engine_tables(plan: Plan) -> list[str]:
    """Every table `lookout engine` appends to for `plan`: per source stream its
    readings and heartbeats, per derived stream its rows and heartbeats (only those a
    query feeds exist), and the shared ones."""
    sources = {s.name for s in plan.sources()}
    names = [*LANDING_SHARED, "alerts"]
    for name in plan.streams:
        names += [readings_table(name) if name in sources else name, heartbeats_table(name)]
    return names


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


def append_once(
    path: str,
    schema: pa.Schema,
    rows: Sequence[Mapping[str, Any]] | pa.Table,
    writer_id: str,
    batch_id: int,
    s3: S3Config = DEFAULT_S3,
) -> bool:
    """Append `rows` (dicts, or a table already in `schema`) to the table at `path`
    exactly once for (writer_id, batch_id), and write the new version's checksum.
    `s3` says how to reach a table on S3.

    Returns False when the table already holds this writer's batch (a re-run).
    """
    if len(rows) == 0:
        return False
    options = delta_options(path, s3)
    table = DeltaTable(path, storage_options=options)
    done = table.transaction_version(writer_id)
    if done is not None and done >= batch_id:
        return False
    data = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows), schema=schema)
    write_deltalake(
        table,
        data,
        mode="append",
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id=writer_id, version=batch_id)]
        ),
    )
    write_checksum(path, table, s3)
    return True


def write_checksum(path: str, table: DeltaTable, s3: S3Config = DEFAULT_S3) -> None:
    """Write the version checksum (`_delta_log/<version>.crc`) of `table` (the one at
    `path`) at its loaded version: its protocol, metadata, file count and size.

    delta-rs writes none, and without one Spark's Delta source runs a Spark job over the
    log to find the protocol and metadata of each new version it reads (Delta's
    `readProtocolAndMetadataFromChecksum`): a rules query's `latestOffset` took 286 ms a
    batch with two commits a second, 23 ms with checksums (benchmarks/delta_source.py).
    After a commit, delta-rs's `table` holds the new version's state, also when another
    writer (a compaction) committed in between: it replays the commits it lost to."""
    protocol = table.protocol()
    metadata = table.metadata()
    adds = pa.table(table.get_add_actions(flatten=True))
    checksum = {
        "tableSizeBytes": pc.sum(adds.column("size_bytes")).as_py() or 0,
        "numFiles": adds.num_rows,
        "numMetadata": 1,
        "numProtocol": 1,
        "protocol": {
            "minReaderVersion": protocol.min_reader_version,
            "minWriterVersion": protocol.min_writer_version,
            **({"readerFeatures": protocol.reader_features} if protocol.reader_features else {}),
            **({"writerFeatures": protocol.writer_features} if protocol.writer_features else {}),
        },
        "metadata": {
            "id": metadata.id,
            "name": metadata.name,
            "description": metadata.description,
            "format": {"provider": "parquet", "options": {}},
            "schemaString": table.schema().to_json(),
            "partitionColumns": list(metadata.partition_columns),
            "configuration": dict(metadata.configuration),
            "createdTime": metadata.created_time,
        },
    }
    location = f"{path.rstrip('/')}/_delta_log/{table.version():020d}.crc"
    put_whole(location, orjson.dumps(checksum), s3)
