"""What ingest's landed files hold, read as Arrow columns (no Spark).

Ingest lands JSON-lines files, one folder per stream (``stream=<name>``, and
``stream=_quarantine`` for rejected payloads; see ``ingest/landing.py``). Each line of a
stream's file is a validated reading (its stream's columns, timestamps as epoch ms,
``source``, ``epoch``, ``seq``) or a heartbeat (``"_kind": "heartbeat"``, the stream's
timestamp and ``source``, ``_received_ms``). A message's readings are consecutive lines,
the first with the message's ``_topic`` and ``_received_ms``, which hold for the lines
after it that have none. The order of the files' names, then of their lines, is the
arrival order.

:func:`read_stream_file` turns one file into the arrivals a
:class:`~engine.core.pipeline.Pipeline` takes, :func:`read_quarantine_file` into
quarantine rows. Both parse with DuckDB's JSON reader (in C++, a thread per core, no
Python object per value; about twice as fast as Arrow's here), which converts each value
to its field's type as DuckDB casts (an integer to a DOUBLE, a number to a STRING as its
text). A file it refuses is read line by line: a line that is not a JSON object, or
whose values do not convert, becomes a quarantine row naming its file and line, so one
damaged file never stops the engine; each line is judged as DuckDB judges it alone,
whatever its neighbours. :func:`read_landed` reads a batch's files from their
filesystem, a thread per core, and parses each stream's files together.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import fs as pafs

from engine.core.batch import HEARTBEAT
from engine.core.plan import StreamSchema
from engine.core.schema import arrival_type
from ingest.landing import (
    QUARANTINE,
    QUARANTINE_PAYLOAD_BYTES,
    STREAM_FOLDER,
    quarantine_record,
)

QUARANTINE_FOLDER = QUARANTINE
"""The stream folder of the payloads ingest rejected."""

#: Provenance columns of an arrival besides the stream's own and its identity.
TOPIC = "topic"
RECEIVED_MS = "received_ms"

QUARANTINE_LINE = pa.schema(
    [
        ("topic", pa.string()),
        ("reason", pa.string()),
        ("payload", pa.string()),
        ("payload_b64", pa.string()),
        ("received_ms", pa.int64()),
        ("payload_bytes", pa.int64()),
        ("payload_sha256", pa.string()),
    ]
)
"""A quarantine line as ingest lands it."""


def landed_schema(stream: StreamSchema) -> pa.Schema:
    """The fields of a stream's landed lines, as the JSON reader types them."""
    fields = [pa.field(c.name, arrival_type(c.type)) for c in stream.columns]
    fields += [
        pa.field("source", pa.string()),
        pa.field("epoch", pa.string()),
        pa.field("seq", pa.int64()),
        pa.field("_kind", pa.string()),
        pa.field("_topic", pa.string()),
        pa.field("_received_ms", pa.int64()),
    ]
    return pa.schema(fields)


def arrivals_schema(stream: StreamSchema) -> pa.Schema:
    """The columns :func:`read_stream_file` returns (what the pipeline takes)."""
    fields = [pa.field(c.name, arrival_type(c.type)) for c in stream.columns]
    fields += [
        pa.field("source", pa.string()),
        pa.field("epoch", pa.string()),
        pa.field("seq", pa.int64()),
        pa.field(HEARTBEAT, pa.bool_()),
        pa.field(TOPIC, pa.string()),
        pa.field(RECEIVED_MS, pa.int64()),
    ]
    return pa.schema(fields)


_DUCKDB_TYPES = {
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.string(): "VARCHAR",
    pa.bool_(): "BOOLEAN",
}
_CURSORS = threading.Lock()


class Refused(ValueError):
    """DuckDB refused a landed line: not JSON, or a value that does not convert. Any
    other error of DuckDB's (memory, a closed connection) propagates: it says nothing
    of the lines, and must not quarantine them."""


@cache
def _duckdb() -> duckdb.DuckDBPyConnection:
    """The process's in-memory DuckDB (connecting costs ~15 ms; a parse takes a cursor)."""
    return duckdb.connect(config={"threads": os.cpu_count() or 1})


def _cursor() -> duckdb.DuckDBPyConnection:
    """A cursor of the process's DuckDB, for one parse or query (close it after)."""
    with _CURSORS:
        return _duckdb().cursor()


