"""A source stream's cap on live keys (`engine.core.keycap`).

* Against a brute force written from the rule: two rules read the stream, a RANGE frame
  per station (a station's key is live while it has a reading in the last ``t``) and a
  ROWS frame per lane (a lane, once seen, stays); at each on-time reading's arrival, with
  ``g`` its stream's watermark rounded down to 10 s (`STEP_MS`), a stage knows the keys of the
  readings admitted with event time from ``g - t`` on (RANGE) or of every one admitted
  (ROWS); a reading of a key a full stage does not know is quarantined. Hypothesis
  streams with ties, disorder within the slack and heartbeats, cut into random batches
  with restarts, on both runners: the same readings quarantined, for the same rule, and
  every other reading's outputs those of an uncapped pipeline fed the admitted readings
  only. No stage ever holds more keys than the cap.
* For every window form of the eviction suite: however the batches are cut, the same
  readings are quarantined and the same rows come out (the keys a stage holds at each
  step depend on the readings only).
"""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.keycap import STEP_MS, step_of
from engine.core.pipeline import HEARTBEAT, BatchResult, Pipeline
from engine.core.plan import END_OF_TIME, Plan
from engine.core.replay import arrival_table
from engine.core.runners import emitted_outputs
from engine.core.state import MemoryStore
from tests.engine.test_eviction import (
    compiled,
    keyed_over_rule,
    per_row_rule,
    per_row_runners,
)
from tests.examples import examples

SLACK = 2_000

reading = st.tuples(
    # A grid with exact ties, and a millisecond either side of it: a key may turn idle
    # exactly at a step.
    st.tuples(st.integers(0, 240), st.sampled_from([0, 0, -1, 1])).map(lambda t: t[0] * 250 + t[1]),
    st.integers(1, 12),  # station
    st.integers(1, 4),  # lane
    st.sampled_from([0.1, 3.0, 7.3, 11.0]),
    st.booleans(),  # a heartbeat (one in three)
)
stream = st.lists(st.tuples(reading, st.integers(0, 2_500)), min_size=5, max_size=90).map(
    lambda drawn: [r for r, _ in sorted(drawn, key=lambda d: d[0][0] + d[1])]
)


def arrivals(items: list[tuple]) -> list[dict[str, Any]]:
    """Readings in arrival order (late ones kept: the sequencer sets them aside)."""
    return [
        {
            "station": station,
            "lane": lane,
            "speed": speed,
            "name": "a",
            "ts": 1_000_000 + ts,
            "source": "s",
            "seq": seq,
            HEARTBEAT: beat and seq % 3 == 0,
        }
        for seq, (ts, station, lane, speed, beat) in enumerate(items)
    ]


def run(
    plan: Plan,
    rows: list[dict],
    cuts: list[int],
    restart: bool,
    caps: dict[str, int] | None,
    limit: int | None = None,
) -> tuple[list[tuple], list[tuple]]:
    """Outputs (sink, key, ts, source, seq, row) and capped readings (seq, reason) of
    ``rows`` cut at ``cuts``; every capped stage holds at most ``limit`` keys after each
    batch."""
    schema = plan.streams["traffic"]
    store = MemoryStore()
    pipeline = Pipeline(plan, store=store, caps=caps)
    results: list[BatchResult] = []
    for start, end in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        if restart:
            pipeline = Pipeline(plan, store=store, caps=caps)
        table = arrival_table(schema, rows[start:end])
        beats = pa.array([r[HEARTBEAT] for r in rows[start:end]], pa.bool_())
        table = table.set_column(table.column_names.index(HEARTBEAT), HEARTBEAT, beats)
        results.append(pipeline.process({"traffic": table}))
        pipeline.save()
        if limit is not None:
            for cap in pipeline.caps.values():
                for stage in cap.stages:
                    assert stage.runner.live_keys() <= limit, stage.stage.name
    results.append(pipeline.finish())
    outputs = [
        (o.sink, key, o.ts, o.source, o.seq, o.row)
        for result in results
        for emitted in result.outputs
        for key, o in emitted_outputs(emitted)
    ]
    capped = [(c.row["seq"], c.reason) for result in results for c in result.capped]
    return sorted(outputs, key=repr), capped


