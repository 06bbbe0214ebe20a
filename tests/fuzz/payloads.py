"""Hypothesis strategies and property checks for fuzzing MQTT payloads (bad input).

Shared by `tests/fuzz/test_payloads.py` (a moderate run in the normal suite) and
`benchmarks/fuzz_input.py` (the long run). The strategies generate structured-but-wrong
JSON as well as random bytes: right fields with wrong types, extra nesting, huge and
non-finite numbers, odd timestamps, unicode, empty arrays, non-UTF-8 bytes and batches
mixing good and bad readings.

`check_message` states the properties of one validated message; `check_landing` lands
what ingest would land with the real `LandingWriter`, reads the files back with the
engine's reader and checks that the engine's pipeline accounts for every line.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pyarrow as pa
from hypothesis import strategies as st

from engine.core.pipeline import Pipeline
from engine.core.plan import ColumnType, Plan, StreamSchema
from engine.landed_files import QUARANTINE_FOLDER, read_quarantine_file, read_stream_file
from ingest.landing import LandingWriter
from ingest.validate import (
    BIGINT_RANGE,
    INT_RANGE,
    NON_NEGATIVE,
    Validated,
    Validator,
    split_array,
)
from rules.language.loader import analyse, load_rules
from tests.ingest.helpers import kept_payload

NOW_MS = 1_764_000_000_000
"""The wall clock the fuzzed validator is told (2025-11-24)."""

REPO = Path(__file__).resolve().parents[2]

#: A stream beyond the library's, so that every column type (BIGINT, BOOLEAN, STRING, a
#: second TIMESTAMP) meets bad input too.
EVERY_TYPE = """\
CREATE STREAM gauges (name STRING, level BIGINT, ok BOOLEAN, speed DOUBLE,
                      checked TIMESTAMP, ts TIMESTAMP)
  ORDER BY ts SLACK 1 SECONDS SOURCE 'lookout/gauges/+/readings';
"""


def library_streams() -> list[StreamSchema]:
    """The source streams of the real rule library plus the every-type stream."""
    streams = list(load_rules([REPO / "rules"]).plan.sources())
    # A rule file of its own, checked as if it were written (it never is).
    every_type = analyse([], edits={REPO / "every_type.sql": EVERY_TYPE})
    assert every_type.plan is not None and not every_type.errors, every_type.errors
    return streams + list(every_type.plan.sources())


def topic_for(stream: StreamSchema, device: str, kind: str = "readings") -> str:
    """A concrete topic under `stream`'s SOURCE filter (`+` replaced by `device`)."""
    assert stream.topic is not None
    topic = stream.topic.replace("+", device)
    return topic.rsplit("/", 1)[0] + "/heartbeat" if kind == "heartbeat" else topic


# ---- values ----------------------------------------------------------------------------

_ODD_TIMESTAMPS = st.sampled_from(
    [
        "2025-11-24T16:00:00Z",
        "2025-11-24T16:00:00+14:00",
        "2025-11-24T16:00:00",  # no offset
        "2025-11-24 16:00:00.123456-12:00",
        "0001-01-01T00:00:00+01:00",  # the far edges of datetime, with offsets
        "9999-12-31T23:59:59-01:00",
        "2025-02-30T00:00:00Z",
        "2025-11-24T25:00:00Z",
        "  2025-11-24T16:00:00Z  ",
        "Z",
        "",
        "now",
        "1764000000000",
        "\uff12\uff10\uff12\uff15-11-24T16:00:00Z",  # full-width digits
        "2025-11-24T16:00:00Z\x00",
    ]
)

_NUMBERS = st.one_of(
    st.integers(),
    st.sampled_from(
        [
            0,
            -1,
            2**31 - 1,
            2**31,
            -(2**31) - 1,
            2**63 - 1,
            2**63,
            -(2**63) - 1,
            2**64 - 1,
            2**64,
            10**30,
            NOW_MS,
            NOW_MS + 301_000,  # just past the default five minutes ahead
            NOW_MS + 9 * 365 * 86_400_000,  # a clock nine years ahead
            NOW_MS + 0.5,
            -0.0,
            1e300,
            -1e300,
            5e-324,
            3.0,
        ]
    ),
    st.floats(allow_nan=True, allow_infinity=True),
)

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    _NUMBERS,
    st.text(max_size=20),
    st.sampled_from(["x" * 256, "é" * 257]),  # at and past the default length limit
    _ODD_TIMESTAMPS,
)

