"""From landed lines to tables: arrival order, duplicates and lateness (pure; no Spark).

Spark drops rows below its watermark before a stateful operator sees them and only
counts them (DESIGN §7), so lateness is decided here, before the rules run, exactly as
the pin says: per stream, a reading's watermark is the highest event time among the
readings and heartbeats that arrived before it, minus the slack (`SlackClock`, the one
implementation shared with replay). Arrival order is the order ingest landed things:
(file name, line). A reading whose (source, seq) was already accepted is a duplicate
(QoS 1 redelivery) and is counted, not stored again.

`LandingSequencer.split` turns one micro-batch of landed lines into the rows of
`readings_<stream>`, `late_readings`, `heartbeats` and `quarantine`; the Spark adapter
only feeds it lines and writes what it returns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import orjson

from engine.core.plan import ColumnType, StreamSchema
from engine.core.replay import SlackClock
from engine.tables import to_timestamp

#: How far behind a stream's watermark (in event time) duplicates are still recognised.
DEDUPE_HORIZON_MS = 60 * 60_000


class Verdict(Enum):
    """What happens to one arriving reading."""

    ON_TIME = "on_time"
    LATE = "late"
    DUPLICATE = "duplicate"


@dataclass
class StreamSequencer:
    """One stream's arrival-order state: its slack clock and the recently seen ids."""

    slack_ms: int
    horizon_ms: int = DEDUPE_HORIZON_MS
    clock: SlackClock = field(init=False)
    _seen: set[tuple[str, int]] = field(default_factory=set, init=False)
    _seen_order: deque[tuple[int, tuple[str, int]]] = field(default_factory=deque, init=False)

    def __post_init__(self) -> None:
        self.clock = SlackClock(self.slack_ms)

    def remember(self, source: str, seq: int, ts: int) -> None:
        """Record an id as seen (also used to rebuild the state after a restart)."""
        ident = (source, seq)
        if ident not in self._seen:
            self._seen.add(ident)
            self._seen_order.append((ts, ident))

    def admit(self, source: str, seq: int, ts: int) -> Verdict:
        """Judge the next arriving reading of this stream."""
        # A duplicate still moves the clock (a no-op when its original did already), so
        # a batch re-run after a restart judges every later reading as the first run did.
        on_time = self.clock.admit(ts)
        if (source, seq) in self._seen:
            return Verdict.DUPLICATE
        self.remember(source, seq, ts)
        return Verdict.ON_TIME if on_time else Verdict.LATE

    def heartbeat(self, ts: int) -> None:
        """A heartbeat moves event time like a reading does."""
        self.clock.admit(ts)

    def forget_old(self) -> None:
        """Drop ids far enough behind the watermark that no redelivery can still come."""
        limit = self.clock.watermark - self.horizon_ms
        # Ids are pruned in arrival order; an old id behind a newer one waits its turn.
        while self._seen_order and self._seen_order[0][0] < limit:
            self._seen.discard(self._seen_order.popleft()[1])


@dataclass
class LandingOutput:
    """Rows for each table from one batch of landed lines, and counts for health."""

    readings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    late: list[dict[str, Any]] = field(default_factory=list)
    heartbeats: list[dict[str, Any]] = field(default_factory=list)
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    max_event_ms: dict[str, int] = field(default_factory=dict)


def _stored_reading(schema: StreamSchema, line: Mapping[str, Any]) -> dict[str, Any]:
    row = {
        c.name: to_timestamp(line[c.name]) if c.type == ColumnType.TIMESTAMP else line[c.name]
        for c in schema.columns
    }
    row.update(
        source=line["source"],
        seq=line["seq"],
        topic=line.get("_topic"),
        received_at=to_timestamp(line.get("_received_ms")),
    )
    return row


class LandingSequencer:
    """Splits landed lines into table rows, keeping per-stream state across batches."""

    def __init__(self, sources: Iterable[StreamSchema]) -> None:
        self.schemas = {s.name: s for s in sources}
        self.streams = {name: StreamSequencer(s.slack_ms) for name, s in self.schemas.items()}

    def split(self, lines: Iterable[tuple[str, str, bytes | str]]) -> LandingOutput:
        """Judge (folder, file name, line) triples, given in any order.

        `folder` is the landing folder's stream name (`_quarantine` for rejects).
        """
        out = LandingOutput()
        parsed = []
        for folder, file, text in lines:
            record = orjson.loads(text)
            parsed.append((file, record.get("_line", 0), folder, record))
        parsed.sort(key=lambda item: (item[0], item[1]))
        for _, _, folder, record in parsed:
            if folder in self.streams:
                self._arrive(folder, record, out)
            else:
                out.quarantine.append(
                    {
                        "topic": record.get("topic"),
                        "reason": record.get("reason"),
                        "payload": record.get("payload"),
                        "payload_b64": record.get("payload_b64"),
                        "received_at": to_timestamp(record.get("received_ms")),
                    }
                )
        for name, sequencer in self.streams.items():
            sequencer.forget_old()
            if sequencer.clock.max_ts is not None:
                out.max_event_ms[name] = sequencer.clock.max_ts
        return out

    def _arrive(self, stream: str, line: dict[str, Any], out: LandingOutput) -> None:
        schema = self.schemas[stream]
        sequencer = self.streams[stream]
        ts = line[schema.timestamp or "ts"]
        if line.get("_kind") == "heartbeat":
            sequencer.heartbeat(ts)
            out.heartbeats.append(
                {
                    "stream": stream,
                    "source": line.get("source"),
                    "ts": to_timestamp(ts),
                    "received_at": to_timestamp(line.get("_received_ms")),
                }
            )
            return
        watermark = sequencer.clock.watermark
        verdict = sequencer.admit(line["source"], line["seq"], ts)
        if verdict is Verdict.DUPLICATE:
            out.duplicates[stream] = out.duplicates.get(stream, 0) + 1
        elif verdict is Verdict.ON_TIME:
            out.readings.setdefault(stream, []).append(_stored_reading(schema, line))
        else:
            reading = {c.name: line[c.name] for c in schema.columns}
            reading.update(source=line["source"], seq=line["seq"])
            out.late.append(
                {
                    "stream": stream,
                    "source": line["source"],
                    "seq": line["seq"],
                    "ts": to_timestamp(ts),
                    "watermark": to_timestamp(watermark),
                    "late_by_ms": watermark - ts,
                    "reading": orjson.dumps(reading).decode(),
                    "topic": line.get("_topic"),
                    "received_at": to_timestamp(line.get("_received_ms")),
                }
            )