def brute_force(rows: list[dict], range_ms: int, cap: int) -> list[tuple[int, str]]:
    """(seq, rule) of each reading the cap quarantines, from the definition."""
    latest = None
    admitted: list[dict] = []
    capped = []
    for row in rows:
        before = -END_OF_TIME if latest is None else latest - SLACK
        latest = row["ts"] if latest is None else max(latest, row["ts"])
        if row[HEARTBEAT] or row["ts"] < before:
            continue
        since = step_of(before) - range_ms
        stations = {r["station"] for r in admitted if r["ts"] >= since}
        lanes = {r["lane"] for r in admitted}
        if row["station"] not in stations and len(stations) >= cap:
            capped.append((row["seq"], "near"))
        elif row["lane"] not in lanes and len(lanes) >= cap:
            capped.append((row["seq"], "lanes"))
        else:
            admitted.append(row)
    return capped


def cuts_of(seed: int, rows: list[dict]) -> list[int]:
    rng = random.Random(seed)
    return sorted(rng.sample(range(1, len(rows)), min(rng.randint(0, 10), len(rows) - 1)))


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=stream,
    range_ms=st.sampled_from([250, 1_000, 3_000]),
    cap=st.integers(1, 6),
    seed=st.integers(0, 10**6),
    restart=st.booleans(),
    rows_only=st.booleans(),
)
def test_the_cap_quarantines_what_its_definition_says(
    items, range_ms, cap, seed, restart, rows_only
) -> None:
    rows = arrivals(items)
    with per_row_runners(rows_only):
        plan = compiled(
            "CREATE STREAM near AS SELECT station, ts, count(*) OVER (PARTITION BY station "
            f"RANGE {range_ms} MILLISECONDS PRECEDING) AS n FROM traffic;\n"
            "CREATE STREAM lanes AS SELECT lane, ts, sum(speed) OVER (PARTITION BY lane "
            "ROWS 2 PRECEDING) AS n FROM traffic;\n"
        )
        outputs, capped = run(plan, rows, cuts_of(seed, rows), restart, {"traffic": cap}, cap)
        # A quarantined reading still moved its stream's clock: a heartbeat.
        beats = [{**r, HEARTBEAT: r[HEARTBEAT] or r["seq"] in dict(capped)} for r in rows]
        uncapped, _ = run(plan, beats, [], False, None)
    assert [(seq, reason.split(" rule ")[1].split(" ")[0]) for seq, reason in capped] == (
        brute_force(rows, range_ms, cap)
    )
    assert outputs == uncapped
    for seq, reason in capped:
        assert reason.startswith(f"stream traffic: max_live_keys = {cap} reached by rule ")
        row = next(r for r in rows if r["seq"] == seq)
        assert reason.endswith(f"new key station={row['station']}") or reason.endswith(
            f"new key lane={row['lane']}"
        )


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rule=st.one_of(keyed_over_rule, per_row_rule()),
    items=stream,
    cap=st.integers(1, 4),
    seed=st.integers(0, 10**6),
    restart=st.booleans(),
)
def test_the_batches_do_not_change_what_the_cap_quarantines(
    rule, items, cap, seed, restart
) -> None:
    rows = arrivals(items)
    plan = compiled(rule)
    whole = run(plan, rows, [], False, {"traffic": cap}, cap)
    assert run(plan, rows, cuts_of(seed, rows), restart, {"traffic": cap}, cap) == whole, rule


def one_key_plan(range_ms: int) -> Plan:
    return compiled(
        "CREATE STREAM near AS SELECT station, ts, count(*) OVER (PARTITION BY station "
        f"RANGE {range_ms} MILLISECONDS PRECEDING) AS n FROM traffic;\n"
    )


def readings(*given: tuple[int, int, bool]) -> list[dict[str, Any]]:
    """(ts after the epoch's first 1000 s, station, heartbeat) in arrival order."""
    return [
        {
            "station": s,
            "lane": 1,
            "speed": 1.0,
            "name": "a",
            "ts": 1_000_000 + t,
            "source": "s",
            "seq": seq,
            HEARTBEAT: beat,
        }
        for seq, (t, s, beat) in enumerate(given)
    ]


S = STEP_MS  # a step: the first after the readings' start


