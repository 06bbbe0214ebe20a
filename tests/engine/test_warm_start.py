"""Warm start: rules added or edited part-way through a stream start with their windows
filled from the stored readings, and from then on emit exactly what they would have
emitted had they always run; the rules left alone carry on untouched. So does a stage
whose runner changed with an upgrade (per row, then per column): the state the other
runner saved is dropped, and the stage filled again.

The oracle is the whole stream run from the start by one pipeline over the new rules;
the live side runs the old rules, writes each batch's accepted readings to a readings
Delta table as the engine does, then resumes the same store with the new rules.
"""

from __future__ import annotations

import math
import pickle
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.core.planner.runners as planner
from engine.core.columnar.expiry import NewestExpiryRunner
from engine.core.key_index import KEY_INDEX, KEY_STATE
from engine.core.pipeline import EDITED, NEW, Pipeline
from engine.core.plan import Plan
from engine.core.replay import arrival_table
from engine.core.runners import SEQ, TS, RowRunner, SinkRows
from engine.core.state import MemoryStore
from engine.landed_files import RECEIVED_MS, TOPIC
from engine.outputs import readings_rows
from engine.tables import readings_table
from engine.warm_start import reach_ms, warm_start
from rules.language.loader import load_rules
from tests.rules.helpers import TRAFFIC

BASE = {
    "speed": "CREATE STREAM speed AS SELECT station, ts, "
    "avg(speed) OVER (PARTITION BY station ROWS 3 PRECEDING) AS v FROM traffic;",
    "volume": "CREATE STREAM volume AS SELECT station, ts, "
    "count(*) OVER (PARTITION BY station RANGE 1 MINUTE PRECEDING) AS n FROM traffic;",
}
ADDED = {
    # New: a time window, an alert on a derived stream (its input's stage runs too),
    # and an extent.
    "busy": "CREATE STREAM busy AS SELECT station, ts, "
    "count(*) OVER (PARTITION BY station RANGE 2 MINUTES PRECEDING) AS n FROM traffic;",
    "slow": "CREATE ALERT slow SEVERITY warning AS SELECT station, ts, v FROM speed WHERE v < 40;",
    "flow": "CREATE STREAM flow AS SELECT station, count(*) AS n FROM traffic "
    "[RANGE 1 MINUTE SLIDE 30 SECONDS] GROUP BY station;",
    # Edited: its old state is dropped and filled again.
    "volume": BASE["volume"].replace("1 MINUTE", "90 SECONDS"),
}
NEW_RULES = {**BASE, **ADDED}
START = 1_772_431_200_000


def plan_of(tmp_path: Path, name: str, rules: dict[str, str]) -> Plan:
    path = tmp_path / f"{name}.sql"
    path.write_text(TRAFFIC + "\n".join(rules.values()))
    return load_rules([path]).plan


def batches(seed: int, n: int, per_batch: int) -> list[list[dict[str, Any]]]:
    """Readings of four stations, a second apart with jitter within the slack, cut into
    batches in arrival order."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ts = START + i * 1000 + rng.randint(-1500, 0)
        rows.append(
            {
                "station": rng.randint(1, 4),
                "lane": 1,
                "speed": float(rng.randint(20, 90)),
                "length": 4.0,
                "ts": ts,
                "source": f"s{i % 3}",
                "seq": i,
            }
        )
    return [rows[i : i + per_batch] for i in range(0, n, per_batch)]


def rows_of(
    outputs: Iterable[SinkRows], sink: str, since: int | None = None, numbered: bool = True
) -> list[tuple]:
    """The rows emitted to `sink` (from `since` on), sorted; without their output
    numbers unless `numbered`."""
    found = []
    for emitted in outputs:
        if emitted.sink != sink:
            continue
        for row in emitted.table.to_pylist():
            if since is not None and row[TS] < since:
                continue
            found.append(
                tuple(
                    (k, round(v, 9) if isinstance(v, float) and math.isfinite(v) else v)
                    for k, v in sorted(row.items())
                    if numbered or k != SEQ
                )
            )
    return sorted(found, key=repr)


def arrivals(plan: Plan, batch: list[dict[str, Any]]) -> dict[str, pa.Table]:
    """A batch as the engine's arrivals: with the topic and time of receipt ingest adds."""
    table = arrival_table(plan.streams["traffic"], batch)
    table = table.append_column(TOPIC, pa.array(["lookout/traffic/1/readings"] * len(batch)))
    return {"traffic": table.append_column(RECEIVED_MS, pa.array([START] * len(batch)))}


def store_readings(lake: Path, plan: Plan, readings: dict[str, pa.Table]) -> None:
    for stream, table in readings.items():
        if table.num_rows:
            rows = readings_rows(plan.streams[stream], table)
            write_deltalake(str(lake / readings_table(stream)), rows, mode="append")


def a_pipeline(plan: Plan, store: MemoryStore) -> Pipeline:
    return Pipeline(plan, store=store)


