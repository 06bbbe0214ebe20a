"""The readings a lakehouse has stored: each source stream's `readings_<stream>` Delta
table (the accepted readings, as the engine wrote them), read back as the arrival
tables the pipeline takes, with a time predicate (DataFusion skips the files whose
statistics lie outside it). A preview and a warm start evaluate rules over them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import TableNotFoundError

from engine.core.batch import HEARTBEAT
from engine.core.plan import Plan, StreamSchema
from engine.core.schema import arrival_type
from engine.tables import readings_table
from lookout.config import S3Config
from lookout.storage import DEFAULT_S3, delta_options


class HistoryError(Exception):
    """There is no stored history to read; the message says where it was looked for."""


@dataclass(frozen=True)
class StreamHistory:
    """The stored readings of one source stream the preview read."""

    stream: str
    readings: int
    watermark: int | None
    """Its stored watermark (epoch ms); None when it has no readings yet."""


@dataclass(frozen=True)
class History:
    """The stored readings a preview runs over: ``[start, end)`` and per stream what
    was read, with the readings as arrival tables sorted by event time."""

    start: int
    end: int
    streams: list[StreamHistory]
    tables: dict[str, pa.Table]


def stored_watermark(table: DeltaTable) -> int | None:
    """The highest `arrival_watermark` of a readings table (epoch ms), from its files'
    statistics when they all have them (no data read), else by a query."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if not actions.num_rows:
        return None
    column = "max.arrival_watermark"
    if column in actions.column_names and actions.column(column).null_count == 0:
        latest = pc.max(actions.column(column))
    else:
        latest = _query(table, "SELECT max(arrival_watermark) AS w FROM t").column("w")[0]
    value = latest.cast(pa.timestamp("us", tz="UTC")).value
    return None if value is None else value // 1000


def _query(table: DeltaTable, sql: str) -> pa.Table:
    reader = QueryBuilder().register("t", table).execute(sql)
    return pa.RecordBatchReader.from_stream(reader).read_all()


def read_history(plan: Plan, lakehouse: str, since_ms: int, s3: S3Config = DEFAULT_S3) -> History:
    """Each source stream of `plan`'s stored readings from `since_ms` before the latest
    stored watermark on, as arrival tables sorted by event time."""
    opened: dict[str, DeltaTable | None] = {}
    marks: dict[str, int | None] = {}
    for schema in plan.sources():
        table = opened[schema.name] = open_readings(lakehouse, schema.name, s3)
        marks[schema.name] = None if table is None else stored_watermark(table)
    known = [w for w in marks.values() if w is not None]
    if not known:
        names = ", ".join(readings_table(n) for n in marks)
        raise HistoryError(f"no stored readings in {lakehouse} ({names})")
    end = max(known)
    start = end - since_ms
    tables: dict[str, pa.Table] = {}
    streams = []
    for name, table in opened.items():
        schema = plan.streams[name]
        rows = stored_readings(schema, table, start) if table is not None else None
        if rows is not None and rows.num_rows:
            tables[name] = rows
        count = 0 if rows is None else rows.num_rows
        streams.append(StreamHistory(name, count, marks[name]))
    return History(start, end, streams, tables)


def stored_readings(
    schema: StreamSchema, table: DeltaTable, start: int, end: int | None = None
) -> pa.Table:
    """The stream's readings at or after `start` (and before `end`) in the columns the
    pipeline takes (timestamps as epoch ms), sorted by event time."""
    ts = schema.timestamp or "ts"
    columns = [c.name for c in schema.columns]
    select = ", ".join(f'"{c}"' for c in [*columns, "source", "epoch", "seq"])
    where = f"\"{ts}\" >= '{_literal(start)}'"
    if end is not None:
        where += f" AND \"{ts}\" < '{_literal(end)}'"
    rows = _query(table, f"SELECT {select} FROM t WHERE {where}")
    # DataFusion hands out view types and stored timestamps: the engine's types instead.
    types = [*(arrival_type(c.type) for c in schema.columns), pa.string(), pa.string(), pa.int64()]
    arrays = []
    for column, kind in zip(rows.columns, types, strict=True):
        if pa.types.is_timestamp(column.type):
            column = pc.divide(column.cast(pa.int64()), 1000)
        arrays.append(column.cast(kind))
    names = [*columns, "source", "epoch", "seq"]
    rows = pa.table([*arrays, pa.array(np.zeros(rows.num_rows, bool))], [*names, HEARTBEAT])
    return rows.sort_by([(ts, "ascending"), ("source", "ascending"), ("seq", "ascending")])


def heartbeat(schema: StreamSchema, at: int) -> pa.Table:
    """One heartbeat of `schema` at event time `at` (only its timestamp counts)."""
    ts = schema.timestamp or "ts"
    columns: dict[str, pa.Array] = {
        c.name: pa.array([at if c.name == ts else None], arrival_type(c.type))
        for c in schema.columns
    }
    columns["source"] = pa.array([""], pa.string())
    columns["epoch"] = pa.array([""], pa.string())
    columns["seq"] = pa.array([None], pa.int64())
    columns[HEARTBEAT] = pa.array([True])
    return pa.table(columns)


def open_readings(lakehouse: str, stream: str, s3: S3Config = DEFAULT_S3) -> DeltaTable | None:
    """The lakehouse's readings table of `stream` (None: there is none yet)."""
    location = f"{lakehouse.rstrip('/')}/{readings_table(stream)}"
    try:
        return DeltaTable(location, storage_options=delta_options(location, s3))
    except TableNotFoundError:
        return None


def _literal(ms: int) -> str:
    # A literal DataFusion compares with the stored timestamps, so it prunes files.
    return f"{np.datetime_as_string(np.datetime64(ms, 'ms'), unit='ms')}Z"


def event_time_slices(
    plan: Plan, tables: Mapping[str, pa.Table], slice_ms: int
) -> Iterator[dict[str, pa.Table]]:
    """The arrival `tables` (sorted by event time) cut into batches of `slice_ms` of event
    time, in order: what one batch of the pipeline holds at once stays bounded."""
    stamps = {
        name: np.asarray(t.column(plan.streams[name].timestamp or "ts").to_numpy())
        for name, t in tables.items()
        if t.num_rows
    }
    if not stamps:
        return
    edge = min(int(s[0]) for s in stamps.values())
    last = max(int(s[-1]) for s in stamps.values())
    while edge <= last:
        edge += slice_ms
        batch = {}
        for name, times in stamps.items():
            lo, hi = np.searchsorted(times, [edge - slice_ms, edge])
            if hi > lo:
                batch[name] = tables[name].slice(int(lo), int(hi - lo))
        yield batch
