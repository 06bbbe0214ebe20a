"""Detection quality: simulate, replay the rule library in arrival order, score against the truth.

Shared by `tests/quality/` and `benchmarks/detection_quality.py`.

The model of the live job is the pure engine replayed in arrival order: every message of
a simulator run goes, in the order it was sent, through ingest's `Validator` and one
`StreamSequencer` per stream (the live landing's judge: dedupe, then slack, heartbeats
moving event time); the on-time readings go through `engine.core.replay.run`, the engine
core the live job runs. `run` has no heartbeat input, so lateness is judged here, with
heartbeats, and only on-time readings are handed to it (its own sequencer then finds
nothing late: it sees the same readings without the heartbeats, so a lower watermark).

When an alert becomes available: the evaluator emits an output of event-time instant
`e` at the first `advance(w)` with `w > e`, and the live job advances every stage to its
source stream's slack watermark (max event time of the readings and heartbeats arrived so
far, minus the slack). So the alert is available at the arrival time of the first
message after which that watermark exceeds `e`. `e` is the output's `ts`, except under a
time `SLIDE d`, whose yield tuple is emitted when its slot closes (the slot's last ms).
An alert whose instant the watermark never passes before the run ends is never
available (live, it would come only with later input); replay's final drain at
END_OF_TIME produces it, so it is dropped here.
"""

from __future__ import annotations

import bisect
import random
import re
import shutil
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from engine.core.plan import ExtentWindow, OverWindow, Plan, SinkKind
from engine.core.replay import run
from engine.core.sequencer import StreamSequencer, Verdict
from ingest.validate import Validator
from rules.language.loader import RULES_DIR, load_rules
from simulators.common import parse_episodes
from simulators.disorder import DisorderModel, Faults, Message, arrange, messages
from simulators.rfid import RfidConfig, generate_rfid, rfid_sources
from simulators.rows import Block
from simulators.traffic import TrafficConfig, generate_traffic, traffic_sources
from simulators.truth import Truth

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, the simulators' file start

#: The rule files each simulator's readings are meant for (the CSV tables go along).
RULE_FILES = {"traffic": "traffic.sql", "rfid": "rfid.sql"}

#: Episode type -> the rule meant to detect it (``packing_group`` is the derived
#: stream ``packing_groups``: the library has no packing alert).
RULE_FOR = {
    "congestion": "congestion",
    "silent_detector": "silent_detector",
    "accident": "accident",
    "speeding": "speeding",
    "packing_group": "packing_groups",
    "theft": "larceny",
    "authorised_exit": "larceny",
    "missing_item": "missed_shipping",
}

#: Rule -> the episode kinds whose alerts it may raise (an alert matching none is a false
#: positive). An accident slows its station's traffic to ~8 m/s, so it is congestion too.
EXPLAINED_BY = {
    "congestion": ("congestion", "accident"),
    "silent_detector": ("silent_detector",),
    "accident": ("accident",),
    "speeding": ("speeding",),
    "larceny": ("theft",),
    "missed_shipping": ("missing_item",),
}

#: Negative controls: episodes that must raise no alert of their rule.
NEGATIVES = ("authorised_exit",)

MINUTE = 60_000


@dataclass(frozen=True)
class RunSpec:
    """One simulator run: which simulator, its seed and length, and how it arrives."""

    kind: str
    seed: int = 1
    duration_s: int = 3600
    rate: float = 20.0
    disorder: str = "none"
    heartbeats: bool = True
    late_fraction: float = 0.0
    late_slack_s: float = 2.0  # the slack the simulator's late readings exceed


@dataclass
class SimRun:
    """A simulator run in memory: its messages in arrival order and its ground truth."""

    spec: RunSpec
    messages: list[Message]
    truth: list[dict]
    start_ms: int
    end_ms: int

    def episodes(self, kind: str | None = None) -> list[dict]:
        """The planted episodes (of one kind)."""
        return [
            r for r in self.truth if r["type"] == "episode" and (kind is None or r["kind"] == kind)
        ]


class _RecordedTruth(Truth):
    """A ground truth kept in memory."""

    def __init__(self) -> None:
        super().__init__(None)
        self.records: list[dict] = []

    def record(self, rec: dict) -> None:
        super().record(rec)
        self.records.append(rec)


#: The traffic layout is for a run of this length (s): episodes at fixed offsets.
TRAFFIC_RUN_S = 3600


