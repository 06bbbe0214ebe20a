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
damaged file never stops the engine. :func:`read_landed` reads a batch's files from
their filesystem, a thread per core, and parses each stream's files together.
"""

from __future__ import annotations

import io
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


def _parse(buffers: Sequence[bytes], schema: pa.Schema) -> pa.Table:
    """The landed lines of ``buffers``, one after another, as a table of ``schema`` in
    their order (fields it does not name are ignored). Raises :class:`Refused` when
    a line is not a JSON object or a value does not convert to its field's type."""
    buffers = [data for data in buffers if data.strip()]
    if not buffers:
        return schema.empty_table()
    columns = {field.name: _DUCKDB_TYPES[field.type] for field in schema}
    with _CURSORS:
        cursor = _duckdb().cursor()
    with cursor:
        files = [io.BytesIO(data) for data in buffers]
        try:
            read = cursor.read_json(files, format="newline_delimited", columns=columns)
            return read.to_arrow_table().cast(schema)
        except (duckdb.InvalidInputException, duckdb.ConversionException) as err:
            if "JSON" not in str(err):
                raise  # not about the lines (fsspec missing, ...): no line is to blame
            raise Refused(_duckdb_reason(err)) from err


def _parse_messages(buffers: Sequence[bytes], schema: pa.Schema) -> pa.Table:
    """Landed lines, each reading with its message's topic and time of receipt (on the
    message's first line only; a heartbeat's line has a time of receipt, no topic)."""
    table = _parse(buffers, schema)
    for name in ("_topic", "_received_ms"):
        index = table.column_names.index(name)
        table = table.set_column(index, name, pc.fill_null_forward(table.column(index)))
    return table


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
    for number, line in lines:
        try:
            if not isinstance(orjson.loads(line), dict):
                why[number] = "not a JSON object"
        except ValueError as err:
            why[number] = str(err)
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


def _unconvertible(lines: Sequence[tuple[int, bytes]], schema: pa.Schema) -> dict[int, str]:
    """The numbers of the JSON-object ``lines`` whose values DuckDB does not convert to
    ``schema``, with its reason: the run is halved until each refused line stands alone
    (a damaged line costs ~2 log2(n) parses of shrinking runs)."""
    if not lines:
        return {}
    try:
        _parse([b"\n".join(line for _, line in lines)], schema)
        return {}
    except Refused as err:
        if len(lines) == 1:
            return {lines[0][0]: str(err)}
    half = len(lines) // 2
    return {**_unconvertible(lines[:half], schema), **_unconvertible(lines[half:], schema)}


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
