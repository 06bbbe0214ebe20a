"""Shared pieces of the simulators: the reading record, time formats, episode specs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "EpisodeSpec",
    "Reading",
    "format_ts",
    "parse_episodes",
    "parse_start",
    "parse_ts",
]


@dataclass(slots=True)
class Reading:
    """One reading as generated, before disorder and serialisation.

    ``t`` is the source's true event time (epoch ms); the payload's ``ts`` is ``t`` plus
    the source's clock skew. ``fields`` holds the kind-specific payload fields in
    payload order (``ts``, ``source`` and ``seq`` are appended when serialised).
    """

    t: int
    source: str
    topic: str
    fields: dict = field(default_factory=dict)
    seq: int = 0


def parse_ts(value: Any) -> int:
    """Epoch ms of a payload's ``ts``, by ingest's parser: one for both ends of the wire.

    Imported on first use: ingest's module brings the engine's plan (and pandas), which
    a simulator that only writes readings need not load.
    """
    from ingest.validate import parse_timestamp

    return parse_timestamp(value)


def format_ts(ms: int, ts_format: str) -> int | str:
    """Render epoch milliseconds as the payload's ``ts``: an int, or ISO-8601 with offset."""
    if ts_format == "iso":
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return ms


def parse_start(text: str | None, default_ms: int) -> int:
    """Parse ``--start``: ISO-8601 (UTC if no offset), epoch ms digits, or None -> default."""
    if text is None:
        return default_ms
    if text.isdigit():
        return int(text)
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return round(dt.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class EpisodeSpec:
    """A planted episode at one place: ``key`` (station), optional ``lane``, and a time
    interval as offsets from the run's start in ms (``duration_ms`` 0 = until the end)."""

    key: int
    lane: int | None
    start_ms: int
    duration_ms: int

    def covers(self, offset_ms: int) -> bool:
        """True when ``offset_ms`` (ms since the run's start) lies inside the episode."""
        if offset_ms < self.start_ms:
            return False
        return self.duration_ms == 0 or offset_ms < self.start_ms + self.duration_ms


_SPEC = re.compile(r"^(\d+)(?::(\d+))?(?:@(\d+(?:\.\d+)?)(?:\+(\d+(?:\.\d+)?))?)?$")


def parse_episodes(text: str | None, default_duration_s: float) -> list[EpisodeSpec]:
    """Parse a list like ``"3,7@600+900,5:2@60"``: ``STATION[:LANE][@START[+DURATION]]``,
    times in seconds from the run's start; START defaults to 0 and DURATION to
    ``default_duration_s`` (0 = until the end of the run)."""
    if not text:
        return []
    specs = []
    for item in text.split(","):
        m = _SPEC.match(item.strip())
        if not m:
            raise ValueError(f"bad episode spec {item!r}: want STATION[:LANE][@START[+DURATION]]")
        key, lane, start, dur = m.groups()
        specs.append(
            EpisodeSpec(
                key=int(key),
                lane=int(lane) if lane else None,
                start_ms=round(float(start or 0) * 1000),
                duration_ms=round(float(dur if dur is not None else default_duration_s) * 1000),
            )
        )
    return specs