def _columns(schema: pa.Schema) -> dict[str, str]:
    """``schema``'s fields as the DuckDB types its JSON reader converts to."""
    return {field.name: _DUCKDB_TYPES[field.type] for field in schema}


def _has_lines(data: bytes) -> bool:
    """Whether ``data`` holds anything but whitespace (without copying it, as strip does)."""
    return bool(data) and not data.isspace()


def _parse(buffers: Sequence[bytes], schema: pa.Schema, files: bool = False) -> pa.Table:
    """The landed lines of ``buffers``, one after another, as a table of ``schema`` in
    their order (fields it does not name are ignored; ``files``: and a last column,
    ``filename``, the same for the lines of one buffer). Raises :class:`Refused` when a
    line is not a JSON object or a value does not convert to its field's type."""
    buffers = [data for data in buffers if _has_lines(data)]
    if not buffers:
        return _with_files(schema, files).empty_table()
    with _cursor() as cursor:
        sources = [io.BytesIO(data) for data in buffers]
        try:
            read = cursor.read_json(
                sources, format="newline_delimited", columns=_columns(schema), filename=files
            )
            return read.to_arrow_table().cast(_with_files(schema, files))
        except (duckdb.InvalidInputException, duckdb.ConversionException) as err:
            if "JSON" not in str(err):
                raise  # not about the lines (fsspec missing, ...): no line is to blame
            raise Refused(_duckdb_reason(err)) from err


def _with_files(schema: pa.Schema, files: bool) -> pa.Schema:
    return schema.append(pa.field("filename", pa.string())) if files else schema


def _parse_messages(buffers: Sequence[bytes], schema: pa.Schema) -> pa.Table:
    """Landed lines, each reading with its message's topic and time of receipt (on the
    message's first line only; a heartbeat's line has a time of receipt, no topic). A
    message never reaches past the end of its buffer (its file)."""
    table = _parse(buffers, schema)
    starts = _file_starts([data for data in buffers if _has_lines(data)], table, schema)
    names = ("_topic", "_received_ms")
    later = pa.array(starts[1:], pa.int64())  # where each file but the first begins
    if all(pc.all(pc.is_valid(table.column(n).take(later))).as_py() is not False for n in names):
        files = [table]  # every file starts with a message's first line, as ingest's do
    else:
        files = [table.slice(a, b - a) for a, b in itertools.pairwise([*starts, len(table)])]
    for name in names:
        filled = [pc.fill_null_forward(file.column(name)) for file in files]
        column = pa.chunked_array(
            [c for f in filled for c in f.chunks], table.schema.field(name).type
        )
        table = table.set_column(table.column_names.index(name), name, column)
    return table


def _file_starts(buffers: Sequence[bytes], table: pa.Table, schema: pa.Schema) -> list[int]:
    """The row of ``table`` (``buffers`` parsed) where each buffer's lines begin: counted
    by newlines, a record a line; where that does not add up (blank lines), as DuckDB
    names each record's buffer."""
    counts = [data.count(b"\n") + (not data.endswith(b"\n")) for data in buffers]
    if sum(counts) == table.num_rows:
        return list(itertools.accumulate(counts[:-1], initial=0))
    named = _parse(buffers, schema, files=True).column("filename").combine_chunks()
    ends = pc.run_end_encode(named).run_ends.to_pylist()
    return [0, *ends[:-1]]


def _arrivals(stream: StreamSchema, table: pa.Table) -> pa.Table:
    """Parsed landed lines of ``stream`` as the arrivals the pipeline takes. A heartbeat
    has no topic (its line has none; the one before it is another message's)."""
    heartbeat = pc.fill_null(pc.equal(table.column("_kind"), "heartbeat"), False)
    columns = {c.name: table.column(c.name) for c in stream.columns}
    columns["source"] = pc.fill_null(table.column("source"), "")
    columns["epoch"] = pc.fill_null(table.column("epoch"), "")
    columns["seq"] = table.column("seq")
    columns[HEARTBEAT] = heartbeat
    columns[TOPIC] = pc.if_else(heartbeat, pa.scalar(None, pa.string()), table.column("_topic"))
    columns[RECEIVED_MS] = table.column("_received_ms")
    return pa.table(columns, schema=arrivals_schema(stream))


