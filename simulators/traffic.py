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
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from simulators.common import EpisodeSpec, Reading
from simulators.rows import Block, Field, Layout, Shape, assign_seq, row_dtype, slice_ms
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


def _speed_factor(t_ms: np.ndarray) -> np.ndarray:
    """Daily profile: a rush-hour dip in speed at 08:00 and 17:30 UTC."""
    h = (t_ms / 3_600_000) % 24
    return 1 - 0.12 * np.exp(-((h - 8) ** 2)) - 0.12 * np.exp(-(((h - 17.5) / 1.2) ** 2))


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
    """Reports of ``cfg.tracked`` vehicles driving the highway to its end, every 30 s;
    at the start they are spread along it, and one leaving is replaced by one entering.

    They slow to 8 m/s in a segment with an accident but never stop, so the only
    vehicles at the same position in consecutive reports are the crashed ones.
    """
    length = (cfg.stations + 1) * SEGMENT_M
    vids = iter(range(1, 1_000_000))
    # (next report, vid, position, cruising speed, lane); reports staggered over 30 s.
    # Spread along the highway, some pass every segment during any accident (all
    # entering at the start, they could all pass one before it began).
    cars = [
        (
            start_ms + rng.randrange(REPORT_EVERY_MS),
            next(vids),
            rng.uniform(0.0, length),
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


_LANE_CUM = np.cumsum(LANE_WEIGHTS)
_LANE_MEANS = np.array(LANE_MEANS)
LOOP_FIELDS = (("lane", "i1"), ("speed", "i4"), ("length", "i4"))
POSITION_FIELDS = (("vid", "i8"), ("seg", "i4"), ("pos", "i8"))
TRAFFIC_DTYPE = row_dtype(*LOOP_FIELDS, *POSITION_FIELDS)


def traffic_layout(cfg: TrafficConfig) -> Layout:
    """The run's topics: one per station (``lookout/traffic/<n>/readings``, source
    ``station-<n>``), then the position reports' when there are accidents."""
    stations = tuple(range(1, cfg.stations + 1))
    loop = Shape(
        (
            Field("station", "topic", table=stations),
            Field("lane", "int", "lane"),
            Field("speed", "centi", "speed"),
            Field("length", "centi", "length"),
        )
    )
    position = Shape(
        (
            Field("vid", "int", "vid"),
            Field("speed", "centi", "speed"),
            Field("xway", "const", value=0),
            Field("lane", "int", "lane"),
            Field("dir", "const", value=0),
            Field("seg", "int", "seg"),
            Field("pos", "int", "pos"),
        )
    )
    reports = (POSITIONS_TOPIC,) if cfg.accident else ()
    return Layout(
        names=(*(f"lookout/traffic/{s}/readings" for s in stations), *reports),
        sources=(*(f"station-{s}" for s in stations), *(POSITIONS_SOURCE for _ in reports)),
        shape_of=(*(0 for _ in stations), *(1 for _ in reports)),
        shapes=(loop, position),
    )


def _covering(specs: list[EpisodeSpec], station: np.ndarray, off: np.ndarray) -> np.ndarray:
    """Rows whose station has one of ``specs`` covering their offset (ms since start)."""
    hit = np.zeros(len(station), dtype=bool)
    for s in specs:
        inside = (station == s.key) & (off >= s.start_ms)
        if s.duration_ms:
            inside &= off < s.start_ms + s.duration_ms
        hit |= inside
    return hit


def _loop_rows(
    cfg: TrafficConfig,
    begin: int,
    end: int,
    start_ms: int,
    rng: np.random.Generator,
    truth: Truth,
    seqs: np.ndarray,
) -> np.ndarray:
    """Loop-detector readings of event time [begin, end) in event-time order (seq set)."""
    n = int(rng.poisson(cfg.rate * (end - begin) / 1000))
    t = begin + np.floor(np.sort(rng.random(n)) * (end - begin)).astype(np.int64)
    station = rng.integers(1, cfg.stations + 1, n)
    hour = (t / 3_600_000) % 24
    night = (hour < 5) | (hour >= 22)
    lorry = rng.random(n) < np.where(night, 0.3, 0.12)
    lane = np.where(
        lorry,
        np.where(rng.random(n) < 0.4, 4, 5),
        np.minimum(np.searchsorted(_LANE_CUM, rng.random(n), side="right"), 4) + 1,
    )
    z = rng.standard_normal(n)
    length = np.where(lorry, np.clip(16.5 + 2.0 * z, 13.0, 20.0), np.clip(4.6 + 0.5 * z, 3.0, 7.5))
    mean = np.where(lorry, 24.0, _LANE_MEANS[lane - 1])
    if cfg.profile == "daily":
        mean = mean * _speed_factor(t)
    z = rng.standard_normal(n)
    speed = np.clip(mean + 2.5 * z, FREE_FLOW_MIN, SPEED_LIMIT - 0.6)
    off = t - start_ms
    congested = _covering(cfg.congestion, station, off)
    speed = np.where(congested, np.clip(7.0 + 2.0 * z, 1.0, 13.0), speed)
    crashed = _covering(cfg.accident, station, off)
    speed = np.where(crashed, np.clip(8.0 + 3.0 * z, 0.5, 14.0), speed)
    speeding = _covering(cfg.speeding, station, off) & (rng.random(n) < 0.1)
    speed = np.where(speeding, rng.uniform(40.0, 50.0, n), speed)
    # A silent detector's vehicles pass unseen.
    silent = np.zeros(n, dtype=bool)
    for s in cfg.silent:
        silent |= _covering([s], station, off) & ((lane == s.lane) if s.lane else True)
    seen = ~silent
    rows = np.zeros(int(seen.sum()), dtype=TRAFFIC_DTYPE)
    rows["t"] = t[seen]
    rows["topic"] = station[seen] - 1
    rows["lane"] = lane[seen]
    rows["speed"] = np.rint(speed[seen] * 100)
    rows["length"] = np.rint(length[seen] * 100)
    rows["seq"] = assign_seq(rows["topic"], seqs)
    for i in np.flatnonzero(speeding[seen]).tolist():
        row = rows[i]
        truth.record(
            {
                "type": "speeding",
                "source": f"station-{int(row['topic']) + 1}",
                "seq": int(row["seq"]),
                "station": int(row["topic"]) + 1,
                "speed": int(row["speed"]) / 100,
            }
        )
    return rows


def _report_rows(reports: list[Reading], topic: int, seqs: np.ndarray) -> np.ndarray:
    rows = np.zeros(len(reports), dtype=TRAFFIC_DTYPE)
    if reports:
        rows["t"] = [r.t for r in reports]
        rows["topic"] = topic
        for name in ("vid", "lane", "seg", "pos"):
            rows[name] = [r.fields[name] for r in reports]
        rows["speed"] = np.rint(np.array([r.fields["speed"] for r in reports]) * 100)
        rows["seq"] = assign_seq(rows["topic"], seqs)
    return rows


def generate_traffic(
    cfg: TrafficConfig, start_ms: int, end_ms: int | None, rng: random.Random, truth: Truth
) -> Iterator[Block]:
    """Yield every reading of the run in event-time order, in blocks of
    :func:`slice_ms`; record the planted episodes.

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
    layout = traffic_layout(cfg)
    gen = np.random.default_rng(rng.getrandbits(128))
    seqs = np.zeros(len(layout.names), dtype=np.int64)
    reports: Iterator[Reading] = iter(())
    if cfg.accident:
        tracked = _tracked_reports(cfg, start_ms, end_ms, rng)
        crashed = [_position_reports(s, i, start_ms, end_ms) for i, s in enumerate(cfg.accident)]
        reports = heapq.merge(tracked, *crashed, key=lambda r: r.t)
    report = next(reports, None)
    step = slice_ms(cfg.rate)
    begin = start_ms
    while end_ms is None or begin < end_ms:
        end = begin + step if end_ms is None else min(begin + step, end_ms)
        rows = _loop_rows(cfg, begin, end, start_ms, gen, truth, seqs)
        due = []
        while report is not None and report.t < end:
            due.append(report)
            report = next(reports, None)
        if due:
            rows = np.concatenate([rows, _report_rows(due, len(layout.names) - 1, seqs)])
            rows = rows[np.argsort(rows["t"], kind="stable")]
        yield Block(rows, end, layout)
        begin = end