@pytest.mark.parametrize("rows_only", [False, True])
def test_a_key_idle_exactly_at_a_step_is_gone_there(rows_only: bool) -> None:
    """Station 1's last reading at S - 251, evaluated at S - 200, leaves a 250 ms frame
    at S, a step: a new station arriving before the next step finds room (cap 1)."""
    rows = readings(
        (S - 251, 1, False), (S + 1_800, 0, True), (S + 2_600, 0, True), (S + 700, 2, False)
    )
    with per_row_runners(rows_only):
        for cuts in ([], [2], [1], [1, 3], [2, 3]):
            assert run(one_key_plan(250), rows, cuts, False, {"traffic": 1}, 1)[1] == []


@pytest.mark.parametrize("rows_only", [False, True])
def test_a_key_evicted_after_a_step_counts_until_the_next(rows_only: bool) -> None:
    """Station 1's reading at S - 100 keeps it live at the step S (its frame reaches
    S + 150); the batch then advances to S + 600, evicting it; a new station arriving
    before the next step is still quarantined (cap 1), however the batches are cut."""
    rows = readings(
        (S - 100, 1, False), (S + 2_600, 0, True), (S + 700, 2, False), (2 * S + 2_100, 0, True)
    )
    with per_row_runners(rows_only):
        for cuts in ([], [2], [1], [1, 2], [3]):
            capped = run(one_key_plan(250), rows, cuts, False, {"traffic": 1}, 1)[1]
            assert [seq for seq, _ in capped] == [2], cuts


@pytest.mark.parametrize("rows_only", [False, True])
def test_a_key_evicted_after_a_step_is_still_known_until_the_next(rows_only: bool) -> None:
    """As above, but station 1 comes back: it was held at the step, so it is admitted."""
    rows = readings(
        (S - 100, 1, False), (S + 2_600, 0, True), (S + 700, 1, False), (2 * S + 2_100, 0, True)
    )
    with per_row_runners(rows_only):
        for cuts in ([], [2], [1], [1, 2], [3]):
            assert run(one_key_plan(250), rows, cuts, False, {"traffic": 1}, 1)[1] == [], cuts


def test_a_batch_of_many_readings_of_few_keys_is_admitted_without_deciding_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A backlog's batch: 600 readings of 3 stations over 60 s (six steps) under a cap of
    10 keys. More readings than the cap, fewer distinct keys: all are admitted without
    deciding reading by reading (where each step passed is an advance of every stage).
    Four stations under a cap of 3 are decided, and some quarantined."""
    rows = readings(*((i * 100, 1 + i % 3, False) for i in range(600)))
    plan = one_key_plan(250)
    whole, none = run(plan, rows, [], False, None)

    def decider(*_: object) -> None:
        raise AssertionError("decided reading by reading")

    with monkeypatch.context() as patched:
        patched.setattr("engine.core.keycap.KeyCap.decider", decider)
        assert run(plan, rows, [], False, {"traffic": 10}, 10) == (whole, none)
    four = readings(*((i * 100, 1 + i % 4, False) for i in range(600)))
    assert len(run(plan, four, [], False, {"traffic": 3}, 3)[1]) > 0


def test_an_incident_changed_before_and_after_a_step_is_one_update() -> None:
    """A batch that passes a step advances twice; an incident reported in both is the
    batch's change once, in its state after the batch (a second row of it failed the
    incidents table's merge)."""
    plan = compiled(
        "CREATE ALERT fast SEVERITY warning AS SELECT station, speed FROM traffic "
        "WHERE speed > 10;\n"
        # A keyed rule reading the stream: the cap steps.
        "CREATE STREAM counts AS SELECT station, count(*) OVER (PARTITION BY station "
        "ROWS 1 PRECEDING) AS n FROM traffic;\n"
    )
    rows = [
        {"station": 1, "lane": 1, "speed": 11.0, "name": "a", "ts": t, "source": "s", "seq": t}
        for t in range(5_000, 26_000, 1_000)
    ]
    pipeline = Pipeline(plan, store=MemoryStore(), caps={"traffic": 100})
    step = pipeline.process({"traffic": arrival_table(plan.streams["traffic"], rows)})
    assert [(u.alert, u.opened_at, u.last_report_at, u.reports) for u in step.incidents] == [
        ("fast", 5_000, 22_000, 18)
    ]
