"""Detection quality of the rule library against the simulators' ground truth.

Replays simulator runs through the pure engine in arrival order (the model of the live
job, see `tests/quality/detection.py`) and checks the targets: with disorder within the
slack every planted episode is detected and nothing else alerts; with readings later
than the slack exactly the readings the truth calls late go to late readings. The
matching itself is checked to fail on missed episodes and stray alerts, and the
availability model against the engine's own emissions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from engine.core.pipeline import BatchResult, Pipeline
from engine.core.replay import arrival_table
from engine.core.runners import emitted_outputs
from ingest.validate import Validator, normalize_reading
from tests.quality.detection import (
    Evaluation,
    RunSpec,
    Score,
    SimRun,
    evaluate,
    late_truth,
    reference_due,
    replayed,
    rules_plan,
    score,
    simulate,
)

RATE = 5.0  # readings/s: enough for every episode, quick to replay
HOUR = 3600
KINDS = {
    "traffic": ("congestion", "silent_detector", "speeding", "accident"),
    "rfid": ("theft", "missing_item", "packing_group"),
}


def _run(
    kind: str, seed: int, disorder: str, slack_ms: int, heartbeats: bool = True
) -> tuple[SimRun, Evaluation, dict[str, Score]]:
    """Simulate one hour, replay it at ``slack_ms`` and score it."""
    sim, ev = replayed(RunSpec(kind, seed, HOUR, RATE, disorder, heartbeats), slack_ms)
    return sim, ev, score(sim, ev, reference_due(kind, seed, HOUR, RATE))


#: (seed, disorder model, a slack (ms) that covers it, heartbeats): bounded:D needs a
#: slack of D, blocks:SIZE one of SIZE; every model meets a different seed.
WITHIN_SLACK = [
    (1, "none", 1, True),
    (2, "bounded:2", 2000, False),
    (3, "blocks:5", 5000, True),
]


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize(("seed", "disorder", "slack_ms", "heartbeats"), WITHIN_SLACK)
def test_disorder_within_slack_detects_every_episode_and_nothing_else(
    kind: str, seed: int, disorder: str, slack_ms: int, heartbeats: bool
) -> None:
    _, ev, scores = _run(kind, seed, disorder, slack_ms, heartbeats)
    assert not ev.late
    for episode_type in KINDS[kind]:
        s = scores[episode_type]
        assert s.episodes >= 2, f"{episode_type}: too few episodes planted to score"
        assert (s.recall, s.precision) == (1.0, 1.0), (episode_type, s.missed)
    if kind == "rfid":
        exits = scores["authorised_exit"]
        assert exits.episodes >= 2 and exits.detected == 0  # no larceny alarm for any


@pytest.mark.parametrize(("kind", "heartbeats"), [("traffic", True), ("rfid", False)])
def test_readings_beyond_the_slack_are_exactly_the_late_ones(kind: str, heartbeats: bool) -> None:
    spec = RunSpec(kind, 3, HOUR, RATE, "bounded:1", heartbeats, 0.01, late_slack_s=2.0)
    sim = simulate(spec)
    ev = evaluate(rules_plan(kind, 2000), sim)
    expected = late_truth(sim, rules_plan(kind, 2000))
    assert len(expected) > 20
    assert ev.late_ids == expected
    assert sum(ev.late.values()) == len(expected)


def _without_readings(sim: SimRun, drop: Callable[[dict], bool]) -> SimRun:
    """``sim`` minus the reading messages whose payload ``drop`` selects."""
    kept = [m for m in sim.messages if not (m[1] == "reading" and drop(m[3]))]
    return dataclasses.replace(sim, messages=kept)


@pytest.mark.slow
def test_dropping_the_alerting_readings_lowers_recall() -> None:
    sim = simulate(RunSpec("rfid", 1, HOUR, RATE))
    due = reference_due("rfid", 1, HOUR, RATE)
    plan = rules_plan("rfid", 1)
    thefts = [e["tagid"] for e in sim.episodes("theft")]
    gone = _without_readings(sim, lambda p: p.get("tagid") in thefts[:2])
    s = score(gone, evaluate(plan, gone), due)["theft"]
    assert s.detected == s.episodes - 2 and s.recall < 1.0
    assert [e["tagid"] for e in s.missed] == thefts[:2]

    traffic = simulate(RunSpec("traffic", 1, HOUR, RATE))
    fast = _without_readings(traffic, lambda p: p.get("station") == 8 and p["speed"] > 36.1)
    due = reference_due("traffic", 1, HOUR, RATE)
    s = score(fast, evaluate(rules_plan("traffic", 1), fast), due)["speeding"]
    assert s.detected == s.episodes - 1
    assert [e["station"] for e in s.missed] == [8]


def test_stray_and_missing_alerts_are_counted() -> None:
    sim, ev, scores = _run("traffic", 1, "none", 1)
    first = sim.episodes("silent_detector")[0]
    mine = [a for a in ev.alerts if a.rule == "silent_detector" and a.available_at]
    dropped = Evaluation([a for a in ev.alerts if a not in mine[:1]], ev.late, ev.late_ids)
    assert mine[0].row["station"] == first["station"]
    s = score(sim, dropped, reference_due("traffic", 1, HOUR, RATE))["silent_detector"]
    assert s.detected == scores["silent_detector"].detected - 1 and s.missed == [first]
    stray = dataclasses.replace(mine[0], row={**mine[0].row, "station": 1})
    added = Evaluation([*ev.alerts, stray], ev.late, ev.late_ids)
    s = score(sim, added, reference_due("traffic", 1, HOUR, RATE))["silent_detector"]
    assert (s.alerts, s.false_alerts) == (len(mine) + 1, 1) and s.precision < 1.0


def _first(sim: SimRun, seconds: int) -> SimRun:
    """The messages of ``sim``'s first ``seconds`` (by arrival), as if the run ended there."""
    end = sim.start_ms + seconds * 1000
    return dataclasses.replace(sim, messages=[m for m in sim.messages if m[0] < end], end_ms=end)


