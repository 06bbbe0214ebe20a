"""The readings `lookout replay` evaluates: JSON lines, Delta tables or Parquet, read as
the arrival tables :meth:`engine.core.pipeline.Pipeline.process` takes.

**JSON lines** are read in chunks of several megabytes. A chunk of one stream's readings
is parsed by Arrow's JSON reader against the stream's types; when it holds anything
that reader would take differently from ingest's validation (a value to normalise, a
NULL, a blank line, text that is not UTF-8, a value out of range) the chunk is read line
by line through ``ingest.validate.normalize_reading`` instead, which normalises it or
names the file and line of the reading it rejects. Either way a reading means what it
means live.

**Tables** (a Delta table's folder, a Parquet file or a folder of them) are read with
the stream's columns and the identity columns they have (``source``, ``epoch``,
``seq``); a column whose type cannot hold the declared type's values is refused with
its name, its type and what would do. ``--from``/``--until`` go to the reader as a
filter on the event-time column (Parquet row groups and Delta files outside it are not
read). Arrival order (:func:`arrival_order`) comes from an ``arrival`` column, else
the ``arrival_watermark`` the engine writes into ``readings_<stream>``, else the stored
order (Parquet) or event time (Delta).

Every reading without a ``seq`` gets its arrival index over the whole input, as
:func:`engine.core.replay.run` numbers them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.json as pj

from engine.core.batch import HEARTBEAT
from engine.core.plan import ColumnType, Plan, StreamSchema
from engine.core.replay import arrival_table
from engine.core.schema import arrival_type
from ingest.validate import MAX_STRING_CHARS, NON_NEGATIVE, normalize_reading, shown

CHUNK_BYTES = 8 << 20
"""How much of a JSON-lines file is parsed at once."""
BATCH_READINGS = 250_000
"""Readings per pipeline batch (by snapshot-equivalence any batching gives the same
rows; larger batches cost the engine less per reading, since a key's window runs once
a batch whatever its rows, and hold more memory: `benchmarks/README.md` has both)."""


def batch_readings(caps: Mapping[str, int]) -> int:
    """Readings per batch under caps on live keys: at most half the smallest cap, so
    that a batch alone does not bring a stream near its cap (a batch that could take a
    rule to its cap is admitted reading by reading, in Python)."""
    return max(1, min([BATCH_READINGS, *(cap // 2 for cap in caps.values())]))


IDENTITY = ("source", "epoch", "seq")
ARRIVAL = "arrival"
"""A table column giving arrival order explicitly (integers, e.g. line numbers)."""
ARRIVAL_WATERMARK = "arrival_watermark"
RECEIVED_AT = "received_at"


class ReplayInputError(Exception):
    """An input that cannot be used: a recorded reading located as file:line, or a table
    whose columns do not fit its stream."""


@dataclass(frozen=True)
class TimeRange:
    """``--from`` (inclusive) and ``--until`` (exclusive), epoch ms; None: open."""

    start: int | None = None
    end: int | None = None

    def __bool__(self) -> bool:
        return self.start is not None or self.end is not None

    def keep(self, ts: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray | None:
        """Which of the event times ``ts`` (epoch ms) lie in the range (None: all)."""
        masks = []
        if self.start is not None:
            masks.append(pc.greater_equal(ts, self.start))
        if self.end is not None:
            masks.append(pc.less(ts, self.end))
        if not masks:
            return None
        return masks[0] if len(masks) == 1 else pc.and_(masks[0], masks[1])


EVERYTHING = TimeRange()
"""No time range: every reading."""


@dataclass(frozen=True)
class Input:
    """One `--input`: its path, its form and the source streams its readings may belong
    to (JSON lines without `STREAM=`: each line to the stream whose columns it carries)."""

    spec: str
    path: Path
    kind: str  # "jsonl" | "delta" | "parquet"
    streams: tuple[StreamSchema, ...]


def input_kind(path: Path) -> str:
    """``delta`` (a folder with ``_delta_log``), ``parquet`` (a ``.parquet`` file or
    another folder) or ``jsonl`` (any other file)."""
    if path.is_dir():
        return "delta" if (path / "_delta_log").is_dir() else "parquet"
    return "parquet" if path.suffix.lower() == ".parquet" else "jsonl"


def parse_inputs(specs: Sequence[str], plan: Plan) -> list[Input]:
    """`STREAM=PATH` (every reading is one of STREAM) or `PATH`: JSON lines go line by
    line to the source stream whose columns the line carries, a table to the one
    source stream whose columns it has."""
    sources = {s.name: s for s in plan.sources()}
    inputs = []
    for spec in specs:
        stream, sep, name = spec.partition("=")
        if not sep or not stream.isidentifier():
            stream, name = "", spec
        path = Path(name)
        if not path.exists():
            raise ReplayInputError(f"--input {spec!r}: {path} does not exist")
        kind = input_kind(path)
        if stream and stream not in sources:
            known = ", ".join(sorted(sources))
            raise ReplayInputError(
                f"--input {spec!r}: no source stream {stream!r} (known: {known})"
            )
        schemas = (sources[stream],) if stream else tuple(sources.values())
        inputs.append(Input(spec, path, kind, schemas))
    return inputs


# ---- progress ------------------------------------------------------------------------


@dataclass
class Progress:
    """Readings evaluated so far, printed at most once per ``every_s`` as
    ``replay: N readings, R/s[, P% ETA T]``; the share done comes from the readers
    (bytes of a file, rows of a table) when the input's size is known."""

    every_s: float = 1.0
    out: Any = None
    started: float = field(default_factory=time.monotonic)
    readings: int = 0
    done: float | None = None
    """Share of the input the readings evaluated so far make up (None: unknown)."""
    _last: float = field(default_factory=time.monotonic)
    lines: int = 0

    def restart(self) -> None:
        """Count from nothing again (the input is read once more)."""
        self.started = self._last = time.monotonic()
        self.readings = 0
        self.done = None

    def fed(self, readings: int) -> None:
        """``readings`` more were evaluated."""
        self.readings += readings
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-9)
        rate = self.readings / elapsed
        text = f"replay: {self.readings:,} readings, {rate:,.0f}/s"
        if self.done is not None and self.done > 0:
            left = elapsed * (1 - self.done) / self.done
            text += f", {100 * self.done:.0f}%, ETA {_duration(left)}"
        print(text, file=self.out, flush=True)
        self.lines += 1


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return (
        f"{minutes} min {rest:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"
    )


