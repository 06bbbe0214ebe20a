"""What `lookout replay` writes: one file (JSON lines, Parquet) or Delta table per
derived stream and alert, plus `late_readings`, `quarantine` and `incidents`.

JSON lines (the default) hold each row as an object with the SELECT list's columns in
order and timestamps as ISO-8601 UTC text with milliseconds; `late_readings` lines are
the reading (its stream's columns, `source`, `epoch` when it has one, `seq`) and its
`stream`; `quarantine` lines (written only when a cap on live keys set readings aside)
the same and the `reason`; `incidents` lines each incident in its final state. Parquet
and Delta hold the same rows with the stream's declared column types (timestamps as
TIMESTAMP, UTC, in microseconds: what the lakehouse's tables hold): `late_readings` and
`quarantine` have a column per column of any source stream (NULL where the reading's
stream has none), `incidents` the `incidents` table's engine columns.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine import tables
from engine.alerts import iso_utc
from engine.core.keycap import CappedReading
from engine.core.output_order import Runs, row_columns
from engine.core.plan import ColumnType, Plan, StreamSchema
from engine.core.replay import LateReading
from engine.core.runners import KEY, SEQ, TS, SinkRows
from engine.core.schema import ARROW_TYPES

FORMATS = ("jsonl", "delta", "parquet")

_ISO_SAFE_MS = 8_500_000_000_000
"""Within ±this many ms of the epoch (the years 1700 to 2239) Arrow's formatting gives
:func:`iso_utc`'s text exactly (its float seconds round back to the millisecond)."""

_TABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "false",
    "delta.columnMapping.mode": "none",
}