def run_and_deploy(
    tmp_path: Path,
    seed: int,
    n: int,
    per_batch: int,
    deploy: int,
    backfill_ms: int,
    old_rules: dict[str, str] = BASE,
    new_rules: dict[str, str] = NEW_RULES,
    old_pipeline: Callable[[Plan, MemoryStore], Pipeline] = a_pipeline,
) -> dict[str, Any]:
    """The new rules run over every batch from the start (``expected``); and the old
    ones (their pipeline built by ``old_pipeline``) over the batches before ``deploy``,
    then the new ones resumed on their store, warm started, over the rest."""
    old, new = plan_of(tmp_path, "old", old_rules), plan_of(tmp_path, "new", new_rules)
    cut = batches(seed, n, per_batch)
    deploy = min(deploy, len(cut) - 1)
    reference = Pipeline(new)
    expected: list[SinkRows] = []
    for batch in cut:
        expected += reference.process(arrivals(new, batch)).outputs
    expected += reference.finish().outputs

    lake = tmp_path / "lake"
    store = MemoryStore()
    live = old_pipeline(old, store)
    got: list[SinkRows] = []
    for batch in cut[:deploy]:
        result = live.process(arrivals(old, batch))
        live.save()
        got += result.outputs
        store_readings(lake, old, result.readings)
    resumed = Pipeline(new, store=store)
    fresh = dict(resumed.fresh)
    position = resumed.positions()["traffic"]
    warm = warm_start(resumed, str(lake), backfill_ms)
    if warm is not None:
        resumed.adopt(warm.entries)
    after: list[SinkRows] = []
    for batch in cut[deploy:]:
        after += resumed.process(arrivals(new, batch)).outputs
    after += resumed.finish().outputs
    return {
        "fresh": fresh,
        "warm": warm,
        "position": position,
        "expected": expected,
        "before": got,
        "after": after,
        "live": live,
        "resumed": resumed,
        "new": new,
    }


@pytest.mark.slow
@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 10_000),
    per_batch=st.integers(10, 60),
    deploy=st.integers(1, 12),
)
def test_added_and_edited_rules_emit_what_they_would_have_had_they_always_run(
    tmp_path_factory: pytest.TempPathFactory, seed: int, per_batch: int, deploy: int
) -> None:
    tmp_path = tmp_path_factory.mktemp("warm")
    # A backfill longer than the history: every window is filled exactly.
    run = run_and_deploy(tmp_path, seed, 300, per_batch, deploy, backfill_ms=3_600_000)
    # `slow` is run by the stage of `speed`, which it reads without a window.
    assert run["fresh"] == {"busy": NEW, "flow": NEW, "volume": EDITED}
    assert run["resumed"].fresh == {}, "adopted stages are fresh no more"
    position = run["position"]
    for sink in ("busy", "flow", "volume"):
        assert rows_of(run["after"], sink) == rows_of(run["expected"], sink, position), sink
    # The rules left alone: every row once, as in the uninterrupted run. A stage's rows
    # are numbered across all it emits, so `slow` added to `speed`'s stage numbers the
    # rows after the deploy otherwise (docs/engine.md, *Live rules*).
    got = [*run["before"], *run["after"]]
    assert rows_of(got, "speed", numbered=False) == rows_of(
        run["expected"], "speed", numbered=False
    )
    after = rows_of(run["after"], "slow", numbered=False)
    assert after == rows_of(run["expected"], "slow", position, numbered=False)


# Active expiration over aggregates declared newest_only: run per column, or per row.
EXPIRING = {
    "quiet": "CREATE AGGREGATE silence(ts TIMESTAMP) RETURNS TIMESTAMP LANGUAGE PYTHON AS "
    "'rules.udas:Silence';\n"
    "CREATE STREAM quiet AS SELECT station, ts, silence(ts) OVER (PARTITION BY station "
    "RANGE 3 SECONDS PRECEDING ACTIVE EXPIRATION) AS last_seen FROM traffic;",
    "missed": "CREATE AGGREGATE missed_door(door STRING, next_door STRING) RETURNS STRING "
    "LANGUAGE PYTHON AS 'rules.udas:MissedDoor';\n"
    "CREATE STREAM missed AS SELECT station, ts, missed_door(CASE WHEN speed >= 80 THEN "
    "'exit' ELSE 'entry' END, 'exit') OVER (PARTITION BY station RANGE 3 SECONDS PRECEDING "
    "ACTIVE EXPIRATION) AS last_door FROM traffic;",
}


def per_row_pipeline(plan: Plan, store: MemoryStore) -> Pipeline:
    """A pipeline as an engine built it when the stages of ``EXPIRING`` ran per row."""
    columnar = planner.columnar
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(planner, "columnar", lambda s: s.name not in EXPIRING and columnar(s))
        return Pipeline(plan, store=store)


def runner_of(pipeline: Pipeline, name: str) -> Any:
    return next(pipeline.runners[i] for i, stage in pipeline.stages if stage.name == name)