# ---- reading -------------------------------------------------------------------------


@dataclass
class _Piece:
    """Readings of one stream in arrival order, and the share of the whole input read
    once they are (None: unknown)."""

    stream: str
    table: pa.Table
    done: float | None


class Readings:
    """Every input's readings, in order, as pipeline batches (:meth:`batches`)."""

    def __init__(
        self,
        inputs: Sequence[Input],
        window: TimeRange = EVERYTHING,
        progress: Progress | None = None,
        batch: int = BATCH_READINGS,
    ) -> None:
        self.inputs = inputs
        self.window = window
        self.progress = progress
        self.batch = batch
        self.arrived = 0
        self.notes: list[str] = []
        """What the readers say about their inputs (a table's arrival order)."""
        self._tables = [_read_table(i, window) for i in inputs if i.kind != "jsonl"]
        self.notes = [t.note for t in self._tables]
        self._sizes = {id(i): (i.path.stat().st_size if i.kind == "jsonl" else 1) for i in inputs}

    def batches(self) -> Iterator[dict[str, pa.Table]]:
        """The readings as ``{stream: arrival table}`` of about ``batch`` readings each,
        every stream's in arrival order, ``seq`` filled in with the arrival index."""
        pending: dict[str, list[pa.Table]] = {}
        count = 0
        for piece in self._pieces():
            table = piece.table
            while table.num_rows:
                take = table.slice(0, self.batch - count)
                table = table.slice(take.num_rows)
                pending.setdefault(piece.stream, []).append(take)
                count += take.num_rows
                if count >= self.batch:
                    yield self._batch(pending, piece.done)
                    pending, count = {}, 0
        if count:
            yield self._batch(pending, 1.0)

    def _batch(self, pending: dict[str, list[pa.Table]], done: float | None) -> dict[str, pa.Table]:
        if self.progress is not None:
            self.progress.done = done
        return {s: pa.concat_tables(t) for s, t in pending.items()}

    def _pieces(self) -> Iterator[_Piece]:
        total = sum(self._sizes.values())
        before = 0
        tables = iter(self._tables)
        for inp in self.inputs:
            size = self._sizes[id(inp)]
            if inp.kind == "jsonl":
                for stream, table, offset in _read_json_lines(inp, self.window, self):
                    yield _Piece(stream, table, (before + offset) / max(total, 1))
            else:
                # A table's share of the input counts its rows as they go.
                yield from self._numbered_rows(next(tables), before, size, total)
            before += size

    def _numbered_rows(
        self, source: _TableInput, before: int, size: int, total: int
    ) -> Iterator[_Piece]:
        rows, done = max(source.rows, 1), 0
        for table in source.pieces():
            for start in range(0, table.num_rows, self.batch):
                part = self.number(table.slice(start, self.batch))
                done += part.num_rows
                share = min(done / rows, 1.0)
                yield _Piece(source.stream.name, part, (before + size * share) / max(total, 1))

    def number(self, table: pa.Table) -> pa.Table:
        """``table``'s readings with their arrival index where ``seq`` is NULL."""
        n = table.num_rows
        seq = table.column("seq")
        if seq.null_count:
            index = pa.array(np.arange(self.arrived, self.arrived + n, dtype=np.int64))
            seq = pc.if_else(pc.is_null(seq), index, seq)
            table = table.set_column(table.column_names.index("seq"), "seq", seq)
        self.arrived += n
        return table