def traffic_config(rate: float) -> TrafficConfig:
    """Ten stations and one hour with every traffic episode planted two or three times:
    congestion (15 minutes each: the 15-minute average falls under 15 m/s after about 9),
    whole-station silences of 6-7 minutes (the library's silent_detector is per
    station), accidents and speeding."""
    return TrafficConfig(
        stations=10,
        rate=rate,
        congestion=parse_episodes("3@300+900,7@1500+900,10@2500+900", 0),
        silent=parse_episodes("5@600+360,9@1800+360,6@2900+400", 0),
        accident=parse_episodes("2@900+600,4@2400+600", 0),
        speeding=parse_episodes("1@300+300,8@1500+300,6@2000+300", 0),
    )


def rfid_config(rate: float) -> RfidConfig:
    """Four doors, six of each RFID episode (packing, theft, authorised exit, missing)
    spread evenly over the run (a missing item is due 30 minutes after its receiving
    read, so those planted in the run's second half are not due before it ends)."""
    return RfidConfig(doors=4, rate=rate, packing=6, theft=6, authorised_exit=6, missing=6)


@cache
def _generated(kind: str, seed: int, duration_s: int, rate: float) -> tuple[list[Block], list]:
    """The readings (event-time order, in blocks) and episode records of a run: they do not depend
    on the disorder, which draws from its own random stream."""
    truth = _RecordedTruth()
    rng = random.Random(f"{seed}:gen")
    end = START_MS + duration_s * 1000
    if kind == "traffic":
        if duration_s < TRAFFIC_RUN_S:
            raise ValueError(f"traffic runs last at least {TRAFFIC_RUN_S} s, not {duration_s}")
        readings = list(generate_traffic(traffic_config(rate), START_MS, end, rng, truth))
    else:
        readings = list(generate_rfid(rfid_config(rate), START_MS, end, rng, truth))
    return readings, truth.records


def simulate(spec: RunSpec) -> SimRun:
    """Run the simulator in process (as `lookout simulate` does, same random streams)."""
    readings, episodes = _generated(spec.kind, spec.seed, spec.duration_s, spec.rate)
    if spec.kind == "traffic":
        sources = traffic_sources(traffic_config(spec.rate))
    else:
        sources = rfid_sources(rfid_config(spec.rate))
    truth = _RecordedTruth()
    end = START_MS + spec.duration_s * 1000
    sent = list(
        messages(
            arrange(
                readings,
                DisorderModel.parse(spec.disorder),
                Faults(late=spec.late_fraction, slack_ms=round(spec.late_slack_s * 1000)),
                sources,
                random.Random(f"{spec.seed}:disorder"),
                truth,
                "ms",
                1000 if spec.heartbeats else None,
                START_MS,
                end,
            )
        )
    )
    return SimRun(spec, sent, [*episodes, *truth.records], START_MS, end)


_SLACK = re.compile(r"\bSLACK\s+\d+\s+\w+", re.IGNORECASE)


@cache
def rules_plan(kind: str, slack_ms: int) -> Plan:
    """The library's rules for ``kind`` with every source stream's SLACK set to
    ``slack_ms`` (a temporary copy of the rule file with its SLACK clause rewritten)."""
    with tempfile.TemporaryDirectory(prefix="lookout-quality-") as folder:
        for table in RULES_DIR.glob("*.csv"):  # reference tables, read relative to the file
            shutil.copy(table, folder)
        source = RULES_DIR / RULE_FILES[kind]
        text, n = _SLACK.subn(f"SLACK {slack_ms} MILLISECONDS", source.read_text())
        if n == 0:
            raise ValueError(f"{source}: no SLACK clause to rewrite")
        target = Path(folder) / source.name
        target.write_text(text)
        return load_rules([target]).plan


@dataclass(frozen=True)
class Alert:
    """An output of a rule: its sink, event time, emission instant, row and when (arrival
    ms) it became available; ``available_at`` None = never before the run's end."""

    rule: str
    ts: int
    instant: int
    row: dict[str, Any]
    available_at: int | None


