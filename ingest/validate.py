"""Validate MQTT payloads against the declared stream schemas (pure; no I/O).

A payload is one reading (a JSON object) or a batch (a JSON array of objects). Each
reading is checked against the `CREATE STREAM` it belongs to (chosen by topic) and
normalised: the timestamp becomes epoch milliseconds, numbers get their declared type,
fields the stream does not declare are dropped. Whatever fails is returned as a
`Rejection` with a plain-words reason; the good readings of a batch are kept. Nothing
here raises on bad input.

The kinds of bad input and the reason each gets (the tests pin every one):

    unknown topic        "no stream's SOURCE matches topic ..."
    oversized message    "payload is N bytes; the limit is M"
    not UTF-8            "payload is not UTF-8 (byte i)"
    not JSON             "payload is not JSON: ..."
    empty array          "payload is an empty array; ..."
    extra nesting        "a reading must be a JSON object, got list" / "field 'x' is an object"
    missing field        "missing field 'x'"
    wrong type           "field 'x' must be INT, got ..." (also out of the type's range)
    negative speed       "field 'speed' is negative (-3.0)"
    bad timestamp        "field 'ts': cannot parse timestamp ..." / "... days away from now"

Speed matters (ingest lands hundreds of thousands of readings a second): the common
case, a value already of its declared JSON type, is checked inline by `type(v) is T`
and a range comparison; only the rest goes through `_coerce`, which knows the reasons.
Before that, a payload is decoded against the stream's types by msgspec (`_TypedDecoder`,
in C); only one with something to normalise or reject takes the per-reading path.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache, partial
from operator import itemgetter
from typing import Annotated, Any, TypedDict

import msgspec
import orjson

from engine.core.plan import Column, ColumnType, StreamSchema

#: Fields every reading carries besides its stream's own columns (DESIGN §2).
IDENTITY_COLUMNS = (Column("source", ColumnType.STRING), Column("seq", ColumnType.BIGINT))

#: Columns a physical reading can never have negative (m/s and metres).
NON_NEGATIVE = frozenset({"speed", "length"})

#: Inclusive value ranges of the integer types (Spark's INT and BIGINT).
INT_RANGE = (-(2**31), 2**31 - 1)
BIGINT_RANGE = (-(2**63), 2**63 - 1)

#: Topic -> stream lookups cached per validator; cleared when it grows past this, so a
#: flood of distinct unknown topics cannot exhaust memory.
TOPIC_CACHE_LIMIT = 10_000


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
    """The heartbeat topic filter that goes with a readings filter (DESIGN §2).

    `lookout/traffic/+/readings` -> `lookout/traffic/+/heartbeat`.
    """
    head, _, last = source_filter.rpartition("/")
    return f"{head}/heartbeat" if last == "readings" else f"{source_filter}/heartbeat"


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
            raise ValueError(f"cannot parse timestamp {value!r} as ISO-8601") from None
        if parsed.tzinfo is None:
            raise ValueError(f"timestamp {value!r} has no UTC offset")
        return round(parsed.timestamp() * 1000)
    raise ValueError(
        f"timestamp must be ISO-8601 text or epoch milliseconds, got {type(value).__name__}"
    )


def _integer(column: str, sql_type: str, value: Any, bounds: tuple[int, int]) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 3.0 is the integer 3 (some JSON encoders write it so)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"field '{column}' must be {sql_type}, got {value!r}")
    if not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"field '{column}' is out of the {sql_type} range ({value})")
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
            raise ValueError(f"field '{column}' must be DOUBLE, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"field '{column}' is not a finite number")
        return float(value)
    if sql_type == "BOOLEAN":
        if not isinstance(value, bool):
            raise ValueError(f"field '{column}' must be BOOLEAN, got {value!r}")
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
            return str(value)  # ids published as numbers are still ids
        raise ValueError(f"field '{column}' must be STRING, got {value!r}")
    raise ValueError(f"field '{column}' has unsupported type {sql_type}")


#: The Python type orjson produces for a well-formed value of each SQL type, and its range.
_FAST: dict[str, tuple[type, float, float]] = {
    "INT": (int, *INT_RANGE),
    "BIGINT": (int, *BIGINT_RANGE),
    "TIMESTAMP": (int, *BIGINT_RANGE),
    "DOUBLE": (float, -math.inf, math.inf),
    "BOOLEAN": (bool, False, True),
    "STRING": (str, 0, 0),  # no range: see _Field.check
}


@dataclass(frozen=True)
class _Field:
    """One column as the fast path checks it."""

    name: str
    sql_type: str
    fast_type: type
    low: float
    high: float
    non_negative: bool

    def check(self, value: Any) -> Any:
        """The normalised value, or ValueError with the reason (the slow path)."""
        value = _coerce(self.name, self.sql_type, value)
        if self.non_negative and value < 0:
            raise ValueError(f"field '{self.name}' is negative ({value})")
        return value


def _fields(columns: Sequence[Column], non_negative: frozenset[str]) -> tuple[_Field, ...]:
    """How the fast paths check each of `columns`."""

    def make(column: Column) -> _Field:
        fast_type, low, high = _FAST.get(column.type, (type(None), 0, 0))
        if column.name in non_negative:
            low = max(low, 0)  # a negative value leaves the fast path and gets its reason
        return _Field(column.name, column.type, fast_type, low, high, column.name in non_negative)

    return tuple(make(c) for c in columns)


@lru_cache(maxsize=256)
def _normalizer(
    stream: StreamSchema, non_negative: frozenset[str], require_identity: bool
) -> tuple[Callable[[Any], dict[str, Any]], tuple[_Field, ...]]:
    """(the compiled check of the required fields, the optional fields) for `stream`."""
    own = _fields(stream.columns, non_negative)
    identity = _fields(IDENTITY_COLUMNS, non_negative)
    if require_identity:
        return _compile(own + identity), ()
    return _compile(own), identity


#: The largest finite float: DOUBLE bounds for the typed decoder, which then never
#: accepts an infinity.
_FLOAT_MAX = sys.float_info.max


@dataclass(frozen=True)
class _TypedDecoder:
    """Decodes and checks a payload whose readings are all already normal, in one C pass.

    msgspec decodes the JSON straight against a TypedDict of the stream's required
    fields, each of exactly its JSON type (no bool for an int, no 7.0 for an INT, no
    text for a number; an integer is accepted for a DOUBLE and becomes a float, as in
    `_coerce`) and within its range, and drops undeclared fields: the same test as the
    per-reading fast path (`_compile`), at about the cost of `orjson.loads` alone. Only
    the clock distance, which moves with `now`, is checked afterwards. Anything it does
    not accept returns None, and the caller takes the per-reading path, which
    normalises what it can and gives each rejection its reason.
    """

    decoder: msgspec.json.Decoder
    timestamp: str

    def __call__(self, payload: bytes, low_ms: int, high_ms: int) -> list[dict] | None:
        """The readings of `payload` (one object or a non-empty array), or None."""
        try:
            document = self.decoder.decode(payload)
        except (msgspec.MsgspecError, UnicodeDecodeError):  # msgspec raises the latter
            return None  # for bad UTF-8 inside a string
        readings = document if type(document) is list else [document]
        if not readings:
            return None
        stamps = list(map(itemgetter(self.timestamp), readings))
        if not low_ms <= min(stamps) <= max(stamps) <= high_ms:
            return None
        return readings


@lru_cache(maxsize=256)
def _typed_decoder(stream: StreamSchema, non_negative: frozenset[str]) -> _TypedDecoder | None:
    """The typed decoder of `stream`'s payloads; None if a column type has no fast test."""
    fields = _fields((*stream.columns, *IDENTITY_COLUMNS), non_negative)
    types: dict[str, Any] = {}
    for f in fields:
        if f.fast_type in (str, bool):
            types[f.name] = f.fast_type
        elif f.fast_type is float:
            bounds = msgspec.Meta(ge=max(f.low, -_FLOAT_MAX), le=min(f.high, _FLOAT_MAX))
            types[f.name] = Annotated[float, bounds]
        elif f.fast_type is int:
            types[f.name] = Annotated[int, msgspec.Meta(ge=f.low, le=f.high)]
        else:
            return None
    reading = TypedDict(f"{stream.name}_reading", types)  # type: ignore[misc]
    decoder = msgspec.json.Decoder(reading | list[reading])  # type: ignore[valid-type]
    return _TypedDecoder(decoder, stream.timestamp)