# ---- JSON lines ----------------------------------------------------------------------


def _read_json_lines(
    inp: Input, window: TimeRange, readings: Readings
) -> Iterator[tuple[str, pa.Table, int]]:
    """(stream, arrival table, bytes read so far) per chunk of the file."""
    line = 1
    with open(inp.path, "rb") as handle:
        while data := handle.read(CHUNK_BYTES):
            if not data.endswith(b"\n"):
                data += handle.readline()
            lines = data.count(b"\n") + (not data.endswith(b"\n"))
            offset = handle.tell()
            fast = _fast_chunk(data, inp.streams[0], lines) if len(inp.streams) == 1 else None
            if fast is not None:
                kept = _in_window(fast, inp.streams[0], window)
                if kept.num_rows:
                    yield inp.streams[0].name, readings.number(kept), offset
            else:
                for stream, table in _chunk_by_line(inp, data, line, window, readings):
                    yield stream, table, offset
            line += lines


def _in_window(table: pa.Table, schema: StreamSchema, window: TimeRange) -> pa.Table:
    mask = window.keep(table.column(schema.timestamp or "ts"))
    return table if mask is None else table.filter(mask)


def _json_schema(schema: StreamSchema) -> pa.Schema:
    fields = [pa.field(c.name, arrival_type(c.type)) for c in schema.columns]
    fields += [pa.field("source", pa.string()), pa.field("epoch", pa.string())]
    return pa.schema([*fields, pa.field("seq", pa.int64())])


