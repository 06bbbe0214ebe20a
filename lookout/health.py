"""Health records: each long-running part writes `<lakehouse>/_health/<part>.json`
(engine, ingest-<id>); the demo and the dashboard read them. The lakehouse may be a local
folder or an `s3://` prefix (`lookout.storage`); either way a record is replaced whole,
so a reader never sees half of one.

`problems` says in words why health is red (`[health]` in lookout.toml): a part down or
failing, too many late, duplicate or conflicting readings or quarantined payloads in
the last window of wall time, any reading quarantined by its stream's cap on live
keys, a stream's clock standing still while its readings arrive, the engine waiting
out a full or read-only disk (its record's `storage`). The engine's record carries
those recent figures (`RecentFigures`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from lookout.config import HealthConfig, S3Config
from lookout.storage import DEFAULT_S3, list_names, put_whole, read_whole

HEALTH_FOLDER = "_health"
# What an arriving reading of a stream turns out to be, as the engine counts them.
ARRIVALS = ("readings", "late", "duplicates", "conflicts", "capped")


def health_location(lakehouse: str, part: str) -> str:
    """Where `part` (`engine`, `ingest-0`, ...) keeps its health record."""
    return f"{str(lakehouse).rstrip('/')}/{HEALTH_FOLDER}/{part}.json"


def write_health(
    lakehouse: str, part: str, record: dict[str, Any], s3: S3Config = DEFAULT_S3
) -> None:
    """Replace `part`'s record in one rename (local) or one PUT (S3)."""
    put_whole(health_location(lakehouse, part), orjson.dumps(record), s3)


def read_health(lakehouse: str, part: str, s3: S3Config = DEFAULT_S3) -> dict[str, Any] | None:
    """The latest record `part` wrote, or None when it has written none yet."""
    data = read_whole(health_location(lakehouse, part), s3)
    try:
        return None if data is None else orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def health_parts(lakehouse: str, s3: S3Config = DEFAULT_S3) -> list[str]:
    """Names of the parts that wrote a record (`engine`, `ingest-0`, ...)."""
    folder = f"{str(lakehouse).rstrip('/')}/{HEALTH_FOLDER}"
    return [name[: -len(".json")] for name in list_names(folder, s3) if name.endswith(".json")]


def engine_running(record: dict[str, Any] | None, since_ms: int) -> bool:
    """Whether an engine record says its queries run, in a run started at or after
    `since_ms` (a record an earlier run left behind never counts)."""
    return bool(record and record.get("ready") and record.get("started_at_ms", 0) >= since_ms)


@dataclass
class _Clock:
    """Where a stream's clock last moved: its newest event time, when (wall clock), and
    the stream's arrivals counted then."""

    max_event_ms: int | None
    moved_at_ms: int
    arrived: int