def normalize_reading(
    stream: StreamSchema,
    item: Any,
    non_negative: frozenset[str] = NON_NEGATIVE,
    require_identity: bool = True,
) -> dict[str, Any]:
    """One reading checked against its stream and normalised (timestamps as epoch ms).

    Raises ValueError naming the field and what is wrong with it. Without
    `require_identity` (recorded files for replay), `source` and `seq` may be absent.
    """
    normalize, optional = _normalizer(stream, non_negative, require_identity)
    reading = normalize(item)
    for spec in optional:
        if spec.name in item:
            reading[spec.name] = spec.check(item[spec.name])
    return reading


def _compile(fields: tuple[_Field, ...]) -> Callable[[Any], dict[str, Any]]:
    """A function that checks and normalises a reading with exactly these fields.

    Generated as straight-line code (the way `dataclasses` builds `__init__`): one
    inline `type(v) is T and low <= v <= high` test per field instead of a loop of
    method calls made validation about three times faster, and it is the per-reading
    cost of ingest. A value that fails its inline test goes to `_Field.check`, which
    normalises it or raises with the reason.
    """
    lines = ["def normalize(item):", "    if type(item) is not dict:", "        not_object(item)"]
    lines.append("    try:")
    lines += [f"        v{i} = item[{f.name!r}]" for i, f in enumerate(fields)]
    lines += ["    except KeyError:", "        missing(item)"]
    for i, f in enumerate(fields):
        test = f"type(v{i}) is T{i}"
        if f.fast_type is not str:
            test += f" and L{i} <= v{i} <= H{i}"
        lines += [f"    if not ({test}):", f"        v{i} = F{i}.check(v{i})"]
    lines.append(
        "    return {" + ", ".join(f"{f.name!r}: v{i}" for i, f in enumerate(fields)) + "}"
    )

    def not_object(item: Any) -> None:
        raise ValueError(f"a reading must be a JSON object, got {_json_kind(item)}")

    def missing(item: dict[str, Any]) -> None:
        name = next(f.name for f in fields if f.name not in item)
        raise ValueError(f"missing field '{name}'")

    namespace: dict[str, Any] = {"not_object": not_object, "missing": missing}
    for i, f in enumerate(fields):
        namespace.update({f"T{i}": f.fast_type, f"L{i}": f.low, f"H{i}": f.high, f"F{i}": f})
    exec("\n".join(lines), namespace)  # the source holds only repr()-quoted column names
    return namespace["normalize"]