def iso_column(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Epoch-ms integers as :func:`iso_utc` text (NULL stays NULL), computed per column:
    the civil date by Hinnant's days-to-date algorithm, the digits by arithmetic."""
    values = pa.chunked_array([values]) if isinstance(values, pa.Array) else values
    numbers = values.cast(pa.int64())
    nulls = np.asarray(numbers.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    ms = np.asarray(pc.fill_null(numbers, 0).to_numpy(), dtype=np.int64)
    safe = np.abs(ms) <= _ISO_SAFE_MS
    text = _iso_text(np.where(safe, ms, 0))
    n = len(ms)
    offsets = np.arange(0, _ISO_WIDTH * (n + 1), _ISO_WIDTH, dtype=np.int32)
    column = pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(text.tobytes())
    )
    if safe.all() and not nulls.any():
        return column
    listed = column.to_pylist()
    for i in np.flatnonzero(~safe | nulls).tolist():
        listed[i] = None if nulls[i] else iso_utc(int(ms[i]))
    return pa.array(listed, pa.string())


_ISO_TEMPLATE = np.frombuffer(b"0000-00-00T00:00:00.000+00:00", dtype=np.uint8)
_ISO_WIDTH = len(_ISO_TEMPLATE)


def _iso_text(ms: np.ndarray) -> np.ndarray:
    """``YYYY-MM-DDTHH:MM:SS.mmm+00:00`` of each epoch ms (years 0 to 9999), as one row
    of bytes each."""
    days, rest = np.divmod(ms, 86_400_000)
    z = days + 719_468
    era = np.floor_divide(z, 146_097)
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + (month <= 2)
    hour, rest = np.divmod(rest, 3_600_000)
    minute, rest = np.divmod(rest, 60_000)
    second, milli = np.divmod(rest, 1000)
    out = np.tile(_ISO_TEMPLATE, (len(ms), 1))
    for value, start, width in (
        (year, 0, 4), (month, 5, 2), (day, 8, 2), (hour, 11, 2), (minute, 14, 2),
        (second, 17, 2), (milli, 20, 3),
    ):  # fmt: skip
        small = value.astype(np.int32)
        for k in range(width):
            out[:, start + width - 1 - k] = small // 10**k % 10 + 48
    return out


def _stamp_names(schema: StreamSchema | None) -> set[str]:
    if schema is None:
        return set()
    return {c.name for c in schema.columns if c.type == ColumnType.TIMESTAMP}


def _render(row: dict[str, Any], schema: StreamSchema | None) -> dict[str, Any]:
    """Timestamps as ISO-8601 UTC text, everything else as is."""
    stamps = _stamp_names(schema)
    if not stamps:
        return row
    return {k: iso_utc(v) if k in stamps and isinstance(v, int) else v for k, v in row.items()}


def json_lines(table: pa.Table, schema: StreamSchema | None) -> list[bytes]:
    """A sink's rows (without the engine's columns) as JSON lines, timestamps as text:
    the bytes of :func:`orjson.dumps` of each row, each line ending in a newline (a
    list of pieces to join, not one per row)."""
    return [_joined(chunk) for chunk in line_column(table, schema).chunks]


def line_column(table: pa.Table, schema: StreamSchema | None) -> pa.ChunkedArray:
    """Each row's JSON line (:func:`json_lines`) as text, newline included."""
    table = _iso_stamps(table, schema)
    pieces = []
    for start in range(0, table.num_rows, _PIECE_ROWS):
        part = table.slice(start, _PIECE_ROWS)
        lines = _columnar_lines(part)
        if lines is None:
            dumps, newline = orjson.dumps, orjson.OPT_APPEND_NEWLINE
            listed = [dumps(row, option=newline).decode() for row in part.to_pylist()]
            lines = pa.array(listed, pa.large_string())
        pieces.append(lines)
    return pa.chunked_array(pieces, pa.large_string())


LINE = "_line"
"""The column of a sink's rows rendered ahead (:func:`rendered`): each row's JSON line."""


def rendered(item: SinkRows, plan: Plan) -> SinkRows:
    """Emitted rows as their JSON lines (:data:`LINE`) beside the engine's columns that
    order them (:func:`~engine.core.replay.sink_tables`): what :func:`write_jsonl`
    writes, made where the rows were."""
    lines = line_column(row_columns(item.table), plan.streams.get(item.sink))
    engine = item.table.select([TS, SEQ, KEY])
    return SinkRows(item.stage, item.sink, engine.append_column(LINE, lines))


def sink_lines(table: pa.Table, schema: StreamSchema | None) -> list[bytes]:
    """A sink's ordered rows as JSON lines, rendered ahead (:data:`LINE`) or now."""
    if LINE in table.column_names:
        return [_joined(chunk) for chunk in table.column(LINE).chunks]
    return json_lines(table, schema)


_PIECE_ROWS = 100_000


def _iso_stamps(table: pa.Table, schema: StreamSchema | None) -> pa.Table:
    stamps = _stamp_names(schema)
    for i, name in enumerate(table.column_names):
        if name in stamps and pa.types.is_integer(table.schema.types[i]):
            table = table.set_column(i, name, iso_column(table.column(i)))
    return table


def _columnar_lines(table: pa.Table) -> pa.Array | None:
    """The rows as orjson writes them (objects in column order, ``\\n`` after each),
    built per column, one text per row; None when a column is of a type this does not
    write (the rows are then dumped one by one)."""
    if not table.num_rows:
        return pa.array([], pa.large_string())
    parts: list[Any] = []
    for i, name in enumerate(table.column_names):
        values = _json_values(table.column(i))
        if values is None:
            return None
        key = orjson.dumps(name).decode()
        parts += [("{" if i == 0 else ",") + key + ":", values]
    if not parts:
        return None
    parts.append("}\n")
    lines = pc.binary_join_element_wise(
        *[pa.scalar(p, pa.large_string()) if isinstance(p, str) else p.cast(pa.large_string())
          for p in parts],
        pa.scalar("", pa.large_string()),
    )  # fmt: skip
    return lines.combine_chunks() if isinstance(lines, pa.ChunkedArray) else lines


def _joined(lines: pa.Array) -> bytes:
    """The texts of a large-string array one after the other, as bytes."""
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[
        lines.offset : lines.offset + len(lines) + 1
    ]
    data = lines.buffers()[2]
    if data is None:
        return b""
    return memoryview(data)[int(offsets[0]) : int(offsets[-1])].tobytes()


_UNQUOTED = r'^[^"\\\x00-\x1f]*$'
"""Text orjson writes as it is between quotes (no quote, backslash or control char)."""
_PLAIN_FLOAT = r"^-?[0-9]+(\.[0-9]+)?$"
"""Arrow's text of a double that orjson writes the same (``.0`` added to a whole
number) when the double is 0 or of magnitude in [1e-4, 1e15); anything else
(exponents, NaN, infinities, other magnitudes) is written by orjson itself."""


def _json_values(column: pa.ChunkedArray) -> pa.Array | None:
    """Each value of ``column`` as orjson writes it (NULL as ``null``); None for a type
    not written per column."""
    values = column.combine_chunks()
    t = values.type
    if pa.types.is_integer(t):
        text = values.cast(pa.string())
    elif pa.types.is_boolean(t):
        text = pc.if_else(values, "true", "false")
    elif pa.types.is_null(t):
        return pa.array(["null"] * len(values), pa.string())
    elif pa.types.is_floating(t):
        numbers = values.cast(pa.float64())
        text = numbers.cast(pa.string())
        size = pc.abs(numbers)
        ordinary = pc.or_(
            pc.equal(numbers, 0.0),
            pc.and_(pc.greater_equal(size, 1e-4), pc.less(size, 1e15)),
        )
        plain = pc.fill_null(pc.and_(ordinary, pc.match_substring_regex(text, _PLAIN_FLOAT)), True)
        whole = pc.invert(pc.fill_null(pc.match_substring(text, "."), True))
        text = pc.if_else(whole, pc.binary_join_element_wise(text, ".0", ""), text)
        text = _by_orjson(text, numbers, plain)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        strings = values.cast(pa.string())
        plain = pc.fill_null(pc.match_substring_regex(strings, _UNQUOTED), True)
        text = pc.binary_join_element_wise('"', strings, '"', "")
        text = _by_orjson(text, strings, plain)
    else:
        return None
    return pc.fill_null(text, "null")


def _by_orjson(text: pa.Array, values: pa.Array, plain: pa.Array) -> pa.Array:
    """``text`` with the values where ``plain`` is false written by orjson."""
    odd = np.flatnonzero(~plain.to_numpy(zero_copy_only=False))
    if not len(odd):
        return text
    listed = text.to_pylist()
    for i in odd.tolist():
        listed[i] = orjson.dumps(values[i].as_py()).decode()
    return pa.array(listed, pa.string())


def late_line(late: LateReading, schema: StreamSchema) -> bytes:
    """A late reading's line: the reading (timestamps as text) and its stream."""
    row = {**_render(late.row, schema), "stream": late.stream}
    return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)