def _fast_chunk(data: bytes, schema: StreamSchema, lines: int) -> pa.Table | None:
    """``data`` (whole lines of one stream's readings) parsed by Arrow, or None when a
    reading needs ingest's per-reading validation (to be normalised, or rejected with
    its reason): Arrow takes a JSON ``null`` for an absent field, reads a blank line as
    nothing, and its types are stricter (no ``3.0`` for an INT, no ISO text for a
    timestamp), so any of those sends the chunk line by line. Integers in a STRING
    column become their digits here, as ingest makes them."""
    if b"null" in data or not (data.isascii() or _utf8(data)):
        return None
    # STRING columns are left to Arrow's inference: ingest also takes an integer there
    # (an id published as a number), as its digits.
    texts = [c.name for c in schema.columns if c.type == ColumnType.STRING]
    explicit = pa.schema([f for f in _json_schema(schema) if f.name not in texts])
    try:
        table = pj.read_json(
            pa.BufferReader(data),
            read_options=pj.ReadOptions(block_size=max(len(data) // 2, 1 << 20)),
            parse_options=pj.ParseOptions(
                explicit_schema=explicit, unexpected_field_behavior="infer"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != lines:
        return None
    for name in texts:
        if name not in table.column_names:
            return None  # absent from every line: the per-line path says where
        kind = table.schema.field(name).type
        if pa.types.is_integer(kind):
            at = table.column_names.index(name)
            table = table.set_column(at, name, pc.cast(table.column(name), pa.string()))
        elif not pa.types.is_string(kind):
            return None  # a float, a boolean, a time: as ingest words it, line by line
    if _violation(table, schema) is not None:
        return None
    return _as_arrivals(table, schema)


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _violation(table: pa.Table, schema: StreamSchema) -> tuple[int, str] | None:
    """The first reading (index) of arrival table columns that ingest's validation
    rejects, with the reason in its words; None when every one passes."""
    found: list[tuple[int, str]] = []

    def first(mask: Any, reason: Any) -> None:
        if pc.any(mask).as_py():
            index = pc.index(mask, True).as_py()
            found.append((index, reason(index)))

    for column in schema.columns:
        values = table.column(column.name)
        name = column.name
        if values.null_count:
            first(pc.is_null(values), lambda i, name=name: f"field '{name}' is null")
            continue
        # Each check looks for the row only once a whole-column test fails.
        if column.type == ColumnType.DOUBLE and not pc.all(pc.is_finite(values)).as_py():
            first(
                pc.invert(pc.is_finite(values)),
                lambda i, name=name: f"field '{name}' is not a finite number",
            )
        if column.name in NON_NEGATIVE and column.type in _NUMBERS and _least(values) < 0:
            first(
                pc.less(values, 0),
                lambda i, name=name, v=values: (
                    f"field '{name}' is negative ({shown(v[i].as_py())})"
                ),
            )
    for name in [c.name for c in schema.columns if c.type == ColumnType.STRING] + [
        "source",
        "epoch",
    ]:
        text = table.column(name)
        # No value has more characters than bytes.
        if (pc.max(pc.binary_length(text)).as_py() or 0) <= MAX_STRING_CHARS:
            continue
        lengths = pc.utf8_length(text)
        first(
            pc.fill_null(pc.greater(lengths, MAX_STRING_CHARS), False),
            lambda i, name=name, n=lengths: (
                f"field '{name}' is {n[i].as_py()} characters; the limit is {MAX_STRING_CHARS}"
            ),
        )
    return min(found) if found else None


_NUMBERS = (ColumnType.INT, ColumnType.BIGINT, ColumnType.DOUBLE)


def _as_arrivals(table: pa.Table, schema: StreamSchema) -> pa.Table:
    """Columns in the engine's types (timestamps epoch ms) plus ``source``, ``epoch``
    (NULL: ``""``), ``seq`` (NULL: numbered later) and ``heartbeat`` (false)."""
    columns = {c.name: table.column(c.name) for c in schema.columns}
    columns["source"] = pc.fill_null(table.column("source"), "")
    columns["epoch"] = pc.fill_null(table.column("epoch"), "")
    columns["seq"] = table.column("seq")
    columns[HEARTBEAT] = pa.array(np.zeros(table.num_rows, dtype=bool))
    return pa.table(columns)


def _chunk_by_line(
    inp: Input, data: bytes, first_line: int, window: TimeRange, readings: Readings
) -> Iterator[tuple[str, pa.Table]]:
    """A chunk through ingest's validation one line at a time (JSON lines without
    ``STREAM=`` route each line by its columns); its readings per stream, numbered in
    the chunk's arrival order."""
    by_stream: dict[str, list[dict[str, Any]]] = {}
    order: list[StreamSchema] = []
    for number, line in enumerate(data.splitlines(), start=first_line):
        if not line.strip():
            continue
        try:
            item = orjson.loads(line)
            schema = stream_of(inp.streams, item)
            reading = normalize_reading(schema, item, require_identity=False)
        except (ValueError, orjson.JSONDecodeError) as err:
            raise ReplayInputError(f"{inp.path}:{number}: {err}") from None
        ts = reading[schema.timestamp or "ts"]
        if (window.start is not None and ts < window.start) or (
            window.end is not None and ts >= window.end
        ):
            continue
        if reading.get("seq") is None:
            reading["seq"] = readings.arrived
        readings.arrived += 1
        if schema.name not in by_stream:
            order.append(schema)
        by_stream.setdefault(schema.name, []).append(reading)
    for schema in order:
        yield schema.name, arrival_table(schema, by_stream[schema.name])


def stream_of(schemas: tuple[StreamSchema, ...], data: Any) -> StreamSchema:
    if len(schemas) == 1:
        return schemas[0]
    fits = [s for s in schemas if isinstance(data, dict) and all(c.name in data for c in s.columns)]
    if len(fits) != 1:
        which = (
            "no source stream"
            if not fits
            else "several streams: " + ", ".join(s.name for s in fits)
        )
        raise ValueError(f"the line carries the columns of {which} (give STREAM=FILE)")
    return fits[0]


# ---- tables --------------------------------------------------------------------------


def arrival_order(names: Iterable[str], kind: str) -> tuple[list[str], str]:
    """The columns a table's rows are sorted by to put them in arrival order, and the
    rule in words: an ``arrival`` column; else ``arrival_watermark`` (a
    ``readings_<stream>`` table the engine wrote: then ``received_at`` and the
    readings' ids); else none for Parquet (the stored order: files by path, rows as
    stored) and event time then ids for Delta (which keeps no row order)."""
    have = set(names)
    ids = [c for c in IDENTITY if c in have]
    if ARRIVAL in have:
        return [ARRIVAL], f"by its '{ARRIVAL}' column"
    if ARRIVAL_WATERMARK in have:
        by = [ARRIVAL_WATERMARK, *([RECEIVED_AT] if RECEIVED_AT in have else []), *ids]
        return by, "by " + ", ".join(by) + " (a readings table the engine wrote)"
    if kind == "parquet":
        return [], "in stored order (files by path, rows as stored)"
    return [], "by event time (a Delta table keeps no row order)"


def _dataset(inp: Input) -> ds.Dataset:
    if inp.kind == "delta":
        from deltalake import DeltaTable

        return DeltaTable(str(inp.path)).to_pyarrow_dataset()
    if inp.path.is_dir():
        files = sorted(
            str(p)
            for p in inp.path.rglob("*.parquet")
            if not any(part.startswith(("_", ".")) for part in p.relative_to(inp.path).parts)
        )
        if not files:
            raise ReplayInputError(
                f"--input {inp.spec!r}: {inp.path} holds no Parquet file and no Delta table"
            )
        return ds.dataset(
            files, format="parquet", partitioning="hive", partition_base_dir=str(inp.path)
        )
    return ds.dataset(str(inp.path), format="parquet")


def _table_stream(inp: Input, names: set[str]) -> StreamSchema:
    if len(inp.streams) == 1:
        return inp.streams[0]
    fits = [s for s in inp.streams if all(c.name in names for c in s.columns)]
    if len(fits) != 1:
        which = "no source stream" if not fits else "several: " + ", ".join(s.name for s in fits)
        raise ReplayInputError(
            f"--input {inp.spec!r}: the table has the columns of {which} (give STREAM=PATH)"
        )
    return fits[0]


_WANTS = {
    ColumnType.INT: "an integer column",
    ColumnType.BIGINT: "an integer column",
    ColumnType.DOUBLE: "a floating-point or integer column",
    ColumnType.BOOLEAN: "a boolean column",
    ColumnType.STRING: "a string column",
    ColumnType.TIMESTAMP: "a timestamp column with a time zone, or integers (epoch ms)",
}


def _fits(column_type: ColumnType, t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    if column_type in (ColumnType.INT, ColumnType.BIGINT):
        return pa.types.is_integer(t)
    if column_type == ColumnType.DOUBLE:
        return pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_decimal(t)
    if column_type == ColumnType.BOOLEAN:
        return pa.types.is_boolean(t)
    if column_type == ColumnType.STRING:
        return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
    # TIMESTAMP: an instant (a time zone) or epoch ms
    return (pa.types.is_timestamp(t) and t.tz is not None) or pa.types.is_integer(t)


def _check_columns(inp: Input, stream: StreamSchema, schema: pa.Schema) -> None:
    """Refuse a table missing a column of the stream or holding one of another type."""
    have = {f.name: f.type for f in schema}
    for column in stream.columns:
        if column.name not in have:
            raise ReplayInputError(
                f"--input {inp.spec!r}: the table has no column '{column.name}' (stream "
                f"{stream.name} declares {column.name} {column.type}); its columns: "
                + ", ".join(schema.names)
            )
        t = have[column.name]
        if not _fits(column.type, t):
            naive = pa.types.is_timestamp(t) and t.tz is None
            raise ReplayInputError(
                f"--input {inp.spec!r}: column '{column.name}' is {t}"
                + (" (no time zone)" if naive else "")
                + f"; stream {stream.name} declares it {column.type}: it needs "
                + _WANTS[column.type]
            )
    wants = {
        "source": (ColumnType.STRING, "a string column"),
        "epoch": (ColumnType.STRING, "a string or integer column"),
        "seq": (ColumnType.BIGINT, "an integer column"),
    }
    for name, (kind, words) in wants.items():
        t = have.get(name)
        if t is None:
            continue
        fits = _fits(kind, t) or (name == "epoch" and pa.types.is_integer(t))
        if not fits:
            raise ReplayInputError(
                f"--input {inp.spec!r}: column '{name}' is {t}; a reading's {name} needs {words}"
            )
    for name in (ARRIVAL, ARRIVAL_WATERMARK):
        t = have.get(name)
        if t is not None and not (pa.types.is_integer(t) or pa.types.is_timestamp(t)):
            raise ReplayInputError(
                f"--input {inp.spec!r}: column '{name}' is {t}; arrival order needs integers "
                "or timestamps"
            )


def _time_filter(field_type: pa.DataType, name: str, window: TimeRange) -> ds.Expression | None:
    """The window as a filter on the stored event-time column (integers: epoch ms;
    timestamps: in their unit, :func:`_convert`'s millisecond), which lets the reader
    skip row groups and files outside it."""
    if not window:
        return None

    def stored(ms: int) -> pa.Scalar:
        if not pa.types.is_timestamp(field_type):
            return pa.scalar(ms, pa.int64())
        if field_type.unit == "s":  # ms >= S <=> seconds >= ceil(S / 1000); likewise <
            return pa.scalar(-(-ms // 1000), field_type)
        return pa.scalar(ms * _PER_MS[field_type.unit], field_type)

    column = ds.field(name)
    bounds = []
    if window.start is not None:
        bounds.append(column >= stored(window.start))
    if window.end is not None:
        bounds.append(column < stored(window.end))
    return bounds[0] if len(bounds) == 1 else bounds[0] & bounds[1]


_PER_MS = {"ms": 1, "us": 1_000, "ns": 1_000_000}


@dataclass
class _TableInput:
    """An input table: its stream, its readings in the window, the arrival rule applied
    (:attr:`note`), and :attr:`pieces`."""

    stream: StreamSchema
    rows: int
    note: str
    pieces: Callable[[], Iterator[pa.Table]]
    """The readings as arrival tables in arrival order (``seq`` still NULL where the
    table has none); a misfit value raises :class:`ReplayInputError` naming the
    reading's place in arrival order."""


def _unreadable(inp: Input, err: Exception) -> ReplayInputError:
    return ReplayInputError(f"--input {inp.spec!r}: cannot read {inp.path}: {err}")


def _read_table(inp: Input, window: TimeRange) -> _TableInput:
    """The input table's readings in the window: read now and sorted into arrival order
    when a column gives it (or the table is Delta, which keeps no row order), else
    counted now and read piece by piece in stored order, so that memory holds a piece
    at a time."""
    try:
        dataset = _dataset(inp)
    except ReplayInputError:
        raise
    except Exception as err:  # delta-rs and Arrow raise their own kinds
        raise _unreadable(inp, err) from None
    names = set(dataset.schema.names)
    stream = _table_stream(inp, names)
    _check_columns(inp, stream, dataset.schema)
    order, rule = arrival_order(names, inp.kind)
    ts_name = stream.timestamp or "ts"
    extra = [c for c in (*IDENTITY, *order) if c in names]
    wanted = list(dict.fromkeys([*(c.name for c in stream.columns), *extra]))
    where = _time_filter(dataset.schema.field(ts_name).type, ts_name, window)
    if not order and inp.kind == "delta":
        order = [ts_name, *(c for c in IDENTITY if c in names)]

    def in_stored_order() -> Iterator[pa.Table]:
        # Files by path, rows as stored; reading ahead one batch and one file at most,
        # or the reader decodes most of a large file ahead of the evaluation.
        batches = dataset.to_batches(
            columns=wanted,
            filter=where,
            batch_size=BATCH_READINGS,
            batch_readahead=1,
            fragment_readahead=1,
        )
        before = 0
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except Exception as err:  # a file that cannot be read after all
                raise _unreadable(inp, err) from None
            if batch.num_rows:
                stored = pa.Table.from_batches([batch])
                arrivals = _table_arrivals(inp, stream, stored, before)
                before += stored.num_rows
                yield _in_window(arrivals, stream, window)

    pieces: Callable[[], Iterator[pa.Table]] = in_stored_order
    try:
        if order:
            table = dataset.to_table(columns=wanted, filter=where)
            table = table.take(pc.sort_indices(table, [(c, "ascending") for c in order]))
            whole = _in_window(_table_arrivals(inp, stream, table), stream, window)
            rows = whole.num_rows
            pieces = partial(iter, [whole])
        else:
            rows = dataset.count_rows(filter=where)
    except ReplayInputError:
        raise
    except Exception as err:
        raise _unreadable(inp, err) from None
    note = f"{inp.spec}: {rows:,} readings, arrival order {rule}"
    if ARRIVAL_WATERMARK in order and stream.source_idle_ms is not None:
        note += (
            f"; '{stream.name}' has a clock per source and the table holds no heartbeats: "
            "a source the engine waited for on its heartbeats alone may be idle or new "
            "here, and some of its readings late"
        )
    return _TableInput(stream, rows, note, pieces)


def _table_arrivals(inp: Input, stream: StreamSchema, table: pa.Table, before: int = 0) -> pa.Table:
    """A table's columns (checked by :func:`_check_columns`) in the engine's types, as
    an arrival table; a value ingest would reject is refused with its reason and its
    place in arrival order (``before``: readings of the input ahead of ``table``)."""
    n = table.num_rows
    columns: dict[str, Any] = {}
    for column in stream.columns:
        try:
            columns[column.name] = _convert(table.column(column.name), column.type)
        except _OutOfRange as err:
            raise ReplayInputError(
                f"--input {inp.spec!r}: reading {before + err.index + 1} in arrival order: field "
                f"'{column.name}' is out of the {column.type} range ({shown(err.value)})"
            ) from None
    have = set(table.column_names)
    columns["source"] = (
        pc.fill_null(table.column("source").cast(pa.string()), "")
        if "source" in have
        else pa.array([""] * n, pa.string())
    )
    columns["epoch"] = (
        pc.fill_null(table.column("epoch").cast(pa.string()), "")
        if "epoch" in have
        else pa.array([""] * n, pa.string())
    )
    columns["seq"] = (
        table.column("seq").cast(pa.int64()) if "seq" in have else pa.nulls(n, pa.int64())
    )
    columns[HEARTBEAT] = pa.array(np.zeros(n, dtype=bool))
    arrivals = pa.table(columns)
    bad = _violation(arrivals, stream)
    if bad is not None:
        index, reason = bad
        raise ReplayInputError(
            f"--input {inp.spec!r}: reading {before + index + 1} in arrival order: {reason}"
        )
    return arrivals


def _least(values: pa.ChunkedArray) -> float:
    """The column's least value (+infinity for none)."""
    least = pc.min(values).as_py()
    return math.inf if least is None else least


class _OutOfRange(ValueError):
    def __init__(self, index: int, value: Any) -> None:
        super().__init__(value)
        self.index, self.value = index, value


_LIMITS = {ColumnType.INT: (-(2**31), 2**31 - 1), ColumnType.BIGINT: (-(2**63), 2**63 - 1)}


def _convert(values: pa.ChunkedArray, column_type: ColumnType) -> pa.ChunkedArray:
    """A column in the engine's type for ``column_type`` (timestamps: epoch ms, the
    millisecond at or before the stored instant)."""
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    t = values.type
    if column_type in _LIMITS and pa.types.is_integer(t):
        low, high = _LIMITS[column_type]
        outside = pc.or_(pc.less(values, low), pc.greater(values, high))
        if pc.any(pc.fill_null(outside, False)).as_py():
            index = pc.index(pc.fill_null(outside, False), True).as_py()
            raise _OutOfRange(index, values[index].as_py())
    if column_type == ColumnType.TIMESTAMP:
        if pa.types.is_timestamp(t):
            raw = values.cast(pa.int64())
            if t.unit == "s":
                return pc.multiply(raw, 1000)
            per_ms = _PER_MS[t.unit]
            if per_ms == 1:
                return raw
            return pa.chunked_array(
                [
                    pa.array(
                        np.floor_divide(c.to_numpy(zero_copy_only=False), per_ms),
                        pa.int64(),
                        mask=c.is_null().to_numpy(zero_copy_only=False) if c.null_count else None,
                    )
                    for c in raw.chunks
                ],
                pa.int64(),
            )
        return values.cast(pa.int64())
    return values.cast(arrival_type(column_type))