json_values = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
"""Any JSON-ish value, including ones JSON cannot carry (NaN, infinities, huge ints)."""


def good_value(column_type: str, name: str, ts: int) -> st.SearchStrategy[Any]:
    """A value a well-behaved producer would send for a column of `column_type`."""
    if column_type == ColumnType.TIMESTAMP:
        return st.one_of(
            st.integers(ts - 60_000, ts + 60_000),
            st.just("2025-11-24T16:00:00.250Z"),
            st.just(ts + 0.0),
        )
    if column_type in (ColumnType.INT, ColumnType.BIGINT):
        return st.integers(0, 1_000)
    if column_type == ColumnType.DOUBLE:
        low = 0.0 if name in NON_NEGATIVE else -1e6
        return st.floats(low, 1e6, allow_nan=False) | st.integers(0, 100)
    if column_type == ColumnType.BOOLEAN:
        return st.booleans()
    return st.text(max_size=12) | st.integers(0, 99)


@st.composite
def readings(draw: st.DrawFn, stream: StreamSchema) -> tuple[dict[str, Any], bool]:
    """(a reading for `stream`, whether it was left well-formed).

    A reading starts well-formed; with some probability one or more of its fields is
    replaced by an arbitrary value, deleted, or the reading gets extra fields.
    """
    columns = [(c.name, c.type) for c in stream.columns]
    columns += [("source", ColumnType.STRING), ("seq", ColumnType.BIGINT)]
    item = {
        name: draw(good_value(type_, name, NOW_MS))
        for name, type_ in columns
        if name not in ("source", "seq")
    }
    item["source"] = draw(st.sampled_from(["loop-1", "loop-2", "dévice-☃", ""]))
    item["seq"] = draw(st.integers(0, 30))
    if draw(st.booleans()):  # a source's run id: text, or an integer of any size
        item["epoch"] = draw(st.sampled_from(["", "1764000000000-3f9a", 7, 2**70]))
    intact = True
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        name = draw(st.sampled_from([n for n, _ in columns] + ["epoch", "extra", "é", ""]))
        action = draw(st.sampled_from(["replace", "delete", "nest", "deep"]))
        if action == "delete":
            item.pop(name, None)
        elif action == "nest":
            item[name] = draw(st.sampled_from([[item.get(name)], {"value": item.get(name)}]))
        elif action == "deep":  # deeper than orjson writes or Python's recursion allows
            item[name] = _nested(draw(st.sampled_from([300, 900])))
        elif name in ("ts", "checked"):
            item[name] = draw(st.one_of(_ODD_TIMESTAMPS, _NUMBERS, json_values))
        else:
            item[name] = draw(st.one_of(_SCALARS, _NUMBERS, json_values))
        intact = False
    return item, intact