def _json_kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "null" if value is None else "number"
    )


@dataclass(frozen=True)
class Validator:
    """Validates payloads for a set of streams.

    `now_ms` is injected per call so the clock-distance check is testable.
    `non_negative` names columns that may not be negative (speeds, lengths).
    """

    streams: Sequence[StreamSchema]
    max_payload_bytes: int = 1_048_576
    max_clock_distance_ms: int = 3650 * 86_400_000
    non_negative: frozenset[str] = NON_NEGATIVE
    catch_all: str = "lookout/#"
    # topic -> (stream, is a heartbeat topic); a cache, not configuration.
    _routes: dict[str, tuple[StreamSchema | None, bool]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

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
        target, is_heartbeat = self.route(topic)
        result = Validated(stream=target.name if target else None)

        def reject(reason: str, raw: bytes = payload) -> Validated:
            result.rejections.append(Rejection(topic, reason, raw))
            return result

        if target is None:
            return reject(f"no stream's SOURCE matches topic '{topic}'")
        if len(payload) > self.max_payload_bytes:
            return reject(f"payload is {len(payload)} bytes; the limit is {self.max_payload_bytes}")
        low, high = now_ms - self.max_clock_distance_ms, now_ms + self.max_clock_distance_ms
        typed = None if is_heartbeat else _typed_decoder(target, self.non_negative)
        readings = typed(payload, low, high) if typed else None
        if readings is not None:  # all normal: the common case, nothing to reject
            result.readings = readings
            return result
        try:
            document = orjson.loads(payload)
        except orjson.JSONDecodeError as err:
            try:  # orjson refuses both; tell a producer which mistake it made
                payload.decode("utf-8")
            except UnicodeDecodeError as bad:
                return reject(f"payload is not UTF-8 (byte {bad.start})")
            return reject(f"payload is not JSON: {err}")
        batch = type(document) is list
        if batch and not document:
            return reject("payload is an empty array; a batch needs at least one reading")
        items = document if batch else [document]
        ts_name = target.timestamp
        normalize = (
            partial(self._heartbeat, target)
            if is_heartbeat
            else _normalizer(target, self.non_negative, True)[0]
        )
        accepted = result.heartbeats if is_heartbeat else result.readings
        for index, item in enumerate(items):
            try:
                value = normalize(item)
                ts = value[ts_name]
                if not low <= ts <= high:
                    raise ValueError(self._clock_reason(ts, now_ms))
                accepted.append(value)
            except ValueError as err:
                where = f"reading #{index} of the batch: " if batch else ""
                reject(f"{where}{err}", orjson.dumps(item) if batch else payload)
        return result

    def _clock_reason(self, ts: int, now_ms: int) -> str:
        days = abs(ts - now_ms) // 86_400_000
        limit = self.max_clock_distance_ms // 86_400_000
        return f"timestamp is {days} days away from now (the limit is {limit})"

    @staticmethod
    def _heartbeat(stream: StreamSchema, item: Any) -> dict[str, Any]:
        if type(item) is not dict:
            raise ValueError(f"a heartbeat must be a JSON object, got {_json_kind(item)}")
        if "ts" not in item:
            raise ValueError("heartbeat has no field 'ts'")
        ts = _coerce("ts", ColumnType.TIMESTAMP, item["ts"])
        # Keyed by the stream's own timestamp column so it lines up with the readings.
        return {"source": str(item.get("source", "")), stream.timestamp: ts}
