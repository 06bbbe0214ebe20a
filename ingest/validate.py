"""Validate MQTT payloads against the declared stream schemas (pure; no I/O).

A payload is one reading (a JSON object) or a batch (a JSON array of objects). Each
reading is checked against the `CREATE STREAM` it belongs to (chosen by topic) and
normalised: the timestamp becomes epoch milliseconds, numbers get their declared type,
fields the stream does not declare are dropped. Whatever fails is returned as a
`Rejection` with a plain-words reason; the good readings of a batch are kept. Nothing
here raises on bad input.

The kinds of bad input and the reason each gets (the tests pin every one):

    unknown topic        "no stream's SOURCE matches topic ..."
    topic too long       "topic is N characters; the limit is M"
    oversized message    "payload is N bytes; the limit is M"
    not UTF-8            "payload is not UTF-8 (byte i)"
    not JSON             "payload is not JSON: ..." (in a batch: that reading alone)
    empty array          "payload is an empty array; ..."
    extra nesting        "a reading must be a JSON object, got array" / "field 'x' is an object"
    missing field        "missing field 'x'"
    wrong type           "field 'x' must be INT, got ..." (also out of the type's range)
    text too long        "field 'x' is N characters; the limit is M"
    negative speed       "field 'speed' is negative (-3.0)"
    bad timestamp        "field 'ts': cannot parse timestamp ..."
    clock too far off    "timestamp too far in the future: ..." / "... in the past: ..."

Speed matters (ingest lands hundreds of thousands of readings a second): the common
case, a value already of its declared JSON type, is checked inline by `type(v) is T`
and a range comparison; only the rest goes through `_coerce`, which knows the reasons.
Before that, a payload is decoded against the stream's types by msgspec (`_TypedDecoder`,
in C); only one with something to normalise or reject takes the per-reading path.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache, partial
from operator import itemgetter
from typing import Annotated, Any, NotRequired, TypedDict

import msgspec

from engine.core.plan import Column, ColumnType, StreamSchema

#: Fields every reading carries besides its stream's own columns.
IDENTITY_COLUMNS = (Column("source", ColumnType.STRING), Column("seq", ColumnType.BIGINT))

#: A source's run (boot) id, optional in a payload: a restarted source starts its `seq`
#: again, and (source, epoch, seq) keeps its new readings apart from the old ones. A
#: reading without one lands with the empty text.
EPOCH = Column("epoch", ColumnType.STRING)
NO_EPOCH = ""

#: Columns a physical reading can never have negative (m/s and metres).
NON_NEGATIVE = frozenset({"speed", "length"})

#: Inclusive value ranges of the integer types (Spark's INT and BIGINT).
INT_RANGE = (-(2**31), 2**31 - 1)
BIGINT_RANGE = (-(2**63), 2**63 - 1)

#: The longest text field (ids, `source`, `epoch`, STRING columns) by default.
MAX_STRING_CHARS = 256

#: The longest topic ingest reads (MQTT allows 65,535 bytes): a `+` level of a stream's
#: filter matches any text, and the topic is stored with every line.
MAX_TOPIC_CHARS = 1024

MINUTE_MS = 60_000
DAY_MS = 86_400_000

#: Topic -> stream lookups cached per validator; cleared when it grows past this, so a
#: flood of distinct unknown topics cannot exhaust memory.
TOPIC_CACHE_LIMIT = 10_000

#: How much of a bad value a reason quotes: a reason is stored with every rejection.
SHOWN_CHARS = 60


@dataclass(frozen=True)
class Rejection:
    """A payload, or one reading of a batch, that cannot be accepted."""

    topic: str
    reason: str
    payload: bytes


@dataclass
class Validated:
    """The outcome of validating one MQTT message."""

    stream: str | None
    readings: list[dict[str, Any]] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    heartbeats: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ClockWindow:
    """How far from ingest's wall clock a reading's or heartbeat's timestamp may be.

    The future bound is short: a source whose clock runs ahead would otherwise move its
    stream's event time on, and every later reading of the stream would be late.
    """

    max_future_ms: int = 5 * MINUTE_MS
    max_past_ms: int = 3650 * DAY_MS


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT topic-filter matching with `+` (one level) and `#` (the rest)."""
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    for i, level in enumerate(filter_levels):
        if level == "#":
            return True
        if i >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[i]:
            return False
    return len(filter_levels) == len(topic_levels)


