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
quarantine rows. Both parse with Arrow's JSON reader (in C++: no Python object per
value); a file the fast reader refuses is read line by line, and a line that is not a
valid landed record becomes a quarantine row naming its file and line, so one damaged
file never stops the engine. :func:`read_landed` reads a batch's files from their
filesystem and parses them, a thread per core.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
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


def _parse(data: bytes, schema: pa.Schema) -> pa.Table:
    options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    # One block for the whole file: the reader then keeps its lines in order.
    read = pajson.ReadOptions(block_size=max(len(data), 1 << 20), use_threads=False)
    return pajson.read_json(io.BytesIO(data), read_options=read, parse_options=options)


def _parse_messages(data: bytes, schema: pa.Schema) -> pa.Table:
    """Landed lines, each reading with its message's topic and time of receipt (on the
    message's first line only). A heartbeat's line, which has no topic, gets the one
    before it; no table keeps a heartbeat's topic."""
    table = _parse(data, schema)
    for name in ("_topic", "_received_ms"):
        index = table.column_names.index(name)
        table = table.set_column(index, name, pc.fill_null_forward(table.column(index)))
    return table


def read_stream_file(
    stream: StreamSchema, name: str, data: bytes
) -> tuple[pa.Table, list[dict[str, Any]]]:
    """The arrivals of one landed file of ``stream`` in arrival order, and quarantine
    rows for its lines that are not landed records (normally none)."""
    schema = landed_schema(stream)
    bad: list[dict[str, Any]] = []
    try:
        table = _parse_messages(data, schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        table, bad = _parse_lines(data, schema, name, _parse_messages)
    kind = table.column("_kind")
    columns = {c.name: table.column(c.name) for c in stream.columns}
    columns["source"] = pc.fill_null(table.column("source"), "")
    columns["epoch"] = pc.fill_null(table.column("epoch"), "")
    columns["seq"] = table.column("seq")
    columns[HEARTBEAT] = pc.fill_null(pc.equal(kind, "heartbeat"), False)
    columns[TOPIC] = table.column("_topic")
    columns[RECEIVED_MS] = table.column("_received_ms")
    return pa.table(columns, schema=arrivals_schema(stream)), bad


def _parse_lines(
    data: bytes, schema: pa.Schema, name: str, parse: Callable[[bytes, pa.Schema], pa.Table]
) -> tuple[pa.Table, list[dict]]:
    """The slow path: each line on its own; lines that do not parse as landed records of
    ``schema`` become quarantine rows. The good lines between two such are parsed
    together (``parse``): a message's topic, on its first line, never reaches past a
    line set aside, which may have been the next message's first."""
    runs: list[list[bytes]] = [[]]
    bad: list[dict[str, Any]] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            _parse(line, schema)
        except (ValueError, pa.ArrowInvalid, pa.ArrowTypeError) as err:
            reason = f"landed file {name} line {number} is not a landed record: {err}"
            record = quarantine_record(None, reason, line, QUARANTINE_PAYLOAD_BYTES)
            bad.append({**record, "received_ms": None})
            runs.append([])
            continue
        runs[-1].append(line)
    parsed = [parse(b"\n".join(run), schema) for run in runs if run]
    return (pa.concat_tables(parsed) if parsed else schema.empty_table()), bad


def read_quarantine_file(name: str, data: bytes) -> list[dict[str, Any]]:
    """The quarantine rows of one landed ``_quarantine`` file."""
    try:
        return _parse(data, QUARANTINE_LINE).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        table, bad = _parse_lines(data, QUARANTINE_LINE, name, _parse)
        return table.to_pylist() + bad


def read_landed(
    fs: pafs.FileSystem,
    root: str,
    files: Sequence[tuple[str, str]],
    schemas: Mapping[str, StreamSchema],
) -> tuple[dict[str, pa.Table], list[dict[str, Any]]]:
    """The landed ``files`` under ``root`` ((name, stream) pairs, in landing order),
    read and parsed a thread per core (Arrow's reader and parser release the GIL): each
    stream's arrivals in landing order, one chunk per column, and the quarantine rows
    (a quarantine file's, and the lines of a stream's file that are not landed records)
    in the files' order."""

    def read(file: tuple[str, str]) -> tuple[str, pa.Table | None, list[dict[str, Any]]]:
        name, stream = file
        with fs.open_input_stream(f"{root}/{STREAM_FOLDER}{stream}/{name}") as f:
            data = f.read()
        if stream == QUARANTINE_FOLDER:
            return stream, None, read_quarantine_file(name, data)
        table, bad = read_stream_file(schemas[stream], name, data)
        return stream, table, bad

    parts: dict[str, list[pa.Table]] = {}
    quarantine: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max(1, min(len(files), os.cpu_count() or 1))) as pool:
        for stream, table, lines in pool.map(read, files):
            quarantine += lines
            if table is not None:
                parts.setdefault(stream, []).append(table)
    # One chunk per column: compute over many small chunks (a file's each) costs far more.
    arrivals = {stream: pa.concat_tables(p).combine_chunks() for stream, p in parts.items()}
    return arrivals, quarantine