def quarantine_line(capped: CappedReading, schema: StreamSchema) -> bytes:
    """A reading set aside by a cap on live keys: the reading, its stream and why."""
    row = {**_render(capped.row, schema), "stream": capped.stream, "reason": capped.reason}
    return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)


def _iso_record(record: dict[str, Any]) -> dict[str, Any]:
    out = dict(record)
    for name in ("opened_at", "last_report_at", "resolved_at"):
        if out[name] is not None:
            out[name] = iso_utc(out[name])
    return out


# ---- tables ----------------------------------------------------------------------------


def _typed(table: pa.Table, schema: StreamSchema | None) -> pa.Table:
    """A sink's rows with its declared column types: timestamps from epoch ms to
    TIMESTAMP (UTC, microseconds), other columns cast where they fit."""
    declared = {c.name: c.type for c in schema.columns} if schema is not None else {}
    for i, name in enumerate(table.column_names):
        kind = declared.get(name)
        if kind is None:
            continue
        column = table.column(i)
        if kind == ColumnType.TIMESTAMP and pa.types.is_integer(column.type):
            column = pc.multiply(column.cast(pa.int64()), 1000).cast(tables.TIMESTAMP)
        else:
            try:
                column = column.cast(ARROW_TYPES[kind])
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue  # keep the computed type rather than lose values
        table = table.set_column(i, name, column)
    return table


def _empty(schema: StreamSchema | None) -> pa.Table:
    if schema is None:
        return pa.table({})
    return pa.schema([(c.name, ARROW_TYPES[c.type]) for c in schema.columns]).empty_table()