def heartbeat_filter(source_filter: str) -> str:
    """The heartbeat topic filter that goes with a readings filter.

    `lookout/traffic/+/readings` -> `lookout/traffic/+/heartbeat`.
    """
    head, _, last = source_filter.rpartition("/")
    return f"{head}/heartbeat" if last == "readings" else f"{source_filter}/heartbeat"


def shown(value: Any) -> str:
    """`value` as a reason quotes it: its repr, cut to SHOWN_CHARS with the full length."""
    text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}… ({len(text)} characters)"


def describe_ms(ms: int) -> str:
    """A duration in words: '3287 days 4 h', '2 h 5 min', '5 min', '12.3 s', '250 ms'."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < MINUTE_MS:
        return f"{ms / 1000:.1f} s"
    days, rest = divmod(ms, DAY_MS)
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, MINUTE_MS)
    if days:
        return f"{days} days {hours} h" if hours else f"{days} days"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    seconds = rest // 1000
    return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"


def parse_timestamp(value: Any) -> int:
    """Epoch milliseconds from an ISO-8601 string with offset or an epoch-ms number.

    Raises ValueError with a plain-words reason.
    """
    if isinstance(value, bool):
        raise ValueError(f"timestamp must be ISO-8601 text or epoch milliseconds, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"timestamp {value!r} is not a finite number")
        return round(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"cannot parse timestamp {shown(value)} as ISO-8601") from None
        if parsed.tzinfo is None:
            raise ValueError(f"timestamp {shown(value)} has no UTC offset")
        return round(parsed.timestamp() * 1000)
    raise ValueError(
        f"timestamp must be ISO-8601 text or epoch milliseconds, got {type(value).__name__}"
    )


def _integer(column: str, sql_type: str, value: Any, bounds: tuple[int, int]) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 3.0 is the integer 3 (some JSON encoders write it so)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"field '{column}' must be {sql_type}, got {shown(value)}")
    if not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"field '{column}' is out of the {sql_type} range ({shown(value)})")
    return value


def _coerce(column: str, sql_type: str, value: Any) -> Any:
    """Check one field against its declared type; raise ValueError with the reason."""
    if isinstance(value, dict | list):
        kind = "an object" if isinstance(value, dict) else "an array"
        raise ValueError(f"field '{column}' is {kind}; expected a {sql_type} value")
    if value is None:
        raise ValueError(f"field '{column}' is null")
    if sql_type == "INT":
        return _integer(column, sql_type, value, INT_RANGE)
    if sql_type == "BIGINT":
        return _integer(column, sql_type, value, BIGINT_RANGE)
    if sql_type == "DOUBLE":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"field '{column}' must be DOUBLE, got {shown(value)}")
        try:
            number = float(value)  # an integer past 1e308 cannot be one
        except OverflowError:
            raise ValueError(f"field '{column}' is out of the DOUBLE range") from None
        if not math.isfinite(number):
            raise ValueError(f"field '{column}' is not a finite number")
        return number
    if sql_type == "BOOLEAN":
        if not isinstance(value, bool):
            raise ValueError(f"field '{column}' must be BOOLEAN, got {shown(value)}")
        return value
    if sql_type == "TIMESTAMP":
        try:
            return _integer(column, "epoch-ms", parse_timestamp(value), BIGINT_RANGE)
        except ValueError as err:
            raise ValueError(f"field '{column}': {err}") from None
    if sql_type == "STRING":
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            # Ids published as numbers are still ids; an integer keeps every digit
            # (the decoder keeps integers of any size exactly).
            return str(value)
        raise ValueError(f"field '{column}' must be STRING, got {shown(value)}")
    raise ValueError(f"field '{column}' has unsupported type {sql_type}")


#: The Python type the decoder produces for a well-formed value of each SQL type, and
#: its range (for STRING, the range of its length: see `_fields`).
_FAST: dict[str, tuple[type, float, float]] = {
    "INT": (int, *INT_RANGE),
    "BIGINT": (int, *BIGINT_RANGE),
    "TIMESTAMP": (int, *BIGINT_RANGE),
    "DOUBLE": (float, -math.inf, math.inf),
    "BOOLEAN": (bool, False, True),
    "STRING": (str, 0, 0),
}

#: `_Field.default` of a field a reading must carry.
_REQUIRED = object()


@dataclass(frozen=True)
class _Field:
    """One column as the fast paths check it (for STRING, `high` caps its length)."""

    name: str
    sql_type: str
    fast_type: type
    low: float
    high: float
    non_negative: bool
    default: Any = _REQUIRED

    def check(self, value: Any) -> Any:
        """The normalised value, or ValueError with the reason (the slow path)."""
        value = _coerce(self.name, self.sql_type, value)
        if self.fast_type is str:
            if len(value) > self.high:
                raise ValueError(
                    f"field '{self.name}' is {len(value)} characters; the limit is {self.high}"
                )
        elif self.non_negative and value < 0:
            raise ValueError(f"field '{self.name}' is negative ({shown(value)})")
        return value


def _fields(
    columns: Sequence[Column], non_negative: frozenset[str], max_chars: int
) -> tuple[_Field, ...]:
    """How the fast paths check each of `columns`."""

    def make(column: Column) -> _Field:
        fast_type, low, high = _FAST.get(column.type, (type(None), 0, 0))
        if fast_type is str:
            high = max_chars
        elif column.name in non_negative:
            low = max(low, 0)  # a negative value leaves the fast path and gets its reason
        return _Field(column.name, column.type, fast_type, low, high, column.name in non_negative)

    return tuple(make(c) for c in columns)


def _epoch_field(non_negative: frozenset[str], max_chars: int) -> _Field:
    (epoch,) = _fields((EPOCH,), non_negative, max_chars)
    return replace(epoch, default=NO_EPOCH)


@lru_cache(maxsize=256)
def _normalizer(
    stream: StreamSchema, non_negative: frozenset[str], require_identity: bool, max_chars: int
) -> tuple[Callable[[Any], dict[str, Any]], tuple[_Field, ...]]:
    """(the compiled check of the fields a reading must or may carry, the fields checked
    only when present) for `stream`. With `require_identity`, `source` and `seq` must be
    there and `epoch` is filled in when absent (what ingest lands); without (recorded
    files for replay), each is checked only when present."""
    own = _fields(stream.columns, non_negative, max_chars)
    identity = _fields(IDENTITY_COLUMNS, non_negative, max_chars)
    epoch = _epoch_field(non_negative, max_chars)
    if require_identity:
        return _compile((*own, *identity, epoch)), ()
    return _compile(own), (*identity, epoch)


#: The largest finite float: DOUBLE bounds for the typed decoder, which then never
#: accepts an infinity.
_FLOAT_MAX = sys.float_info.max


@dataclass(frozen=True)
class _TypedDecoder:
    """Decodes and checks a payload whose readings are all already normal, in one C pass.

    msgspec decodes the JSON straight against a TypedDict of the stream's fields, each of
    exactly its JSON type (no bool for an int, no 7.0 for an INT, no text for a number;
    an integer is accepted for a DOUBLE and becomes a float, as in `_coerce`) and within
    its range or length, and drops undeclared fields: the same test as the per-reading
    fast path (`_compile`), at about the cost of `orjson.loads` alone. Only the clock
    window, which moves with `now`, is checked afterwards. Anything it does not accept
    returns None, and the caller takes the per-reading path, which normalises what it
    can and gives each rejection its reason.
    """

    decoder: msgspec.json.Decoder
    timestamp: str

    def __call__(self, payload: bytes, low_ms: int, high_ms: int) -> list[dict] | None:
        """The readings of `payload` (one object or a non-empty array), or None."""
        try:
            document = self.decoder.decode(payload)
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            # msgspec raises UnicodeDecodeError for bad UTF-8 inside a string, and
            # RecursionError for nesting deeper than Python's recursion limit.
            return None
        readings = document if type(document) is list else [document]
        if not readings:
            return None
        stamps = list(map(itemgetter(self.timestamp), readings))
        if not low_ms <= min(stamps) <= max(stamps) <= high_ms:
            return None
        for reading in readings:  # measured: cheaper than map() over setdefault
            if "epoch" not in reading:
                reading["epoch"] = NO_EPOCH
        return readings


@lru_cache(maxsize=256)
def _typed_decoder(
    stream: StreamSchema, non_negative: frozenset[str], max_chars: int
) -> _TypedDecoder | None:
    """The typed decoder of `stream`'s payloads; None if a column type has no fast test."""
    fields = _fields((*stream.columns, *IDENTITY_COLUMNS), non_negative, max_chars)
    types: dict[str, Any] = {}
    for f in (*fields, _epoch_field(non_negative, max_chars)):
        if f.fast_type is str:
            types[f.name] = Annotated[str, msgspec.Meta(max_length=int(f.high))]
        elif f.fast_type is bool:
            types[f.name] = bool
        elif f.fast_type is float:
            bounds = msgspec.Meta(ge=max(f.low, -_FLOAT_MAX), le=min(f.high, _FLOAT_MAX))
            types[f.name] = Annotated[float, bounds]
        elif f.fast_type is int:
            types[f.name] = Annotated[int, msgspec.Meta(ge=f.low, le=f.high)]
        else:
            return None
        if f.default is not _REQUIRED:
            types[f.name] = NotRequired[types[f.name]]
    reading = TypedDict(f"{stream.name}_reading", types)  # type: ignore[misc]
    decoder = msgspec.json.Decoder(reading | list[reading])
    assert stream.timestamp is not None  # a stream with a SOURCE has an ORDER BY column
    return _TypedDecoder(decoder, stream.timestamp)


