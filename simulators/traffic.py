"""Highway traffic: loop-detector readings after the PIPES running example (section 2.1).

A highway with ``stations`` measuring stations, five lanes each, one detector per lane.
Each vehicle passing a detector yields a reading ``station, lane, speed`` (m/s),
``length`` (m), ``ts``, ``source`` (``station-<n>``), ``seq``. Vehicles arrive as a
Poisson process of ``rate`` readings per second of event time, spread evenly over the
stations. Normal traffic runs at highway speeds (lane means 25-32 m/s, a rush-hour dip
of at most 12 % at 08:00 and 17:30 UTC with ``profile="daily"``), never above
``SPEED_LIMIT`` nor below ``FREE_FLOW_MIN``; lorries (13-20 m) keep to lanes 4-5 and
are commoner at night.

Planted episodes (offsets from the run's start, see :func:`simulators.common.parse_episodes`):

- congestion at a station: speeds N(7, 2) m/s, clipped to 1-13 m/s;
- silent detector: a station's lane (or every lane) reports nothing; the station
  still sends heartbeats;
- accident: two vehicles stop at the same position in the station's segment; they send
  Linear Road style position reports every 30 s (``vid, speed, xway, lane, dir, seg,
  pos``; source ``xway-0``, topic ``lookout/positions/0/readings``) from two minutes
  before until two minutes after; traffic at the station slows to N(8, 3) m/s; with
  accidents, ``tracked`` other vehicles also report every 30 s as they drive through
  (slowing to 8 m/s past the accident, never stopping);
- speeding: 10 % of the station's vehicles drive at 40-50 m/s; each such reading is in
  the ground truth as a ``speeding`` record.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from simulators.common import EpisodeSpec, Reading, SeqCounter
from simulators.truth import Truth

SPEED_LIMIT = 36.1  # m/s (130 km/h); normal traffic stays below it
# Free-flowing readings never dip under this, so that no window of normal traffic, not
# even the first reading of a run, averages below the PIPES 15 m/s congestion threshold.
FREE_FLOW_MIN = 16.5
LANE_MEANS = (32.0, 30.5, 29.0, 27.0, 25.0)
LANE_WEIGHTS = (0.22, 0.24, 0.22, 0.18, 0.14)
SEGMENT_M = 1609  # one mile, as the Linear Road segment
REPORT_EVERY_MS = 30_000
POSITIONS_SOURCE = "xway-0"
POSITIONS_TOPIC = "lookout/positions/0/readings"


@dataclass
class TrafficConfig:
    """What to simulate: the highway, its volume and the planted episodes."""

    stations: int = 10
    rate: float = 200.0
    profile: str = "daily"
    congestion: list[EpisodeSpec] = field(default_factory=list)
    silent: list[EpisodeSpec] = field(default_factory=list)
    accident: list[EpisodeSpec] = field(default_factory=list)
    speeding: list[EpisodeSpec] = field(default_factory=list)
    tracked: int = 20  # vehicles sending position reports besides the crashed ones


def traffic_sources(cfg: TrafficConfig) -> dict[str, str]:
    """Every source id of the run mapped to its kind (for heartbeat topics)."""
    sources = {f"station-{s}": "traffic" for s in range(1, cfg.stations + 1)}
    if cfg.accident:
        sources[POSITIONS_SOURCE] = "positions"
    return sources


def _speed_factor(t_ms: int) -> float:
    """Daily profile: a rush-hour dip in speed at 08:00 and 17:30 UTC."""
    h = (t_ms / 3_600_000) % 24
    return 1 - 0.12 * math.exp(-((h - 8) ** 2)) - 0.12 * math.exp(-(((h - 17.5) / 1.2) ** 2))


def _interval(spec: EpisodeSpec, start_ms: int) -> tuple[int, int | None]:
    begin = start_ms + spec.start_ms
    return begin, (begin + spec.duration_ms if spec.duration_ms else None)


def _position_reports(
    spec: EpisodeSpec, index: int, start_ms: int, end_ms: int | None
) -> Iterator[Reading]:
    """Reports of the two crashed vehicles: approach, stand still, drive off."""
    begin, stop_end = _interval(spec, start_ms)
    pos = spec.key * SEGMENT_M + 500
    lane = spec.lane or 1
    t = begin - 4 * REPORT_EVERY_MS
    leave = stop_end + 4 * REPORT_EVERY_MS if stop_end is not None else None
    while (leave is None or t <= leave) and (end_ms is None or t < end_ms):
        if t < begin:
            speed, p = 28.0, pos - 28.0 * (begin - t) / 1000
        elif stop_end is None or t < stop_end:
            speed, p = 0.0, pos
        else:
            speed, p = 28.0, pos + 28.0 * (t - stop_end) / 1000
        if t >= start_ms:
            for k in range(2):
                vid = 1_000_000 + 2 * index + k
                yield _report(t, vid, speed, lane, p)
        t += REPORT_EVERY_MS


def _report(t: int, vid: int, speed: float, lane: int, pos: float) -> Reading:
    """A Linear Road style position report (expressway 0, direction 0)."""
    fields = {
        "vid": vid,
        "speed": round(speed, 2),
        "xway": 0,
        "lane": lane,
        "dir": 0,
        "seg": int(pos // SEGMENT_M),
        "pos": int(pos),
    }
    return Reading(t, POSITIONS_SOURCE, POSITIONS_TOPIC, fields)


def _tracked_reports(
    cfg: TrafficConfig, start_ms: int, end_ms: int | None, rng: random.Random
) -> Iterator[Reading]:
    """Reports of ``cfg.tracked`` vehicles driving the highway end to end, every 30 s.

    They slow to 8 m/s in a segment with an accident but never stop, so the only
    vehicles at the same position in consecutive reports are the crashed ones.
    """
    length = (cfg.stations + 1) * SEGMENT_M
    vids = iter(range(1, 1_000_000))
    # (next report, vid, position, cruising speed, lane); entries staggered over 30 s.
    cars = [
        (
            start_ms + rng.randrange(REPORT_EVERY_MS),
            next(vids),
            0.0,
            rng.gauss(28.0, 2.0),
            rng.randint(1, 5),
        )
        for _ in range(cfg.tracked)
    ]
    heapq.heapify(cars)
    while cars:
        t, vid, pos, cruise, lane = heapq.heappop(cars)
        if end_ms is not None and t >= end_ms:
            return
        seg = int(pos // SEGMENT_M)
        slow = any(a.key == seg and a.covers(t - start_ms) for a in cfg.accident)
        speed = 8.0 if slow else cruise
        yield _report(t, vid, speed, lane, pos)
        pos += speed * REPORT_EVERY_MS / 1000
        if pos >= length:  # off the highway: a new vehicle enters in its place
            vid, pos, cruise, lane = next(vids), 0.0, rng.gauss(28.0, 2.0), rng.randint(1, 5)
        heapq.heappush(cars, (t + REPORT_EVERY_MS, vid, pos, cruise, lane))


def _loop_readings(
    cfg: TrafficConfig,
    start_ms: int,
    end_ms: int | None,
    rng: random.Random,
    truth: Truth,
    seqs: SeqCounter,
) -> Iterator[Reading]:
    """Loop-detector readings in event-time order (seq assigned here, per station)."""
    mean_gap_ms = 1000.0 / cfg.rate
    t = float(start_ms)
    n = cfg.stations
    lanes = (1, 2, 3, 4, 5)
    while True:
        t += rng.expovariate(1.0) * mean_gap_ms
        ti = int(t)
        if end_ms is not None and ti >= end_ms:
            return
        off = ti - start_ms
        station = rng.randrange(n) + 1
        hour = (ti / 3_600_000) % 24
        night = hour < 5 or hour >= 22
        if rng.random() < (0.3 if night else 0.12):
            lane = 4 if rng.random() < 0.4 else 5
            length = min(max(rng.gauss(16.5, 2.0), 13.0), 20.0)
            mean = 24.0
        else:
            lane = rng.choices(lanes, LANE_WEIGHTS)[0]
            length = min(max(rng.gauss(4.6, 0.5), 3.0), 7.5)
            mean = LANE_MEANS[lane - 1]
        if any(s.key == station and (s.lane in (None, lane)) and s.covers(off) for s in cfg.silent):
            continue  # the detector is dead: the vehicle passes unseen
        if any(s.key == station and s.covers(off) for s in cfg.accident):
            speed = min(max(rng.gauss(8.0, 3.0), 0.5), 14.0)
        elif any(s.key == station and s.covers(off) for s in cfg.congestion):
            speed = min(max(rng.gauss(7.0, 2.0), 1.0), 13.0)
        else:
            if cfg.profile == "daily":
                mean *= _speed_factor(ti)
            speed = min(max(rng.gauss(mean, 2.5), FREE_FLOW_MIN), SPEED_LIMIT - 0.6)
        source = f"station-{station}"
        seq = seqs.next(source)
        if any(s.key == station and s.covers(off) for s in cfg.speeding) and rng.random() < 0.1:
            speed = rng.uniform(40.0, 50.0)
            truth.record(
                {
                    "type": "speeding",
                    "source": source,
                    "seq": seq,
                    "station": station,
                    "speed": round(speed, 2),
                }
            )
        yield Reading(
            ti,
            source,
            f"lookout/traffic/{station}/readings",
            {
                "station": station,
                "lane": lane,
                "speed": round(speed, 2),
                "length": round(length, 2),
            },
            seq,
        )


def generate_traffic(
    cfg: TrafficConfig, start_ms: int, end_ms: int | None, rng: random.Random, truth: Truth
) -> Iterator[Reading]:
    """Yield every reading of the run in event-time order; record the planted episodes.

    ``end_ms`` None runs forever.
    """
    for kind, specs in (
        ("congestion", cfg.congestion),
        ("silent_detector", cfg.silent),
        ("accident", cfg.accident),
        ("speeding", cfg.speeding),
    ):
        for i, spec in enumerate(specs):
            if not 1 <= spec.key <= cfg.stations:
                raise ValueError(f"{kind}: station {spec.key} is not in 1..{cfg.stations}")
            begin, end = _interval(spec, start_ms)
            rec = {"type": "episode", "kind": kind, "station": spec.key, "start": begin, "end": end}
            if kind == "silent_detector":
                rec["lane"] = spec.lane
            if kind == "accident":
                rec.update(
                    vids=[1_000_000 + 2 * i, 1_000_001 + 2 * i],
                    xway=0,
                    seg=spec.key,
                    pos=spec.key * SEGMENT_M + 500,
                )
            truth.record(rec)
    seqs = SeqCounter()
    loops = _loop_readings(cfg, start_ms, end_ms, rng, truth, seqs)
    if not cfg.accident:
        yield from loops
        return
    reports = [_position_reports(s, i, start_ms, end_ms) for i, s in enumerate(cfg.accident)]
    tracked = _tracked_reports(cfg, start_ms, end_ms, rng)
    for r in heapq.merge(loops, tracked, *reports, key=lambda r: r.t):
        if r.source == POSITIONS_SOURCE:
            r.seq = seqs.next(r.source)
        yield r