def late_table(plan: Plan, late: Sequence[LateReading | CappedReading]) -> pa.Table:
    """Late (or capped) readings of every source stream in one table: a column per
    column of any source stream (a name two streams declare with different types holds
    the value as JSON text), then ``source``, ``epoch``, ``seq`` and ``stream``."""
    types: dict[str, pa.DataType] = {}
    mixed: set[str] = set()
    for schema in plan.sources():
        for c in schema.columns:
            t = ARROW_TYPES[c.type]
            if types.setdefault(c.name, t) != t:
                mixed.add(c.name)
    for name in mixed:
        types[name] = pa.string()
    types.update({"source": pa.string(), "epoch": pa.string(), "seq": pa.int64()})
    columns = {}
    for name, t in types.items():
        values = [r.row.get(name) for r in late]
        if name in mixed:
            values = [None if v is None else orjson.dumps(v).decode() for v in values]
        columns[name] = tables.ms_array(values, t)
    columns["stream"] = pa.array([r.stream for r in late], pa.string())
    return pa.table(columns)


INCIDENT_COLUMNS = pa.schema(
    [tables.INCIDENTS.field(name) for name in ("incident_id", *tables.INCIDENT_STATE)]
)
"""The `incidents` table's engine columns (the operators' left out)."""


def incidents_table(records: Iterable[dict[str, Any]]) -> pa.Table:
    """Incident records (times in epoch ms) as the `incidents` table's engine columns."""
    return tables.ms_table(list(records), INCIDENT_COLUMNS)


class ReplayOutputError(ValueError):
    """An output's rows cannot be written as the format asks."""


class OutputFiles:
    """A replay's outputs in DIR, written as their rows become final (:meth:`write`):
    ``<name>.jsonl`` or ``.parquet`` files or ``<name>/`` Delta tables (``fmt``), one per
    sink, then (:meth:`close`) `late_readings`, `quarantine` (readings a cap on live keys
    set aside, when there are any) and `incidents`. Memory holds at most a row group per
    sink; a Delta table's rows wait in a Parquet file in DIR until its one commit."""

    def __init__(self, folder: Path, fmt: str, plan: Plan) -> None:
        self.folder, self.fmt, self.plan = folder, fmt, plan
        self.rows = 0
        """Output rows written."""
        self._lines: dict[str, BinaryIO] = {}
        self._tables: dict[str, _TableFile] = {}
        self._staging = folder / ".staging"
        self._made = not folder.exists()  # a replay that fails leaves no folder it made

    def write(self, runs: Runs) -> None:
        """Each sink's next rows, in output order."""
        for sink, ordered in runs.items():
            for table in ordered:
                self.rows += table.num_rows
                if self.fmt == "jsonl":
                    self._line_file(sink).write(
                        b"".join(sink_lines(table, self.plan.streams.get(sink)))
                    )
                else:
                    typed = _typed(table, self.plan.streams.get(sink))
                    self._table_file(sink).write(typed)

    def close(
        self,
        late: Sequence[LateReading],
        capped: Sequence[CappedReading],
        incidents: Sequence[dict[str, Any]],
    ) -> None:
        """Write what is known once the input has ended, and every sink without rows."""
        for query in self.plan.queries:
            name = query.sink.name
            if self.fmt == "jsonl":
                self._line_file(name)
            elif name not in self._tables:
                self._table_file(name).write(_empty(self.plan.streams.get(name)))
        if self.fmt == "jsonl":
            for handle in self._lines.values():
                handle.close()
            self.folder.mkdir(parents=True, exist_ok=True)
            self._write_lines(late, capped, incidents)
            return
        self._table_file("late_readings").write(late_table(self.plan, late))
        if capped:
            quarantined = late_table(self.plan, capped)
            self._table_file("quarantine").write(
                quarantined.append_column(
                    "reason", pa.array([r.reason for r in capped], pa.string())
                )
            )
        self._table_file("incidents").write(incidents_table(incidents))
        for name, table_file in self._tables.items():
            table_file.close(self._final(name))
        if self._staging.exists():
            self._staging.rmdir()

    def discard(self) -> None:
        """Remove what was written so far: an evaluation that failed, or that starts
        again."""
        for sink, handle in self._lines.items():
            handle.close()
            (self.folder / f"{sink}.jsonl").unlink(missing_ok=True)
        for table_file in self._tables.values():
            table_file.discard()
        self._lines, self._tables, self.rows = {}, {}, 0
        for made in (self._staging, self.folder if self._made else None):
            if made is not None and made.exists() and not any(made.iterdir()):
                made.rmdir()

    def _write_lines(
        self,
        late: Sequence[LateReading],
        capped: Sequence[CappedReading],
        incidents: Sequence[dict[str, Any]],
    ) -> None:
        streams = self.plan.streams
        files = {
            "late_readings": [late_line(r, streams[r.stream]) for r in late],
            "quarantine": [quarantine_line(r, streams[r.stream]) for r in capped],
            "incidents": [
                orjson.dumps(_iso_record(record), option=orjson.OPT_APPEND_NEWLINE)
                for record in incidents
            ],
        }
        for name, lines in files.items():  # late readings and quarantine only if any
            if lines or name == "incidents":
                (self.folder / f"{name}.jsonl").write_bytes(b"".join(lines))

    def _line_file(self, sink: str) -> BinaryIO:
        if sink not in self._lines:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._lines[sink] = open(self.folder / f"{sink}.jsonl", "wb")  # noqa: SIM115
        return self._lines[sink]

    def _table_file(self, sink: str) -> _TableFile:
        if sink not in self._tables:
            folder = self.folder if self.fmt == "parquet" else self._staging
            self._tables[sink] = _TableFile(folder / f"{sink}.parquet")
        return self._tables[sink]

    def _final(self, name: str) -> Path | None:
        """Where a Delta table of ``name`` goes (None: the Parquet file is the output)."""
        return None if self.fmt == "parquet" else self.folder / name


