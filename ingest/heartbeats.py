"""Heartbeats ingest emits for a silent stream, from a bounded-delay assumption.

Event time in the engine only moves when something arrives: a stream whose
sources fall silent leaves its windows open and its expirations unfired. A source can
publish heartbeats itself; when it does not, `lookout ingest --heartbeat-after S` makes
ingest do it under one assumption, stated here once:

    a reading reaches ingest at most S seconds (wall time) after the moment its
    source's event clock read its timestamp, and event clocks run at wall-clock pace.

Then, if the highest event time seen on a stream is T and the stream has been silent
for E >= S seconds of wall time, every reading still to come has an event time of at
least T + E - S, and ingest may land a heartbeat at that time. The first heartbeat
comes after S seconds of silence at exactly T; then one at most every `every_ms`, each
later than the one before. Nothing is emitted for a stream ingest has not yet heard
from (after a restart, T is unknown until the first reading).

With a shared subscription each ingester sees only its share of a stream, so its T may
be behind the stream's true maximum; its heartbeats are then behind too, which is safe
(a heartbeat too early only holds event time back).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Heard:
    max_event_ms: int
    last_heard_ms: int
    last_beat_ms: int | None = None
    last_beat_wall_ms: int = 0


class SilenceHeartbeats:
    """Tracks per stream the highest event time and when it was last heard from."""

    def __init__(self, after_ms: int, every_ms: int = 1000) -> None:
        if after_ms <= 0:
            raise ValueError("heartbeat-after must be positive")
        self.after_ms = after_ms
        self.every_ms = every_ms
        self._streams: dict[str, _Heard] = {}

    def observe(self, stream: str, event_ms: int, wall_ms: int) -> None:
        """A reading or heartbeat of `stream` with timestamp `event_ms` arrived at `wall_ms`."""
        heard = self._streams.get(stream)
        if heard is None:
            self._streams[stream] = _Heard(event_ms, wall_ms)
            return
        heard.max_event_ms = max(heard.max_event_ms, event_ms)
        heard.last_heard_ms = max(heard.last_heard_ms, wall_ms)

    def due(self, wall_ms: int) -> list[tuple[str, int]]:
        """(stream, heartbeat event time) for each stream owed a heartbeat at `wall_ms`."""
        beats = []
        for stream, heard in self._streams.items():
            silence = wall_ms - heard.last_heard_ms
            if silence < self.after_ms or wall_ms - heard.last_beat_wall_ms < self.every_ms:
                continue
            ts = heard.max_event_ms + silence - self.after_ms
            if heard.last_beat_ms is not None and ts <= heard.last_beat_ms:
                continue
            heard.last_beat_ms, heard.last_beat_wall_ms = ts, wall_ms
            beats.append((stream, ts))
        return beats
