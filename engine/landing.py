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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from engine.core.plan import StreamSchema

# The judging itself (dedupe, then slack) is shared with replay; the names stay public here.
from engine.core.sequencer import DEDUPE_HORIZON_MS as DEDUPE_HORIZON_MS
from engine.core.sequencer import StreamSequencer, Verdict
from engine.tables import to_timestamp


@dataclass
class LandingOutput:
    """Rows for each table from one batch of landed lines, and counts for health.
    A reading's timestamps (its own, `received_at`, `arrival_watermark`) are epoch ms,
    as :func:`engine.tables.ms_table` takes them: a batch can hold many thousands."""

    readings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    late: list[dict[str, Any]] = field(default_factory=list)
    heartbeats: list[dict[str, Any]] = field(default_factory=list)
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    max_event_ms: dict[str, int] = field(default_factory=dict)


def _stored_reading(
    schema: StreamSchema, line: Mapping[str, Any], watermark: int
) -> dict[str, Any]:
    row = {c.name: line[c.name] for c in schema.columns}
    row.update(
        source=line["source"],
        seq=line["seq"],
        topic=line.get("_topic"),
        received_at=line.get("_received_ms"),
        arrival_watermark=watermark,
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
                        "payload_bytes": record.get("payload_bytes"),
                        "payload_sha256": record.get("payload_sha256"),
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
            # The clock after this reading: every reading still to come is at or above it.
            stamp = sequencer.clock.watermark
            out.readings.setdefault(stream, []).append(_stored_reading(schema, line, stamp))
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
