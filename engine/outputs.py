"""The rows each lakehouse table gets from one batch of a pipeline (pure; Arrow only).

:func:`batch_tables` turns a :class:`~engine.core.pipeline.BatchResult` into one Arrow
table per Delta table, typed as that table is (timestamps in microseconds). Some are
filled as the batch is admitted (:func:`admitted_tables`): the accepted readings of each
source stream, late readings, conflicts, quarantined lines and readings (of new keys
beyond their stream's cap on live keys). The others are the stages'
(:func:`evaluated_tables`): alerts, the incidents the batch changed (each in its new
state), and each derived stream's rows with the (source, seq) tie order that stages
reading it use. Columns are built whole where the pipeline hands them over as columns
(readings, extents' results), so a batch of many thousand rows costs no Python object
per value there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engine import tables
from engine.alerts import AlertSpec, alert_keys, alert_rows, format_key, incident_record
from engine.core.keycap import CappedReading
from engine.core.pipeline import ARRIVAL_WATERMARK, BatchResult, Conflict, LateReading
from engine.core.plan import ColumnType, Plan, SinkKind, StreamSchema
from engine.core.runners import SEQ, SOURCE, SinkRows, emitted_outputs
from engine.landed_files import RECEIVED_MS, TOPIC


def ms_to_timestamp(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Epoch milliseconds (int64) as the tables' TIMESTAMP (microseconds, UTC)."""
    return pc.cast(pc.cast(values, pa.timestamp("ms", tz="UTC")), tables.TIMESTAMP)


def readings_rows(schema: StreamSchema, readings: pa.Table) -> pa.Table:
    """A source stream's accepted readings (the pipeline's arrival columns) as its
    readings table stores them."""
    target = tables.readings_schema(schema)
    stamps = {c.name for c in schema.columns if c.type == ColumnType.TIMESTAMP}
    columns = []
    for field in target:
        name = {"received_at": RECEIVED_MS}.get(field.name, field.name)
        if field.name == "topic":
            name = TOPIC
        column = readings.column(name)
        if name in stamps or name in (RECEIVED_MS, ARRIVAL_WATERMARK):
            column = ms_to_timestamp(column)
        columns.append(pc.cast(column, field.type))
    return pa.Table.from_arrays(columns, schema=target)


def _reading_json(schema: StreamSchema, row: Mapping[str, Any]) -> str:
    reading = {c.name: row.get(c.name) for c in schema.columns}
    reading.update(source=row.get("source"), seq=row.get("seq"))
    if row.get("epoch"):
        reading["epoch"] = row["epoch"]
    return orjson.dumps(reading).decode()


def late_rows(plan: Plan, late: Sequence[LateReading]) -> list[dict[str, Any]]:
    """`late_readings` rows (timestamps as datetimes)."""
    return [
        {
            "stream": item.stream,
            "source": item.row.get("source"),
            "epoch": item.row.get("epoch") or "",
            "seq": item.row.get("seq"),
            "ts": tables.to_timestamp(item.ts),
            "watermark": tables.to_timestamp(item.watermark),
            "late_by_ms": item.lateness_ms,
            "reading": _reading_json(plan.streams[item.stream], item.row),
            "topic": item.row.get(TOPIC),
            "received_at": tables.to_timestamp(item.row.get(RECEIVED_MS)),
        }
        for item in late
    ]


def conflict_rows(plan: Plan, conflicts: Sequence[Conflict]) -> list[dict[str, Any]]:
    """`conflicts` rows (timestamps as datetimes)."""
    return [
        {
            "stream": item.stream,
            "source": item.row.get("source"),
            "epoch": item.row.get("epoch") or "",
            "seq": item.row.get("seq"),
            "ts": tables.to_timestamp(item.ts),
            "reason": item.reason,
            "original_ts": tables.to_timestamp(item.original_ts),
            "reading": _reading_json(plan.streams[item.stream], item.row),
            "topic": item.row.get(TOPIC),
            "received_at": tables.to_timestamp(item.row.get(RECEIVED_MS)),
        }
        for item in conflicts
    ]


