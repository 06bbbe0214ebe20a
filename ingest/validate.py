"""Validate MQTT payloads against the declared stream schemas (pure; no I/O).

A payload is one reading (a JSON object) or a batch (a JSON array of objects). Each
reading is checked against the `CREATE STREAM` it belongs to (chosen by topic) and
normalised: the timestamp becomes epoch milliseconds, numbers get their declared type.
Whatever fails is returned as a `Rejection` with a plain-words reason; the good readings
of a batch are kept. Nothing here raises on bad input.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from engine.core.plan import Column, ColumnType, StreamSchema

#: Fields every reading carries besides its stream's own columns (DESIGN §2).
IDENTITY_COLUMNS = (Column("source", ColumnType.STRING), Column("seq", ColumnType.BIGINT))

#: Columns a physical reading can never have negative (m/s and metres).
NON_NEGATIVE = frozenset({"speed", "length"})


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


def _coerce(column: str, sql_type: str, value: Any) -> Any:
    """Check one field against its declared type; raise ValueError with the reason."""
    if isinstance(value, dict | list):
        kind = "an object" if isinstance(value, dict) else "an array"
        raise ValueError(f"field '{column}' is {kind}; expected a {sql_type} value")
    if value is None:
        raise ValueError(f"field '{column}' is null")
    if sql_type in ("INT", "BIGINT"):
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ValueError(f"field '{column}' must be {sql_type}, got {value!r}")
        return value
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
            return parse_timestamp(value)
        except ValueError as err:
            raise ValueError(f"field '{column}': {err}") from None
    if sql_type == "STRING":
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)  # ids published as numbers are still ids
        raise ValueError(f"field '{column}' must be STRING, got {value!r}")
    raise ValueError(f"field '{column}' has unsupported type {sql_type}")


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
        stream = self.stream_for(topic)
        heartbeat_of = None if stream else self.heartbeat_stream_for(topic)
        target = stream or heartbeat_of
        result = Validated(stream=target.name if target else None)

        def reject(reason: str, raw: bytes = payload) -> Validated:
            result.rejections.append(Rejection(topic, reason, raw))
            return result

        if target is None:
            return reject(f"no stream's SOURCE matches topic '{topic}'")
        if len(payload) > self.max_payload_bytes:
            return reject(f"payload is {len(payload)} bytes; the limit is {self.max_payload_bytes}")
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as err:
            return reject(f"payload is not UTF-8 (byte {err.start})")
        try:
            document = orjson.loads(payload)
        except orjson.JSONDecodeError as err:
            return reject(f"payload is not JSON: {err}")
        items: Iterable[Any]
        if isinstance(document, list):
            if not document:
                return reject("payload is an empty array; a batch needs at least one reading")
            items = document
        else:
            items = [document]
        batch = isinstance(document, list)
        for index, item in enumerate(items):
            where = f"reading #{index} of the batch: " if batch else ""
            raw = orjson.dumps(item) if batch else payload
            try:
                if heartbeat_of is not None:
                    result.heartbeats.append(self._heartbeat(target, item, now_ms))
                else:
                    result.readings.append(self._reading(target, item, now_ms))
            except ValueError as err:
                reject(f"{where}{err}", raw)
        return result

    def _check_clock(self, ts: int, now_ms: int) -> None:
        distance = abs(ts - now_ms)
        if distance > self.max_clock_distance_ms:
            days = distance // 86_400_000
            limit = self.max_clock_distance_ms // 86_400_000
            raise ValueError(f"timestamp is {days} days away from now (the limit is {limit})")

    def _heartbeat(self, stream: StreamSchema, item: Any, now_ms: int) -> dict[str, Any]:
        if not isinstance(item, dict):
            raise ValueError(f"a heartbeat must be a JSON object, got {type(item).__name__}")
        if "ts" not in item:
            raise ValueError("heartbeat has no field 'ts'")
        ts = parse_timestamp(item["ts"])
        self._check_clock(ts, now_ms)
        # Keyed by the stream's own timestamp column so it lines up with the readings.
        return {"source": str(item.get("source", "")), stream.timestamp: ts}

    def _reading(self, stream: StreamSchema, item: Any, now_ms: int) -> dict[str, Any]:
        reading = normalize_reading(stream, item, self.non_negative)
        self._check_clock(reading[stream.timestamp], now_ms)
        return reading


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
    if not isinstance(item, dict):
        raise ValueError(f"a reading must be a JSON object, got {type(item).__name__}")
    reading: dict[str, Any] = {}
    for column in (*stream.columns, *IDENTITY_COLUMNS):
        if column.name not in item:
            if not require_identity and column in IDENTITY_COLUMNS:
                continue
            raise ValueError(f"missing field '{column.name}'")
        value = reading[column.name] = _coerce(column.name, column.type, item[column.name])
        if column.name in non_negative and value < 0:
            raise ValueError(f"field '{column.name}' is negative ({value})")
    return reading