_ROW_GROUP = 262_144
"""Rows a table file's writer gathers before it writes them as a row group."""


class _TableFile:
    """A Parquet file written a row group at a time, its schema the first rows'; the
    rows of a Delta table until they are committed (:meth:`close`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []
        self._rows = 0

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.path, table.schema)
        self._pending.append(self._fitted(table))
        self._rows += table.num_rows
        if self._rows >= _ROW_GROUP:
            self._flush()

    def close(self, delta: Path | None) -> None:
        """The file complete; with ``delta``, made the one data file of a Delta table
        there (written anew), its rows in the order written."""
        self._flush()
        assert self._writer is not None
        self._writer.close()
        if delta is None:
            return
        from deltalake import Schema
        from deltalake.transaction import AddAction, create_table_with_add_actions

        # Committed as it is: delta-rs writing a stream of batches reorders the rows.
        delta.mkdir(parents=True, exist_ok=True)
        data = delta / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        os.replace(self.path, data)
        rows = pq.read_metadata(data).num_rows
        add = AddAction(
            data.name,
            data.stat().st_size,
            {},
            int(time.time() * 1000),
            True,
            json.dumps({"numRecords": rows}),
        )
        create_table_with_add_actions(
            str(delta),
            Schema.from_arrow(self._writer.schema),
            [add],
            mode="overwrite",
            configuration=_TABLE_PROPERTIES,
        )

    def discard(self) -> None:
        """Close the file and remove it."""
        if self._writer is not None:
            self._writer.close()
        self._pending = []
        self.path.unlink(missing_ok=True)

    def _fitted(self, table: pa.Table) -> pa.Table:
        """``table`` in the file's schema: the same columns, cast where they differ."""
        assert self._writer is not None
        schema = self._writer.schema
        if table.schema.equals(schema):
            return table
        try:
            return table.select(schema.names).cast(schema)
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise ReplayOutputError(
                f"{self.path.stem}: rows of another layout than the first rows "
                f"({table.schema.names} against {schema.names}: {err}); write the outputs "
                "as JSON lines (--format jsonl)"
            ) from None

    def _flush(self) -> None:
        if self._pending and self._writer is not None:
            self._writer.write_table(pa.concat_tables(self._pending))
            self._pending, self._rows = [], 0