def normalize_reading(
    stream: StreamSchema,
    item: Any,
    non_negative: frozenset[str] = NON_NEGATIVE,
    require_identity: bool = True,
    max_chars: int = MAX_STRING_CHARS,
) -> dict[str, Any]:
    """One reading checked against its stream and normalised (timestamps as epoch ms).

    Raises ValueError naming the field and what is wrong with it. Without
    `require_identity` (recorded files for replay), `source`, `seq` and `epoch` may be
    absent; with it, an absent `epoch` is the empty text.
    """
    normalize, optional = _normalizer(stream, non_negative, require_identity, max_chars)
    reading = normalize(item)
    for spec in optional:
        if spec.name in item:
            reading[spec.name] = spec.check(item[spec.name])
    return reading


def _compile(fields: tuple[_Field, ...]) -> Callable[[Any], dict[str, Any]]:
    """A function that checks and normalises a reading with exactly these fields.

    Generated as straight-line code (the way `dataclasses` builds `__init__`): one
    inline `type(v) is T and low <= v <= high` test per field (for text, its length)
    instead of a loop of method calls made validation about three times faster, and it
    is the per-reading cost of ingest. A value that fails its inline test goes to
    `_Field.check`, which normalises it or raises with the reason. A field with a
    default may be absent.
    """
    lines = ["def normalize(item):", "    if type(item) is not dict:", "        not_object(item)"]
    lines.append("    try:")
    for i, f in enumerate(fields):
        if f.default is _REQUIRED:
            lines.append(f"        v{i} = item[{f.name!r}]")
        else:
            lines.append(f"        v{i} = item.get({f.name!r}, D{i})")
    lines += ["    except KeyError:", "        missing(item)"]
    for i, f in enumerate(fields):
        if f.fast_type is str:
            test = f"type(v{i}) is T{i} and len(v{i}) <= H{i}"
        else:
            test = f"type(v{i}) is T{i} and L{i} <= v{i} <= H{i}"
        lines += [f"    if not ({test}):", f"        v{i} = F{i}.check(v{i})"]
    lines.append(
        "    return {" + ", ".join(f"{f.name!r}: v{i}" for i, f in enumerate(fields)) + "}"
    )

    def not_object(item: Any) -> None:
        raise ValueError(f"a reading must be a JSON object, got {_json_kind(item)}")

    def missing(item: dict[str, Any]) -> None:
        name = next(f.name for f in fields if f.default is _REQUIRED and f.name not in item)
        raise ValueError(f"missing field '{name}'")

    namespace: dict[str, Any] = {"not_object": not_object, "missing": missing}
    for i, f in enumerate(fields):
        namespace.update(
            {f"T{i}": f.fast_type, f"L{i}": f.low, f"H{i}": f.high, f"F{i}": f, f"D{i}": f.default}
        )
    exec("\n".join(lines), namespace)  # the source holds only repr()-quoted column names
    return namespace["normalize"]