@pytest.mark.parametrize(
    ("seed", "per_batch", "deploy"),
    [
        (5, 20, 4),
        (11, 20, 9),
        (1, 4, 1),  # deployed before any key was evicted: no residues saved
    ],
)
def test_a_stage_that_changes_runner_starts_again_from_the_stored_readings(
    tmp_path: Path, seed: int, per_batch: int, deploy: int
) -> None:
    # The same rules, saved by the per-row runner and resumed by the columnar one (an
    # upgrade that moves a stage): the other kind's state is dropped and filled again.
    rules = {**BASE, **EXPIRING}
    run = run_and_deploy(
        tmp_path, seed, 300, per_batch, deploy, 3_600_000, rules, rules, per_row_pipeline
    )
    for name in EXPIRING:
        assert isinstance(runner_of(run["live"], name), RowRunner), name
        assert isinstance(runner_of(run["resumed"], name), NewestExpiryRunner), name
    assert run["fresh"] == {name: EDITED for name in EXPIRING}
    position = run["position"]
    for name in EXPIRING:
        after = rows_of(run["expected"], name, position)
        assert len(after) >= 20, (name, len(after))  # the silences and alarms to compare
        assert rows_of(run["after"], name) == after, name
    got = [*run["before"], *run["after"]]  # the stages left alone carry on
    for name in BASE:
        assert rows_of(got, name) == rows_of(run["expected"], name), name


@pytest.mark.parametrize("saved_per_row", [True, False])
def test_the_state_another_runner_saved_is_dropped(tmp_path: Path, saved_per_row: bool) -> None:
    # Saved before any key was evicted (no residues, whose count also names the kind):
    # the per-row and the columnar runners still tell each other's state.
    plan = plan_of(tmp_path, "rules", {**BASE, **EXPIRING})
    before, after = (per_row_pipeline, a_pipeline)[:: 1 if saved_per_row else -1]
    store = MemoryStore()
    live = before(plan, store)
    live.process(arrivals(plan, batches(1, 4, 4)[0]))
    live.save()
    assert [e for e in store.entries if e[1] in EXPIRING], "the stages saved state"
    resumed = after(plan, store)
    assert resumed.fresh == {name: EDITED for name in EXPIRING}
    assert not [e for e in store.entries if e[1] in EXPIRING], "and it is gone"
    assert resumed.fresh.keys() == set(resumed.dropped)


def test_state_saved_per_key_in_cstate_entries_is_dropped(tmp_path: Path) -> None:
    # A columnar stage kept each key's state in a cstate entry of its own before its
    # key index: that layout is stale to it, and the stage is filled again.
    plan = plan_of(tmp_path, "rules", {**BASE, **EXPIRING})
    store = MemoryStore()
    live = a_pipeline(plan, store)
    live.process(arrivals(plan, batches(1, 4, 4)[0]))
    live.save()
    moved = 0
    for entry in [e for e in store.entries if e[0] in (KEY_STATE, KEY_INDEX)]:
        if entry[1] not in EXPIRING:
            continue
        data = store.entries.pop(entry)
        if entry[0] == KEY_STATE:
            runner = runner_of(live, entry[1])
            emitted, state = pickle.loads(data)
            record = (runner.stage.query.definition, runner.kind, emitted, state)
            store.entries[("cstate", entry[1], entry[2], 0)] = pickle.dumps(record)
            moved += 1
    assert moved, "the stages saved keys"
    resumed = a_pipeline(plan, store)
    assert resumed.fresh == {name: EDITED for name in EXPIRING}
    assert not [e for e in store.entries if e[1] in EXPIRING], "and it is gone"


def test_time_windows_are_filled_from_their_reach_alone(tmp_path: Path) -> None:
    # No backfill beyond the windows' reach: RANGE windows and extents still start full.
    run = run_and_deploy(tmp_path, seed=7, n=400, per_batch=25, deploy=10, backfill_ms=0)
    position = run["position"]
    for sink in ("busy", "flow", "volume"):
        assert rows_of(run["after"], sink) == rows_of(run["expected"], sink, position), sink
    assert run["warm"].start_ms >= START + 400_000 - 1_000 * 60 * 5 - 200_000


def test_past_rows_of_new_streams_only_and_no_alerts(tmp_path: Path) -> None:
    run = run_and_deploy(tmp_path, seed=3, n=300, per_batch=30, deploy=8, backfill_ms=60_000)
    warm = run["warm"]
    written = {emitted.sink for emitted in warm.past.outputs}
    assert written == {"busy", "flow"}, "edited volume keeps its rows; slow is an alert"
    since = run["position"] - 60_000
    for sink in written:
        assert rows_of(warm.past.outputs, sink) == [
            row for row in rows_of(run["expected"], sink, since) if dict(row)[TS] < run["position"]
        ]


def test_reach_of_the_added_rules(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "new", {**BASE, **ADDED})
    assert reach_ms(plan, unbounded_ms=0) == 2 * 60_000 + 90_000 + 90_000


def test_no_warm_start_when_nothing_is_new(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "old", BASE)
    store = MemoryStore()
    live = Pipeline(plan, store=store)
    live.process({"traffic": arrival_table(plan.streams["traffic"], batches(1, 20, 20)[0])})
    live.save()
    again = Pipeline(plan, store=store)
    assert again.fresh == {}
    assert warm_start(again, str(tmp_path / "lake"), 60_000) is None