@dataclass
class Evaluation:
    """What the rule library did with one run at one slack."""

    alerts: list[Alert]
    late: Counter[str] = field(default_factory=Counter)  # stream -> late readings
    late_ids: set[tuple[str, int]] = field(default_factory=set)
    outputs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _last_windows(plan: Plan) -> dict[str, tuple[str, OverWindow | ExtentWindow | None]]:
    """Every sink -> (its source stream, the last window on its path from there): that
    window's stage decides when the sink's rows are emitted (stateless queries after it
    pass rows on at once)."""
    producer = {q.sink.name: q for q in plan.queries}
    paths: dict[str, tuple[str, OverWindow | ExtentWindow | None]] = {}

    def path(stream: str) -> tuple[str, OverWindow | ExtentWindow | None]:
        if stream not in producer:
            return stream, None
        if stream not in paths:
            q = producer[stream]
            source, window = path(q.input)
            paths[stream] = (source, q.window or window)
        return paths[stream]

    for name in producer:
        path(name)
    return paths


def emission_instant(ts: int, window: OverWindow | ExtentWindow | None) -> int:
    """The event-time instant an output of time ``ts`` is emitted at: ``ts`` itself; under
    a time SLIDE the last ms of its slot (the yield tuple is known when the slot closes);
    for an extent ``[e - r, e)``, whose rows carry ``e``, its last instant ``e - 1``."""
    if isinstance(window, ExtentWindow):
        return ts - 1
    if window is not None and window.slide_ms:
        return (ts // window.slide_ms + 1) * window.slide_ms - 1
    return ts


def evaluate(plan: Plan, sim: SimRun) -> Evaluation:
    """Replay ``sim`` in arrival order through the engine under ``plan`` (module
    docstring): late readings, every rule output, and each alert's availability."""
    validator = Validator(list(plan.sources()))
    # Per stream, in arrival order: every element (heartbeats first within a message, as
    # ingest lands them) as (event time, heartbeat?, global position, reading), and per
    # message its arrival ms and how many elements the stream had after it.
    elements: dict[str, list[tuple[int, bool, int, dict[str, Any]]]] = defaultdict(list)
    arrivals: dict[str, list[int]] = defaultdict(list)
    counts: dict[str, list[int]] = defaultdict(list)
    result = Evaluation(alerts=[])
    for position, (arrival, kind, topic, payload) in enumerate(sim.messages):
        if kind == "malformed":
            continue  # quarantined by ingest: never reaches the engine
        checked = validator.validate(topic, orjson.dumps(payload), arrival)
        if checked.stream is None or checked.rejections:
            continue  # a topic no rule reads
        stream = checked.stream
        ts_col = plan.streams[stream].timestamp or "ts"
        mine = elements[stream]
        mine += [(beat[ts_col], True, position, beat) for beat in checked.heartbeats]
        mine += [(r[ts_col], False, position, r) for r in checked.readings]
        arrivals[stream].append(arrival)
        counts[stream].append(len(mine))
    # Each stream's elements judged at once: the sequencer judges a batch element by
    # element, so this is the same as judging every message as it arrives.
    on_time: list[tuple[int, str, dict[str, Any]]] = []
    watermarks: dict[str, list[int]] = {}
    for source in plan.sources():
        mine = elements.get(source.name, [])
        sequencer = StreamSequencer(source.slack_ms)
        start = sequencer.clock.watermark
        judged = sequencer.judge(
            np.array([e[0] for e in mine], dtype=np.int64),
            np.array([e[1] for e in mine], dtype=bool),
            [e[3].get("source", "") for e in mine],
            [""] * len(mine),
            np.array([0 if e[1] else e[3]["seq"] for e in mine], dtype=np.int64),
            np.zeros(len(mine), dtype=np.uint64),
        )
        for (_, _, position, reading), verdict in zip(mine, judged.verdicts, strict=True):
            if verdict == Verdict.ON_TIME:
                on_time.append((position, source.name, reading))
            elif verdict == Verdict.LATE:
                result.late[source.name] += 1
                result.late_ids.add((reading["source"], reading["seq"]))
        after = np.concatenate([[start], judged.after])  # after n elements: after[n]
        watermarks[source.name] = after[np.array(counts[source.name], dtype=np.int64)].tolist()
    on_time.sort(key=lambda e: e[0])  # streams interleaved in arrival order again
    replayed = run(plan, [(stream, reading) for _, stream, reading in on_time])
    if replayed.late:
        raise AssertionError(f"replay found {len(replayed.late)} late readings the judge did not")
    paths = _last_windows(plan)
    alert_sinks = {q.sink.name for q in plan.queries if q.sink.kind is SinkKind.ALERT}
    for out in replayed.outputs:
        result.outputs.setdefault(out.sink, []).append({**out.row, "_ts": out.ts})
        if out.sink not in alert_sinks:
            continue
        source, window = paths[out.sink]
        instant = emission_instant(out.ts, window)
        i = bisect.bisect_right(watermarks[source], instant)
        available = arrivals[source][i] if i < len(arrivals[source]) else None
        result.alerts.append(Alert(out.sink, out.ts, instant, out.row, available))
    return result


# --- matching -------------------------------------------------------------------------


def _interval(ep: dict, end_ms: int) -> tuple[int, int]:
    start = ep.get("start", ep.get("ts"))
    end = ep.get("end") if "end" in ep else ep.get("ts")
    return start, end_ms if end is None else end


def _matches(alert: Alert, ep: dict, end_ms: int) -> bool:
    """Whether ``alert`` reports episode ``ep``: same key (station, door, tag) and its
    event time inside the episode widened by the rule's window (an average over 15
    minutes stays low for up to 15 minutes after the slowdown; a silence is reported 5
    minutes after the last reading; a larceny check fires 5 s after the item)."""
    row, kind = alert.row, ep["kind"]
    start, end = _interval(ep, end_ms)
    if kind in ("congestion", "accident") and alert.rule == "congestion":
        return row["station"] == ep["station"] and start <= alert.ts <= end + 15 * MINUTE
    if kind == "silent_detector":
        return row["station"] == ep["station"] and start <= alert.ts <= end + 5 * MINUTE
    if kind == "accident":  # two vehicles stopped at one position: 4 reports, 30 s apart
        return (row["xway"], row["seg"], row["pos"]) == (
            ep["xway"],
            ep["seg"],
            ep["pos"],
        ) and start <= alert.ts <= end + 2 * MINUTE
    if kind == "speeding":
        return row["station"] == ep["station"] and start <= alert.ts <= end
    if kind in ("theft", "authorised_exit"):
        return (
            row["tagid"] == ep["tagid"]
            and str(row["door"]) == str(ep["door"])
            and start <= row["tagtime"] <= end
        )
    if kind == "missing_item":
        return row["tagid"] == ep["tagid"]
    raise ValueError(f"no matching rule for episode kind {kind!r} and rule {alert.rule!r}")


@dataclass
class Score:
    """One episode type's result: episodes scored, detected ones, the rule's available
    alerts and those matching no episode, the latency (ms) of each detected episode, the
    missed episodes, and the episodes not due before the run's end. For a negative
    control ``detected`` counts the episodes that raised an alert (all must not)."""

    episodes: int = 0
    detected: int = 0
    alerts: int = 0
    false_alerts: int = 0
    latencies: list[int] = field(default_factory=list)
    missed: list[dict] = field(default_factory=list)
    not_due: int = 0

    @property
    def recall(self) -> float | None:
        """Detected episodes / episodes (None without episodes)."""
        return self.detected / self.episodes if self.episodes else None

    @property
    def precision(self) -> float | None:
        """Alerts matching an episode / alerts (None without alerts)."""
        return (self.alerts - self.false_alerts) / self.alerts if self.alerts else None


#: An episode due this close to the run's end (or later) is not scored: no slack swept
#: here (at most 10 s) nor a heartbeat (1 s) could make its alert available in time.
NOT_DUE_MARGIN_MS = 60_000


def due_times(sim: SimRun, reference: Evaluation) -> dict[int, int]:
    """Episode index (in ``sim.episodes()``) -> its due time: the emission instant of the
    first alert its rule raises for it when every reading is on time (``reference``: the
    run in order), i.e. the earliest the rule can know. Episodes the rule never reports
    even then have no due time (they count as missed); negatives have none."""
    due: dict[int, int] = {}
    for i, ep in enumerate(sim.episodes()):
        if ep["kind"] in NEGATIVES or ep["kind"] == "packing_group":
            continue
        rule = RULE_FOR[ep["kind"]]
        instants = [
            a.instant for a in reference.alerts if a.rule == rule and _matches(a, ep, sim.end_ms)
        ]
        if instants:
            due[i] = min(instants)
    return due


@lru_cache(maxsize=8)
def replayed(spec: RunSpec, slack_ms: int) -> tuple[SimRun, Evaluation]:
    """``spec`` simulated and evaluated at ``slack_ms``, kept for the next caller (an
    in-order reference run is often a test's own run too): not to be modified."""
    sim = simulate(spec)
    return sim, evaluate(rules_plan(spec.kind, slack_ms), sim)


@cache
def reference_due(kind: str, seed: int, duration_s: int, rate: float) -> dict[int, int]:
    """:func:`due_times` of a run, from its in-order replay (1 ms slack, heartbeats)."""
    return due_times(*replayed(RunSpec(kind, seed, duration_s, rate), 1))


def score(sim: SimRun, ev: Evaluation, due: dict[int, int]) -> dict[str, Score]:
    """Precision, recall and latency per episode type (see :func:`_matches`).

    Only available alerts count. An episode due less than :data:`NOT_DUE_MARGIN_MS`
    before the run's end is left out (``not_due``), with the alerts matching only it.
    Latency: the earliest availability of a matching alert minus the due time.
    ``packing_group`` is scored on the ``packing_groups`` stream: a planted group is
    detected when its items are all there with one group number that no other item at
    the packing table has.
    """
    scores: dict[str, Score] = {}
    episodes = sim.episodes()
    cutoff = sim.end_ms - NOT_DUE_MARGIN_MS
    scored = [i for i, ep in enumerate(episodes) if due.get(i, 0) < cutoff]
    available = [a for a in ev.alerts if a.available_at is not None]
    for kind, rule in RULE_FOR.items():
        if kind == "packing_group":
            continue
        s = scores[kind] = Score()
        s.not_due = sum(1 for ep in episodes if ep["kind"] == kind) - sum(
            1 for i in scored if episodes[i]["kind"] == kind
        )
        mine = [a for a in available if a.rule == rule]
        for i in scored:
            ep = episodes[i]
            if ep["kind"] != kind:
                continue
            s.episodes += 1
            hits = [a for a in mine if _matches(a, ep, sim.end_ms)]
            if kind in NEGATIVES:
                s.detected += bool(hits)  # for a negative: episodes that (wrongly) alerted
            elif hits:
                s.detected += 1
                s.latencies.append(min(a.available_at or 0 for a in hits) - due[i])
            else:
                s.missed.append(ep)
        if kind in NEGATIVES:
            continue
        kinds = EXPLAINED_BY[rule]
        late_only = [episodes[i] for i in range(len(episodes)) if i not in scored]
        for a in mine:
            if any(ep["kind"] in kinds and _matches(a, ep, sim.end_ms) for ep in late_only):
                continue  # reports an episode not due in the run: neither true nor false
            s.alerts += 1
            s.false_alerts += not any(
                episodes[i]["kind"] in kinds and _matches(a, episodes[i], sim.end_ms)
                for i in scored
            )
    scores["packing_group"] = _packing_score(episodes, ev.outputs.get("packing_groups", []))
    return scores


def _packing_score(episodes: list[dict], rows: list[dict[str, Any]]) -> Score:
    """Planted packing groups against the packing table's (door 0) rows of packing_groups."""
    group_of: dict[str, int] = {}
    members: dict[int, set[str]] = defaultdict(set)
    for row in rows:
        if str(row["door"]) == "0":
            group_of[row["tagid"]] = row["group_no"]
            members[row["group_no"]].add(row["tagid"])
    planted = [set(ep["tagids"]) for ep in episodes if ep["kind"] == "packing_group"]
    s = Score(episodes=len(planted), alerts=len(members))
    for tags in planted:
        groups = {group_of.get(t) for t in tags}
        if len(groups) == 1 and None not in groups and members[groups.pop()] == tags:
            s.detected += 1
        else:
            s.missed.append({"kind": "packing_group", "tagids": sorted(tags)})
    s.false_alerts = sum(members[g] not in planted for g in members)
    return s


def late_truth(sim: SimRun, plan: Plan) -> set[tuple[str, int]]:
    """(source, seq) of the readings the simulator made late, on the streams ``plan``
    reads."""
    validator = Validator(list(plan.sources()))
    read = {
        (p["source"], p["seq"])
        for _, kind, topic, p in sim.messages
        if kind == "reading" and validator.route(topic)[0] is not None
    }
    return {(r["source"], r["seq"]) for r in sim.truth if r["type"] == "late"} & read