def _json_kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "null" if value is None else "number"
    )


class _Unreadable(ValueError):
    """Bytes that are not one JSON document; the message says why, without a subject."""


#: Untyped JSON: integers of any size stay exact integers (orjson would make a 30-digit
#: id a float), up to Python's limit on integer digits.
_read_any = msgspec.json.Decoder().decode
#: A batch's elements as the bytes they were published as.
_read_elements = msgspec.json.Decoder(list[msgspec.Raw]).decode


def _is_utf8(data: bytes) -> bool:
    if data.isascii():  # what sensors send: checked at memory speed
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _read_json(data: bytes) -> Any:
    """The JSON document `data` holds; raises _Unreadable saying what is wrong."""
    try:
        return _read_any(data)
    except RecursionError:
        raise _Unreadable("not JSON: nested too deeply to read") from None
    except (msgspec.MsgspecError, UnicodeDecodeError) as err:
        try:  # tell a producer which mistake it made
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise _Unreadable(f"not UTF-8 (byte {bad.start})") from None
        problem = str(err).removeprefix("JSON is malformed: ")
        raise _Unreadable(f"not JSON: {problem[:1].lower()}{problem[1:]}") from None


#: What a top-level array is cut at: strings (skipped whole, escapes included), brackets
#: and commas.
_STRUCTURE = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|$)|[\[\]{},]', re.DOTALL)
_WHITESPACE = b" \t\r\n"  # JSON's