#: (kind, readings/s, run length s, the part of it replayed s). One batch per reading
#: costs a few ms, so the fast lane replays fewer readings: traffic's first 20 minutes
#: at 1/s already raise every traffic alert (its layout needs the hour to be generated);
#: RFID partitions missed_shipping by tag, thousands of evaluators advanced per reading.
AVAILABILITY = [
    ("traffic", 1.0, HOUR, 1200),
    ("rfid", 2.0, 600, 600),
    pytest.param("traffic", RATE, HOUR, 1200, marks=pytest.mark.slow),
    pytest.param("rfid", RATE, 600, 600, marks=pytest.mark.slow),
]

#: The alert rules of each kind's library.
ALERTS = {"traffic": set(KINDS["traffic"]), "rfid": {"larceny", "missed_shipping"}}


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "rate", "duration", "replayed"), AVAILABILITY)
def test_availability_is_when_the_engine_emits(
    kind: str, rate: float, duration: int, replayed: int
) -> None:
    """The availability model against the engine itself: the pipeline advancing after
    every reading, each output noted with the arrival of the reading whose batch emitted
    it."""
    sim = simulate(RunSpec(kind, 4, duration, rate, "bounded:2", heartbeats=False))
    sim = _first(sim, replayed)
    plan = rules_plan(kind, 2000)
    ev = evaluate(plan, sim)
    # Every rule alerts, and some alert comes before the final drain.
    assert {a.rule for a in ev.alerts} == ALERTS[kind]
    assert any(a.available_at is not None for a in ev.alerts)
    validator = Validator(list(plan.sources()))
    readings = [
        (m[0], validator.route(m[2])[0], m[3])
        for m in sim.messages
        if m[1] == "reading" and validator.route(m[2])[0] is not None
    ]
    emitted: dict[tuple, int | None] = {}
    pipeline = Pipeline(plan)

    def note(step: BatchResult, at: int | None) -> None:
        for sink_rows in step.outputs:
            for _, o in emitted_outputs(sink_rows):
                emitted.setdefault((o.sink, o.ts, repr(o.row)), at)

    for arrival, schema, payload in readings:  # one batch per reading
        reading = normalize_reading(schema, payload)
        note(pipeline.process({schema.name: arrival_table(schema, [reading])}), arrival)
    note(pipeline.finish(), None)
    for a in ev.alerts:
        assert emitted[(a.rule, a.ts, repr(a.row))] == a.available_at, a
