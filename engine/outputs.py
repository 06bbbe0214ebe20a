"""The rows each lakehouse table gets from one batch of a pipeline (pure; Arrow only).

:func:`batch_tables` turns a :class:`~engine.core.pipeline.BatchResult` into one Arrow
table per Delta table, typed as that table is (timestamps in microseconds): the
accepted readings of each source stream, late readings, conflicts, quarantined lines,
alerts, and each derived stream's rows with the (source, seq) tie order that stages
reading it use. Columns are built whole where the pipeline hands them over as columns
(readings, extents' results), so a batch of many thousand rows costs no Python object
per value there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engine import tables
from engine.alerts import AlertSpec, alert_rows, format_key
from engine.core.evaluator import Output, OutputColumns, output_rows
from engine.core.pipeline import ARRIVAL_WATERMARK, BatchResult, Conflict, LateReading
from engine.core.plan import ColumnType, Plan, SinkKind, StreamSchema
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
        }
        for line in lines
    ]


def stream_rows(schema: StreamSchema, outputs: Sequence[Output | OutputColumns]) -> pa.Table:
    """A derived stream's outputs as its table stores them: the SELECT list and the
    (source, seq) tie order that stages reading the stream use. Built column by column
    (a batch can hold a million windows); timestamps are epoch ms in the rows."""
    target = tables.derived_schema(schema)
    fields = list(tables.stream_schema(schema))
    parts: list[pa.Table] = []
    rows: list[Output] = []
    for output in [*outputs, None]:
        if isinstance(output, Output):
            rows.append(output)
            continue
        if rows:  # a run of single outputs, ended
            columns = tables.ms_columns([o.row for o in rows], fields)
            sources = pa.array([o.source for o in rows], pa.string())
            seqs = pa.array([o.seq for o in rows], pa.int64())
            parts.append(pa.Table.from_arrays([*columns, sources, seqs], schema=target))
            rows = []
        if output is not None:
            count = len(output.ts)
            columns = [
                tables.ms_array(output.columns.get(f.name, [None] * count), f.type) for f in fields
            ]
            sources = pa.repeat(pa.scalar(output.source, pa.string()), count)
            seqs = pa.array(np.arange(output.seq, output.seq + count, dtype=np.int64))
            parts.append(pa.Table.from_arrays([*columns, sources, seqs], schema=target))
    return pa.concat_tables(parts) if parts else target.empty_table()


def batch_tables(
    plan: Plan,
    alerts: Mapping[str, AlertSpec],
    result: BatchResult,
    quarantine: Sequence[Mapping[str, Any]] = (),
) -> dict[str, pa.Table]:
    """Every table's new rows from one batch (a table with no new rows is left out)."""
    out: dict[str, pa.Table] = {}
    for stream, readings in result.readings.items():
        if readings.num_rows:
            out[tables.readings_table(stream)] = readings_rows(plan.streams[stream], readings)
    for name, rows, schema in (
        ("late_readings", late_rows(plan, result.late), tables.LATE_READINGS),
        ("conflicts", conflict_rows(plan, result.conflicts), tables.CONFLICTS),
        ("quarantine", quarantine_rows(quarantine), tables.QUARANTINE),
    ):
        if rows:
            out[name] = pa.Table.from_pylist(rows, schema=schema)
    kinds = {q.sink.name: q.sink.kind for q in plan.queries}
    stages = plan.stages()
    by_sink: dict[str, list[tuple[Any, Output | OutputColumns]]] = {}
    for emitted in result.outputs:
        by_sink.setdefault(emitted.output.sink, []).append((emitted, emitted.output))
    alert_records: list[dict[str, Any]] = []
    for sink, emitted_outputs in by_sink.items():
        if kinds[sink] == SinkKind.STREAM:
            out[sink] = stream_rows(plan.streams[sink], [o for _, o in emitted_outputs])
            continue
        spec = alerts.get(sink, AlertSpec(sink, "warning"))
        records = []
        for emitted, output in emitted_outputs:
            key = format_key(stages[emitted.stage].key, tuple(emitted.key))
            for o in output_rows([output]):
                records.append(
                    {
                        "ts": o.ts,
                        "key": key,
                        "row": orjson.dumps(o.row).decode(),
                        "source": o.source,
                        "seq": o.seq,
                    }
                )
        alert_records += alert_rows(spec, records)
    if alert_records:
        out["alerts"] = pa.Table.from_pylist(alert_records, schema=tables.ALERTS)
    return out