def split_array(payload: bytes) -> list[bytes] | None:
    """The bytes of each element of a top-level JSON array, or None when `payload` is not
    a balanced array. Only the structure is read (strings, brackets, commas), so an
    element that cannot be decoded (nested too deeply, a NaN, bad UTF-8) does not stop
    its neighbours from being read on their own."""
    text = payload.strip(_WHITESPACE)
    if not (text.startswith(b"[") and text.endswith(b"]")):
        return None
    depth, start, elements = 0, 1, []
    for token in _STRUCTURE.finditer(text):
        mark = token.group()[:1]
        if mark == b'"':
            if len(token.group()) < 2 or not token.group().endswith(b'"'):
                return None  # a string that never ends
        elif mark in b"[{":
            depth += 1
        elif mark in b"]}":
            depth -= 1
            if depth < 0 or (depth == 0 and token.end() != len(text)):
                return None  # closes more than it opened, or ends before the end
        elif depth == 1:  # a comma between two elements
            elements.append(text[start : token.start()].strip(_WHITESPACE))
            start = token.end()
    if depth != 0:
        return None
    elements.append(text[start:-1].strip(_WHITESPACE))
    return elements


@dataclass(frozen=True)
class Validator:
    """Validates payloads for a set of streams.

    `now_ms` is injected per call so the clock-window check is testable. `clock` is the
    window of every stream without its own in `stream_clocks`. `non_negative` names
    columns that may not be negative (speeds, lengths). `max_string_chars` caps text
    fields; a topic longer than MAX_TOPIC_CHARS is rejected whatever it is.
    """

    streams: Sequence[StreamSchema]
    max_payload_bytes: int = 1_048_576
    clock: ClockWindow = ClockWindow()
    stream_clocks: Mapping[str, ClockWindow] = field(default_factory=dict)
    max_string_chars: int = MAX_STRING_CHARS
    non_negative: frozenset[str] = NON_NEGATIVE
    catch_all: str = "lookout/#"
    # topic -> (stream, is a heartbeat topic); a cache, not configuration.
    _routes: dict[str, tuple[StreamSchema | None, bool]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def clock_for(self, stream: str) -> ClockWindow:
        """The clock window `stream`'s timestamps must fall in."""
        return self.stream_clocks.get(stream, self.clock)

    def stream_for(self, topic: str) -> StreamSchema | None:
        """The stream whose SOURCE filter matches `topic`, if any."""
        for stream in self.streams:
            if stream.topic and topic_matches(stream.topic, topic):
                return stream
        return None

    def heartbeat_stream_for(self, topic: str) -> StreamSchema | None:
        """The stream a heartbeat topic belongs to, if any."""
        for stream in self.streams:
            if stream.topic and topic_matches(heartbeat_filter(stream.topic), topic):
                return stream
        return None

    def route(self, topic: str) -> tuple[StreamSchema | None, bool]:
        """(the stream `topic` feeds, whether it is that stream's heartbeat topic)."""
        cached = self._routes.get(topic)
        if cached is not None:
            return cached
        stream = self.stream_for(topic)
        beat = None if stream else self.heartbeat_stream_for(topic)
        found = (stream or beat, beat is not None)
        if len(self._routes) >= TOPIC_CACHE_LIMIT:
            self._routes.clear()
        self._routes[topic] = found
        return found

    def subscriptions(self) -> list[str]:
        """The topic filters ingest subscribes to.

        `catch_all` (default `lookout/#`) covers every stream's readings and heartbeats
        under it, and also brings in messages on topics no stream declares, so those land
        in quarantine instead of vanishing. Overlapping filters are left out: a broker may
        deliver a message once per matching subscription.
        """
        filters = [self.catch_all] if self.catch_all else []
        prefix = self.catch_all.removesuffix("#")
        for stream in self.streams:
            if stream.topic:
                for f in (stream.topic, heartbeat_filter(stream.topic)):
                    if not (self.catch_all and f.startswith(prefix)):
                        filters.append(f)
        return list(dict.fromkeys(filters))

    def validate(self, topic: str, payload: bytes, now_ms: int) -> Validated:
        """Split one MQTT message into accepted readings, heartbeats and rejections."""
        if len(topic) > MAX_TOPIC_CHARS:
            reason = f"topic is {len(topic)} characters; the limit is {MAX_TOPIC_CHARS}"
            return Validated(None, rejections=[Rejection(topic, reason, payload)])
        target, is_heartbeat = self.route(topic)
        result = Validated(stream=target.name if target else None)

        def reject(reason: str, raw: bytes = payload) -> Validated:
            result.rejections.append(Rejection(topic, reason, raw))
            return result

        if target is None:
            return reject(f"no stream's SOURCE matches topic {shown(topic)}")
        if len(payload) > self.max_payload_bytes:
            return reject(f"payload is {len(payload)} bytes; the limit is {self.max_payload_bytes}")
        window = self.clock_for(target.name)
        low, high = now_ms - window.max_past_ms, now_ms + window.max_future_ms
        typed = (
            None
            if is_heartbeat
            else _typed_decoder(target, self.non_negative, self.max_string_chars)
        )
        # msgspec skips unknown fields unread, invalid UTF-8 in them included: such a
        # payload takes the path that reads (and rejects) all of it.
        readings = typed(payload, low, high) if typed and _is_utf8(payload) else None
        if readings is not None:  # all normal: the common case, nothing to reject
            result.readings = readings
            return result
        try:
            document = _read_json(payload)
            elements: list[bytes] | None = None
        except _Unreadable as err:
            # A batch whose whole cannot be read: each element on its own.
            elements = split_array(payload)
            if elements is None:
                return reject(f"payload is {err}")
            document = list(map(_read_element, elements))
        batch = type(document) is list
        if batch and not document:
            return reject("payload is an empty array; a batch needs at least one reading")
        items = document if batch else [document]
        ts_name = target.timestamp
        assert ts_name is not None  # a stream with a SOURCE has an ORDER BY column
        normalize = (
            partial(self._heartbeat, target)
            if is_heartbeat
            else _normalizer(target, self.non_negative, True, self.max_string_chars)[0]
        )
        accepted = result.heartbeats if is_heartbeat else result.readings
        for index, item in enumerate(items):
            try:
                if isinstance(item, _Unreadable):
                    raise item
                value = normalize(item)
                ts = value[ts_name]
                if not low <= ts <= high:
                    raise ValueError(self._clock_reason(target.name, ts, now_ms))
                accepted.append(value)
            except ValueError as err:
                if not batch:
                    reject(str(err))
                    continue
                if elements is None:  # the exact bytes of the element, read when needed
                    elements = [bytes(raw) for raw in _read_elements(payload)]
                reject(f"reading #{index} of the batch: {err}", elements[index])
        return result

    def _clock_reason(self, stream: str, ts: int, now_ms: int) -> str:
        window = self.clock_for(stream)
        if ts > now_ms:
            return (
                f"timestamp too far in the future: {describe_ms(ts - now_ms)} ahead of "
                f"ingest's clock; the limit for stream '{stream}' is "
                f"{describe_ms(window.max_future_ms)}"
            )
        return (
            f"timestamp too far in the past: {describe_ms(now_ms - ts)} behind ingest's "
            f"clock; the limit for stream '{stream}' is {describe_ms(window.max_past_ms)}"
        )

    def _heartbeat(self, stream: StreamSchema, item: Any) -> dict[str, Any]:
        if type(item) is not dict:
            raise ValueError(f"a heartbeat must be a JSON object, got {_json_kind(item)}")
        if "ts" not in item:
            raise ValueError("heartbeat has no field 'ts'")
        ts = _coerce("ts", ColumnType.TIMESTAMP, item["ts"])
        (source,) = _fields(IDENTITY_COLUMNS[:1], self.non_negative, self.max_string_chars)
        assert stream.timestamp is not None  # a stream with a SOURCE has an ORDER BY column
        # Keyed by the stream's own timestamp column so it lines up with the readings.
        return {"source": source.check(item.get("source", "")), stream.timestamp: ts}


def _read_element(raw: bytes) -> Any:
    """One element of a batch that could not be read whole: its value, or the
    _Unreadable saying why this element cannot be read."""
    try:
        return _read_json(raw)
    except _Unreadable as err:
        return err