def quarantine_rows(lines: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`quarantine` rows from landed quarantine lines."""
    return [
        {
            "topic": line.get("topic"),
            "reason": line.get("reason"),
            "payload": line.get("payload"),
            "payload_b64": line.get("payload_b64"),
            "received_at": tables.to_timestamp(line.get("received_ms")),
            "payload_bytes": line.get("payload_bytes"),
            "payload_sha256": line.get("payload_sha256"),
        }
        for line in lines
    ]


def capped_rows(plan: Plan, capped: Sequence[CappedReading]) -> list[dict[str, Any]]:
    """`quarantine` rows of readings beyond their stream's cap on live keys: the reading
    as JSON (its stream's columns and identity), its size and SHA-256."""
    rows = []
    for item in capped:
        payload = _reading_json(plan.streams[item.stream], item.row)
        data = payload.encode()
        rows.append(
            {
                "topic": item.row.get(TOPIC),
                "reason": item.reason,
                "payload": payload,
                "payload_b64": None,
                "received_at": tables.to_timestamp(item.row.get(RECEIVED_MS)),
                "payload_bytes": len(data),
                "payload_sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    return rows


def stream_rows(schema: StreamSchema, emitted: Sequence[pa.Table]) -> pa.Table:
    """A derived stream's emitted rows as its table stores them: the SELECT list and
    the (source, seq) tie order that stages reading the stream use (timestamps from
    epoch ms), column by column."""
    target = tables.derived_schema(schema)
    parts = []
    for table in emitted:
        n = table.num_rows
        columns = []
        for field in tables.stream_schema(schema):
            if field.name in table.column_names:
                column = table.column(field.name)
                if pa.types.is_timestamp(field.type):
                    column = ms_to_timestamp(pc.cast(column, pa.int64()))
                columns.append(pc.cast(column, field.type))
            else:
                columns.append(pa.nulls(n, field.type))
        columns += [table.column(SOURCE), table.column(SEQ)]
        parts.append(pa.Table.from_arrays(columns, schema=target))
    return pa.concat_tables(parts) if parts else target.empty_table()


def batch_tables(
    plan: Plan,
    alerts: Mapping[str, AlertSpec],
    result: BatchResult,
    quarantine: Sequence[Mapping[str, Any]] = (),
) -> dict[str, pa.Table]:
    """Every table's new rows from one batch (a table with no new rows is left out)."""
    return {**admitted_tables(plan, result, quarantine), **evaluated_tables(plan, alerts, result)}


def admitted_tables(
    plan: Plan, result: BatchResult, quarantine: Sequence[Mapping[str, Any]] = ()
) -> dict[str, pa.Table]:
    """The new rows of the tables a batch fills as it is admitted (the source streams'
    readings, late readings, conflicts, quarantine): final once
    :meth:`~engine.core.pipeline.Pipeline.admit` returns."""
    out: dict[str, pa.Table] = {}
    for stream, readings in result.readings.items():
        if readings.num_rows:
            out[tables.readings_table(stream)] = readings_rows(plan.streams[stream], readings)
    for name, rows, schema in (
        ("late_readings", late_rows(plan, result.late), tables.LATE_READINGS),
        ("conflicts", conflict_rows(plan, result.conflicts), tables.CONFLICTS),
        (
            "quarantine",
            quarantine_rows(quarantine) + capped_rows(plan, result.capped),
            tables.QUARANTINE,
        ),
    ):
        if rows:
            out[name] = pa.Table.from_pylist(rows, schema=schema)
    return out


def evaluated_tables(
    plan: Plan, alerts: Mapping[str, AlertSpec], result: BatchResult
) -> dict[str, pa.Table]:
    """The new rows of the tables the stages fill (derived streams, alerts, incidents)."""
    out: dict[str, pa.Table] = {}
    kinds = {q.sink.name: q.sink.kind for q in plan.queries}
    stages = plan.stages()
    by_sink: dict[str, list[SinkRows]] = {}
    for emitted in result.outputs:
        by_sink.setdefault(emitted.sink, []).append(emitted)
    alert_records: list[dict[str, Any]] = []
    for sink, parts in by_sink.items():
        if kinds[sink] == SinkKind.STREAM:
            out[sink] = stream_rows(plan.streams[sink], [p.table for p in parts])
            continue
        spec = alerts.get(sink, AlertSpec(sink, "warning"))
        records = []
        for emitted in parts:
            key_names = stages[emitted.stage].key
            for key, o in emitted_outputs(emitted):
                records.append(
                    {
                        "ts": o.ts,
                        "key": format_key(key_names, key),
                        "row": orjson.dumps(o.row).decode(),
                        "source": o.source,
                        "seq": o.seq,
                    }
                )
        alert_records += alert_rows(spec, records)
    if alert_records:
        out["alerts"] = pa.Table.from_pylist(alert_records, schema=tables.ALERTS)
    if result.incidents:
        keys = alert_keys(plan)
        records = [
            incident_record(alerts.get(u.alert, AlertSpec(u.alert, "warning")), keys[u.alert], u)
            for u in result.incidents
        ]
        out["incidents"] = tables.ms_table(records, tables.INCIDENTS)
    return out