def read_stream_file(
    stream: StreamSchema, name: str, data: bytes
) -> tuple[pa.Table, list[dict[str, Any]]]:
    """The arrivals of one landed file of ``stream`` in arrival order, and quarantine
    rows for its lines that are not landed records (normally none)."""
    schema = landed_schema(stream)
    bad: list[dict[str, Any]] = []
    try:
        table = _parse_messages([data], schema)
    except Refused:
        table, bad = _parse_lines(data, schema, name, _parse_messages)
    return _arrivals(stream, table), bad


def _parse_lines(
    data: bytes,
    schema: pa.Schema,
    name: str,
    parse: Callable[[Sequence[bytes], pa.Schema], pa.Table],
) -> tuple[pa.Table, list[dict]]:
    """The slow path: lines that are not JSON objects, or whose values do not convert to
    ``schema`` (found by halving the runs DuckDB refuses), become quarantine rows. The
    good lines between two such are parsed together (``parse``): a message's topic, on
    its first line, never reaches past a line set aside, which may have been the next
    message's first."""
    lines = [(n, line) for n, line in enumerate(data.split(b"\n"), start=1) if line.strip()]
    why: dict[int, str] = {}
    refused: dict[int, tuple[bytes, str]] = {}
    for number, line in lines:
        try:
            if not isinstance(orjson.loads(line), dict):
                why[number] = "not a JSON object"
        except ValueError as err:
            refused[number] = (line, str(err))
    # DuckDB takes a few lines orjson refuses (a trailing comma, NaN): so does the parse.
    taken = _duckdb_objects([line for line, _ in refused.values()])
    why.update(
        (n, reason) for (n, (_, reason)), ok in zip(refused.items(), taken, strict=True) if not ok
    )
    why.update(_unconvertible([(n, line) for n, line in lines if n not in why], schema))
    runs: list[list[bytes]] = [[]]
    bad: list[dict[str, Any]] = []
    for number, line in lines:
        if number not in why:
            runs[-1].append(line)
            continue
        reason = f"landed file {name} line {number} is not a landed record: {why[number]}"
        record = quarantine_record(None, reason, line, QUARANTINE_PAYLOAD_BYTES)
        bad.append({**record, "received_ms": None})
        runs.append([])
    parsed = [parse([b"\n".join(run)], schema) for run in runs if run]
    return (pa.concat_tables(parsed) if parsed else schema.empty_table()), bad


def _duckdb_objects(lines: Sequence[bytes]) -> list[bool]:
    """Which of ``lines`` DuckDB's JSON functions take as an object (they are as lenient
    as its reader: a trailing comma, NaN), in one query."""
    if not lines:
        return []
    texts = []
    for line in lines:
        try:
            texts.append(line.decode())
        except UnicodeDecodeError:
            texts.append("")  # DuckDB's reader refuses it too
    with _cursor() as cursor:
        cursor.register("refused", pa.table({"line": texts}))
        judged = cursor.sql(
            "SELECT CASE WHEN json_valid(line) THEN json_type(line) = 'OBJECT' ELSE false END"
            " FROM refused"
        )
        return [ok for (ok,) in judged.fetchall()]


def _unconvertible(lines: Sequence[tuple[int, bytes]], schema: pa.Schema) -> dict[int, str]:
    """The numbers of the JSON-object ``lines`` whose values DuckDB does not convert to
    ``schema``, with the reason: those a lenient parse leaves NULL where the line has a
    value, found in one pass; then any run DuckDB's strict parse still refuses (it takes
    fewer strings for numbers than the lenient one, such as "1.5" for an INTEGER) is
    halved until each refused line stands alone (~2 log2(n) parses a line)."""
    found = _nulled(lines, schema)
    return {**found, **_halved([(n, line) for n, line in lines if n not in found], schema)}