class RecentFigures:
    """Running totals turned into what happened lately.

    The engine counts since it started; each health record it writes passes the totals
    here and carries their increase over the last `window_ms` of wall time, and for each
    stream how long its clock has stood still and how many readings arrived meanwhile."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self._samples: deque[tuple[int, dict[str, int]]] = deque()
        self._clocks: dict[str, _Clock] = {}

    def window(self, now_ms: int, totals: Mapping[str, int]) -> tuple[int, dict[str, int]]:
        """Record `totals` as of `now_ms`; returns the span covered (ms, at most a sample
        beyond `window_ms`; less while the engine is young) and each total's increase
        over it."""
        self._samples.append((now_ms, dict(totals)))
        # Keep the newest sample at or before the window's start: it covers it whole.
        while len(self._samples) > 2 and self._samples[1][0] <= now_ms - self.window_ms:
            self._samples.popleft()
        since_ms, before = self._samples[0]
        return now_ms - since_ms, {k: n - before.get(k, 0) for k, n in totals.items()}

    def clock(
        self, stream: str, now_ms: int, max_event_ms: int | None, arrived: int
    ) -> tuple[int, int]:
        """(ms since `stream`'s clock last moved, readings that arrived since), given
        its newest event time and its arrivals counted so far."""
        last = self._clocks.get(stream)
        moved = max_event_ms is not None and (
            last is None or last.max_event_ms is None or max_event_ms > last.max_event_ms
        )
        if last is None or moved:
            last = self._clocks[stream] = _Clock(max_event_ms, now_ms, arrived)
        return now_ms - last.moved_at_ms, arrived - last.arrived


@dataclass(frozen=True)
class Problem:
    """One reason health is red: whom it concerns (`engine`, `ingest-0`, `stream
    traffic`, `quarantine`), what crossed its limit in a word, and the sentence shown."""

    subject: str
    what: str
    text: str


def _percent(share: float) -> str:
    return f"{share * 100:.3g} %"


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def _stream_problems(
    stream: Mapping[str, Any], window_s: float, limits: HealthConfig
) -> list[Problem]:
    name = stream.get("stream", "?")
    subject = f"stream {name}"
    recent = stream.get("recent") or {}
    arrived = sum(recent.get(what, 0) for what in ARRIVALS)
    found = []
    for what, limit in (
        ("late", limits.max_late_share),
        ("duplicates", limits.max_duplicate_share),
        ("conflicts", limits.max_conflict_share),
    ):
        count = recent.get(what, 0)
        if count >= limits.min_events and count > limit * arrived:
            found.append(
                Problem(
                    subject,
                    what,
                    f"{subject}: {count:,} of the {arrived:,} readings that arrived in the "
                    f"last {window_s:.0f} s were {what} ({_percent(count / arrived)}; "
                    f"the limit is {_percent(limit)})",
                )
            )
    capped = recent.get("capped", 0)
    if capped:
        cap = stream.get("max_live_keys")
        found.append(
            Problem(
                subject,
                "key cap",
                f"{subject}: {capped:,} readings of new keys were quarantined in the last "
                f"{window_s:.0f} s: a rule reading it holds state for max_live_keys = "
                f"{cap if cap is not None else '?'} keys (the quarantine table names them)",
            )
        )
    still_s = stream.get("clock_still_ms", 0) / 1000
    while_still = stream.get("arrived_while_still", 0)
    max_event_ms = stream.get("max_event_ms")
    if still_s >= limits.clock_stall_seconds and while_still > 0 and arrived > 0:
        at = "" if max_event_ms is None else f" at {_utc(max_event_ms)}"
        found.append(
            Problem(
                subject,
                "clock stopped",
                f"{subject}: its clock (newest event time) has stood{at} for {still_s:.0f} s "
                f"while {while_still:,} readings arrived (the limit is "
                f"{limits.clock_stall_seconds:g} s)",
            )
        )
    return found


def _engine_problems(record: Mapping[str, Any], limits: HealthConfig, now_ms: int) -> list[Problem]:
    window_s = record.get("window_ms", 0) / 1000
    found = []
    storage = record.get("storage")
    if storage:
        failing_s = (now_ms - storage.get("since_ms", now_ms)) / 1000
        found.append(
            Problem(
                "engine",
                storage.get("problem", "storage"),
                f"engine: {storage.get('problem', 'storage failing')} at "
                f"{storage.get('path', '?')} for {failing_s:.0f} s: no batch runs until it "
                f"can write (the landing files wait, nothing is lost): "
                f"{storage.get('error', '')}",
            )
        )
    refused = (record.get("rules") or {}).get("rejected")
    if refused:
        errors = refused.get("errors") or ["?"]
        found.append(
            Problem(
                "engine",
                "rules refused",
                f"engine: the latest change of the rule files was refused ({len(errors)} "
                f"error(s), the first: {errors[0]}); it runs the last good rules",
            )
        )
    arrived = 0
    for stream in record.get("streams") or []:
        found += _stream_problems(stream, window_s, limits)
        arrived += sum((stream.get("recent") or {}).get(what, 0) for what in ARRIVALS)
    quarantined = record.get("recent_quarantined", 0)
    total = arrived + quarantined
    if quarantined >= limits.min_events and quarantined > limits.max_quarantine_share * total:
        found.append(
            Problem(
                "quarantine",
                "quarantine",
                f"quarantine: {quarantined:,} of the {total:,} readings and payloads that "
                f"arrived in the last {window_s:.0f} s were quarantined "
                f"({_percent(quarantined / total)}; the limit is "
                f"{_percent(limits.max_quarantine_share)})",
            )
        )
    return found


def _ingest_problems(part: str, record: Mapping[str, Any], now_ms: int) -> list[Problem]:
    found = []
    if not record.get("connected", True):
        found.append(Problem(part, "broker", f"{part} is not connected to the broker"))
    failing_since = record.get("landing_failing_since_ms") or 0
    if failing_since:
        found.append(
            Problem(
                part,
                "landing",
                f"{part} has failed to land readings for {(now_ms - failing_since) / 1000:.0f} s "
                f"(nothing is acknowledged meanwhile): {record.get('last_error', '')}",
            )
        )
    return found


def problems(
    records: Mapping[str, Mapping[str, Any] | None],
    limits: HealthConfig,
    down_after_s: float,
    now_ms: int,
) -> list[Problem]:
    """Why health is red (empty: it is not), from the parts' records by name: a part
    whose record is older than `down_after_s` is down (and nothing else of it is
    judged); then the engine's recent figures and each ingester's connection and
    landing against `limits`. A part without a record is not judged."""
    found: list[Problem] = []
    for part, record in records.items():
        if not record:
            continue
        age_s = (now_ms - record.get("updated_at_ms", 0)) / 1000
        if age_s > down_after_s:
            found.append(
                Problem(part, "down", f"{part} is down: its last report is {age_s:.0f} s old")
            )
        elif part == "engine":
            found += _engine_problems(record, limits, now_ms)
        else:
            found += _ingest_problems(part, record, now_ms)
    return found