def _nested(depth: int) -> list[Any]:
    """`[[[...]]]`, `depth` arrays deep."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _dumps(document: Any, style: str) -> bytes:
    """Encode `document` the way a sloppy producer might (NaN literals, UTF-16, ...)."""
    if style == "orjson":
        try:
            return orjson.dumps(document)
        except orjson.JSONEncodeError:
            style = "json"  # e.g. an integer beyond 64 bits
    text = json.dumps(document, allow_nan=True, ensure_ascii=style == "ascii")
    if style == "utf-16":
        return text.encode("utf-16")
    return text.encode("utf-8", errors="surrogatepass")


@dataclass(frozen=True)
class Message:
    """One fuzzed MQTT message."""

    topic: str
    payload: bytes


@st.composite
def messages(draw: st.DrawFn, streams: Sequence[StreamSchema]) -> Message:
    """A message on a stream, heartbeat or unknown topic; structured or raw garbage."""
    stream = draw(st.sampled_from(list(streams)))
    device = draw(st.sampled_from(["s1", "loop-7", "☃", "a b"]))
    kind = draw(st.sampled_from(["readings"] * 6 + ["heartbeat", "unknown"]))
    if kind == "unknown":
        topic = draw(st.sampled_from(["lookout/nobody/x", "elsewhere", "", "lookout/traffic"]))
    else:
        topic = topic_for(stream, device, kind)
    shapes = ["one", "batch", "batch", "raw", "mangled", "scalar", "empty", "huge"]
    shape = draw(st.sampled_from(shapes))
    if shape == "huge":  # over the limit the validator is given (2,000 bytes in the tests)
        return Message(topic, b'{"station": "' + b"9" * draw(st.integers(1_990, 5_000)) + b'"}')
    if shape == "raw":
        return Message(topic, draw(st.binary(max_size=64)))
    if shape == "empty":
        return Message(topic, draw(st.sampled_from([b"[]", b"", b"{}", b"[[]]", b"null"])))
    if shape == "scalar":
        return Message(topic, _dumps(draw(json_values), "json"))
    if kind == "heartbeat":
        beat = {"source": device, "ts": draw(good_value(ColumnType.TIMESTAMP, "ts", NOW_MS))}
        if draw(st.booleans()):
            beat[draw(st.sampled_from(["ts", "source"]))] = draw(json_values)
        items: list[Any] = [beat]
    else:
        items = [draw(readings(stream))[0] for _ in range(draw(st.integers(1, 6)))]
    items += draw(st.lists(json_values, max_size=2)) if shape == "batch" else []
    document: Any = draw(st.permutations(items)) if shape == "batch" else items[0]
    style = draw(st.sampled_from(["orjson"] * 4 + ["json", "ascii", "utf-16"]))
    payload = _dumps(document, style)
    if shape == "mangled" and payload:
        # Non-UTF-8 bytes, a truncation or a stray byte somewhere in otherwise good JSON.
        at = draw(st.integers(0, len(payload)))
        junk = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"}", b""]))
        payload = payload[:at] + junk + payload[at + draw(st.integers(0, 2)) :]
    return Message(topic, payload)


# ---- properties ------------------------------------------------------------------------


def _check_value(type_: str, name: str, value: Any, validator: Validator) -> None:
    if type_ == ColumnType.STRING:
        assert type(value) is str and len(value) <= validator.max_string_chars, (name, value)
    elif type_ == ColumnType.INT:
        assert type(value) is int and INT_RANGE[0] <= value <= INT_RANGE[1], (name, value)
    elif type_ in (ColumnType.BIGINT, ColumnType.TIMESTAMP):
        assert type(value) is int and BIGINT_RANGE[0] <= value <= BIGINT_RANGE[1], (name, value)
    elif type_ == ColumnType.DOUBLE:
        assert type(value) is float and math.isfinite(value), (name, value)
    else:
        assert type(value) is bool, (name, value)
    if name in validator.non_negative and type_ != ColumnType.STRING:
        assert value >= 0, (name, value)


def _decoded(validator: Validator, payload: bytes) -> tuple[bool, Any]:
    """(whether ingest reads `payload` as one JSON document, the document): msgspec,
    which keeps integers of any size exact, within the size limit."""
    if len(payload) > validator.max_payload_bytes:
        return False, None
    try:
        return True, msgspec.json.decode(payload)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        return False, None


def check_message(validator: Validator, message: Message, result: Validated) -> None:
    """Every element of the message is accounted for: accepted, or rejected with a reason.

    - a payload that is not a JSON document (or on an unknown topic) is one rejection
      holding the raw bytes, unless it is an array whose elements can be told apart:
      then each element is judged alone, as in a batch;
    - a single object is one outcome; a batch of n elements is n outcomes, each bad one
      rejected with its own bytes (exactly as published) and its index;
    - accepted readings hold exactly the declared columns plus `source`, `seq` and
      `epoch`, each of its declared type and range (text within the length limit), with
      the event time within the stream's clock window.
    """
    outcomes = len(result.readings) + len(result.heartbeats) + len(result.rejections)
    for rejection in result.rejections:
        assert isinstance(rejection.reason, str) and rejection.reason.strip(), rejection
        assert isinstance(rejection.payload, bytes)
        assert rejection.topic == message.topic
    stream, is_heartbeat = validator.route(message.topic)
    if stream is None:
        assert outcomes == 1 and result.rejections[0].payload == message.payload
        return
    parsed, document = _decoded(validator, message.payload)
    elements = None
    if not parsed and len(message.payload) <= validator.max_payload_bytes:
        elements = split_array(message.payload)
    if (not parsed and elements is None) or (type(document) is list and not document):
        assert outcomes == 1, result
        assert result.rejections and result.rejections[0].payload == message.payload
        return
    if elements is not None:
        assert outcomes == len(elements), (len(elements), result)
        for rejection in result.rejections:
            index = int(rejection.reason.removeprefix("reading #").split(" ", 1)[0])
            assert rejection.payload == elements[index], rejection
        return
    batch = type(document) is list
    items = document if batch else [document]
    assert outcomes == len(items), (len(items), result)
    if batch:
        raw = msgspec.json.decode(message.payload, type=list[msgspec.Raw])
        for rejection in result.rejections:
            index = int(rejection.reason.removeprefix("reading #").split(" ", 1)[0])
            assert rejection.payload == bytes(raw[index]), rejection
    else:
        for rejection in result.rejections:
            assert rejection.payload == message.payload
    window = validator.clock_for(stream.name)
    low, high = NOW_MS - window.max_past_ms, NOW_MS + window.max_future_ms
    if is_heartbeat:
        assert not result.readings
        for beat in result.heartbeats:
            _check_value(ColumnType.TIMESTAMP, "ts", beat[stream.timestamp], validator)
            _check_value(ColumnType.STRING, "source", beat["source"], validator)
            assert low <= beat[stream.timestamp] <= high, beat
        return
    assert not result.heartbeats
    expected = {c.name: c.type for c in stream.columns}
    expected.update(source=ColumnType.STRING, seq=ColumnType.BIGINT, epoch=ColumnType.STRING)
    for reading in result.readings:
        assert set(reading) == set(expected), reading
        for name, type_ in expected.items():
            _check_value(type_, name, reading[name], validator)
        assert low <= reading[stream.timestamp] <= high, reading


def check_landing(
    validator: Validator, results: Sequence[tuple[Message, Validated]], received_ms: int = NOW_MS
) -> None:
    """Land the messages as ingest does, read the files back, split them; nothing is lost.

    Every quarantined payload comes back with its reason, size and SHA-256, and its first
    bytes exactly (up to the writer's limit, less a UTF-8 character cut there);
    every accepted reading comes back on time, late or counted as a duplicate; every
    heartbeat comes back as a heartbeat row.
    """
    accepted: dict[str, int] = {}
    rejected: list[tuple[str, str, bytes]] = []
    beats = 0
    with tempfile.TemporaryDirectory() as root:
        writer = LandingWriter(root, "fuzz-0")
        for message, result in results:
            if result.readings:
                assert result.stream is not None
                accepted[result.stream] = accepted.get(result.stream, 0) + len(result.readings)
                writer.add_readings(result.stream, result.readings, message.topic, received_ms)
            for beat in result.heartbeats:
                assert result.stream is not None
                writer.add_heartbeat(result.stream, beat, received_ms)
                beats += 1
            for rejection in result.rejections:
                rejected.append((rejection.topic, rejection.reason, rejection.payload))
                writer.add_rejection(
                    rejection.topic, rejection.reason, rejection.payload, received_ms
                )
        writer.flush()
        arrivals: dict[str, list[pa.Table]] = {}
        quarantine: list[dict[str, Any]] = []
        schemas = {s.name: s for s in validator.streams}
        for path in sorted(Path(root).glob("stream=*/part-*.jsonl")):
            folder = path.parent.name.removeprefix("stream=")
            if folder == QUARANTINE_FOLDER:
                quarantine += read_quarantine_file(path.name, path.read_bytes())
                continue
            table, damaged = read_stream_file(schemas[folder], path.name, path.read_bytes())
            assert not damaged, damaged
            arrivals.setdefault(folder, []).append(table)
    pipeline = Pipeline(Plan({s.name: s for s in validator.streams}))
    out = pipeline.process({name: pa.concat_tables(t) for name, t in arrivals.items()})
    for name, count in accepted.items():
        landed = out.readings[name].num_rows if name in out.readings else 0
        landed += sum(1 for row in out.late if row.stream == name)
        landed += sum(1 for row in out.conflicts if row.stream == name)
        landed += out.duplicates.get(name, 0)
        assert landed == count, (name, landed, count)
    assert sum(out.heartbeats.values()) == beats
    back = [(row["topic"], row["reason"], row["payload_sha256"]) for row in quarantine]
    assert sorted(back) == sorted((t, r, hashlib.sha256(p).hexdigest()) for t, r, p in rejected)
    for row in quarantine:
        kept = kept_payload(row)
        payload = next(
            p for _, _, p in rejected if hashlib.sha256(p).hexdigest() == row["payload_sha256"]
        )
        assert payload.startswith(kept) and row["payload_bytes"] == len(payload)
        assert len(kept) >= min(len(payload), writer.quarantine_payload_bytes) - 3