def _nulled(lines: Sequence[tuple[int, bytes]], schema: pa.Schema) -> dict[int, str]:
    """The lines a lenient parse of ``schema`` (a value that does not convert becomes
    NULL) leaves NULL where the same lines read as raw JSON have a value."""
    if not lines:
        return {}
    data = io.BytesIO(b"\n".join(line for _, line in lines))
    typed = _columns(schema)
    with _cursor() as cursor:
        try:
            lenient = cursor.read_json(
                data, format="newline_delimited", columns=typed, ignore_errors=True
            ).to_arrow_table()
            data.seek(0)
            raw = cursor.read_json(
                data, format="newline_delimited", columns=dict.fromkeys(typed, "JSON")
            ).to_arrow_table()
        except (duckdb.InvalidInputException, duckdb.ConversionException):
            return {}  # the halving finds them, with DuckDB's reasons
    if lenient.num_rows != len(lines) or raw.num_rows != len(lines):
        return {}
    found: dict[int, list[str]] = {}
    for name, duck_type in typed.items():
        value = raw.column(name)
        lost = pc.and_(pc.is_null(lenient.column(name)), pc.not_equal(value, "null"))
        for i in pc.indices_nonzero(pc.fill_null(lost, False)).to_pylist():
            found.setdefault(lines[i][0], []).append(
                f"{name} {_clipped(value[i].as_py())} does not convert to {duck_type}"
            )
    return {number: "; ".join(said) for number, said in found.items()}


def _clipped(text: str, at: int = 60) -> str:
    return text if len(text) <= at else text[: at - 3] + "..."


def _halved(lines: Sequence[tuple[int, bytes]], schema: pa.Schema) -> dict[int, str]:
    """The lines DuckDB's strict parse refuses, each with its reason: the run is halved
    until each refused line stands alone."""
    if not lines:
        return {}
    try:
        _parse([b"\n".join(line for _, line in lines)], schema)
        return {}
    except Refused as err:
        if len(lines) == 1:
            return {lines[0][0]: str(err)}
    half = len(lines) // 2
    return {**_halved(lines[:half], schema), **_halved(lines[half:], schema)}


def _duckdb_reason(err: duckdb.Error) -> str:
    """The first line of DuckDB's message, without its in-memory file's name and the
    line number within the one line parsed."""
    first = str(err).strip().splitlines()[0]
    return re.sub(r' in file "[^"]*"|, in line \d+', "", first)


def read_quarantine_file(name: str, data: bytes) -> list[dict[str, Any]]:
    """The quarantine rows of one landed ``_quarantine`` file."""
    try:
        return _parse([data], QUARANTINE_LINE).to_pylist()
    except Refused:
        table, bad = _parse_lines(data, QUARANTINE_LINE, name, _parse)
        return table.to_pylist() + bad


def read_landed(
    fs: pafs.FileSystem,
    root: str,
    files: Sequence[tuple[str, str]],
    schemas: Mapping[str, StreamSchema],
) -> tuple[dict[str, pa.Table], list[dict[str, Any]]]:
    """The landed ``files`` under ``root`` ((name, stream) pairs, in landing order), read
    a thread per core and each stream's parsed together: each stream's arrivals in
    landing order, one chunk per column, and the quarantine rows (a quarantine file's,
    and the lines of a stream's file that are not landed records) in the files' order.
    A stream whose files hold a line DuckDB refuses is read file by file."""

    def fetch(file: tuple[str, str]) -> bytes:
        name, stream = file
        with fs.open_input_stream(f"{root}/{STREAM_FOLDER}{stream}/{name}") as f:
            return f.read()

    with ThreadPoolExecutor(max(1, min(len(files), os.cpu_count() or 1))) as pool:
        data = list(pool.map(fetch, files))
    quarantine: dict[int, list[dict[str, Any]]] = {}
    of_stream: dict[str, list[int]] = {}
    for i, (name, stream) in enumerate(files):
        if stream == QUARANTINE_FOLDER:
            quarantine[i] = read_quarantine_file(name, data[i])
        else:
            of_stream.setdefault(stream, []).append(i)
    arrivals: dict[str, pa.Table] = {}
    for stream, indices in of_stream.items():
        schema = schemas[stream]
        try:
            parsed = _parse_messages([data[i] for i in indices], landed_schema(schema))
            table = _arrivals(schema, parsed)
        except Refused:
            parts = []
            for i in indices:
                part, quarantine[i] = read_stream_file(schema, files[i][0], data[i])
                parts.append(part)
            table = pa.concat_tables(parts)
        # One chunk per column: compute over many small chunks costs far more.
        arrivals[stream] = table.combine_chunks()
    return arrivals, [row for i in sorted(quarantine) for row in quarantine[i]]
