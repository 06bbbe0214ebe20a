"""The evaluation split by key among workers (`engine.core.partitions`) gives one
pipeline's result: the same output rows in the same order, the same incidents (those of
an alert without a key computed from every worker's reports), late readings,
duplicates and final-close counts, on random streams with ties, disorder within slack,
late readings, redeliveries and heartbeats. And which rules split by what."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.output_order import Runs
from engine.core.partitions import (
    CapReachable,
    PartitionWorker,
    partitioning,
)
from engine.core.pipeline import HEARTBEAT
from engine.core.plan import END_OF_TIME, Plan
from engine.core.replay import (
    ReplayResult,
    arrival_table,
    run_arrivals,
    run_split,
    sink_tables,
)
from rules.language.loader import RULES_DIR, load_rules
from tests.engine.test_output_order import handed_rows, own_rows

BASE = 1_767_225_600_000  # 2026-01-01T00:00:00Z

TRAFFIC = """\
CREATE STREAM traffic (station INT, lane INT, speed DOUBLE, length DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings';
"""
# Every form the traffic library uses, at the scale of seconds: a sliding OVER frame, an
# extent, a ROWS frame with a slide, active expiration, a short ROWS frame per
# (station, lane) with an alert resolved by its next report, a stateless alert without a
# key resolved by time (beside the judge), one resolved by observations; then a group
# split by lane, and two kept whole (a rule reading a derived stream; an alert from a
# UNION ALL of a window by station and one by lane).
SPLIT_RULES = (
    TRAFFIC
    + """\
CREATE STREAM station_speed AS SELECT station, ts,
  avg(speed) OVER (PARTITION BY station RANGE 10 SECONDS PRECEDING SLIDE 2 SECONDS) AS v
  FROM traffic;
CREATE ALERT slow SEVERITY warning MESSAGE 'slow {station}'
  AS SELECT station, ts, v FROM station_speed WHERE v < 15;
CREATE STREAM minmax AS SELECT station, window_end, max(speed) AS hi, min(speed) AS lo
  FROM traffic [RANGE 6 SECONDS SLIDE 2 SECONDS] GROUP BY station;
CREATE STREAM volume AS SELECT station, ts,
  sum(CASE WHEN length > 10 THEN 1 ELSE 0 END)
    OVER (PARTITION BY station ROWS 5 PRECEDING SLIDE 2) AS long_vehicles
  FROM traffic;
CREATE AGGREGATE silence(ts TIMESTAMP) RETURNS TIMESTAMP
  LANGUAGE PYTHON AS 'rules.udas:Silence';
CREATE ALERT silent SEVERITY warning MESSAGE 'silent {station}' RESOLVE WHEN TRUE
  AS SELECT station,
            silence(ts) OVER (PARTITION BY station RANGE 4 SECONDS PRECEDING
                              ACTIVE EXPIRATION) AS last_reading
     FROM traffic;
CREATE STREAM lanes AS SELECT station, lane, ts,
  max(speed) OVER (PARTITION BY station, lane ROWS 2 PRECEDING) AS top,
  count(*) OVER (PARTITION BY station, lane ROWS 2 PRECEDING) AS n
  FROM traffic;
CREATE ALERT stopped SEVERITY critical MESSAGE 'stopped {station} {lane}'
  AS SELECT station, lane, ts, top FROM lanes WHERE n = 3 AND top < 1.0;
CREATE ALERT fast SEVERITY warning MESSAGE 'fast {station}' RESOLVE AFTER 3 SECONDS
  AS SELECT station, lane, ts, speed FROM traffic WHERE speed > 40;
CREATE STREAM per_lane AS SELECT lane, window_end, count(*) AS n
  FROM traffic [RANGE 6 SECONDS SLIDE 3 SECONDS] GROUP BY lane;
CREATE STREAM fastest AS SELECT lane, ts,
  max(speed) OVER (PARTITION BY lane ROWS 3 PRECEDING) AS top FROM traffic;
CREATE STREAM fast_lanes AS SELECT window_end, count(*) AS k FROM fastest [RANGE 5 SECONDS];
CREATE ALERT busy SEVERITY warning MESSAGE 'busy {station}' RESOLVE AFTER 4 SECONDS
  AS SELECT station, window_end, count(*) AS n FROM traffic [RANGE 4 SECONDS]
     GROUP BY station HAVING count(*) > 2
  UNION ALL SELECT lane AS station, window_end, count(*) AS n FROM traffic [RANGE 8 SECONDS]
     GROUP BY lane HAVING count(*) > 3;
"""
)


def plan_of(tmp_path: Path, text: str) -> Plan:
    path = tmp_path / "rules.sql"
    path.write_text(text)
    return load_rules([path]).plan


def groups(plan: Plan, workers: int = 2) -> dict[tuple[str, ...], tuple[str, ...] | None]:
    """Each group's stage names and split columns (None: whole in one worker)."""
    split = partitioning(plan, workers)
    return {tuple(sorted(plan.stages()[i].name for i in g.stages)): g.columns for g in split.groups}


def test_the_traffic_library_splits_by_station_its_stateless_speeding_beside_the_judge() -> None:
    plan = load_rules([RULES_DIR / "traffic.sql"]).plan
    assert groups(plan) == {
        ("lane_reports", "segment_minmax", "silent_detector", "station_speed", "station_volume"): (
            "station",
        ),
        ("accident", "last_reports"): None,
    }
    assert {plan.stages()[i].name for i in partitioning(plan, 2).central} == {"speeding"}


def test_the_rfid_library_splits_by_door_and_by_tag() -> None:
    plan = load_rules([RULES_DIR / "rfid.sql"]).plan
    assert groups(plan) == {
        ("door_day_totals", "larceny", "packing_groups"): ("door",),
        ("missed_shipping",): ("tagid",),
        ("daily_door_counts", "door_days"): None,
    }


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        (
            "CREATE STREAM per_lane AS SELECT lane, window_end, count(*) AS n "
            "FROM traffic [RANGE 10 SECONDS] GROUP BY lane;\n"
            "CREATE STREAM per_station AS SELECT station, window_end, count(*) AS n "
            "FROM traffic [RANGE 10 SECONDS] GROUP BY station;",
            {("per_lane",): ("lane",), ("per_station",): ("station",)},
        ),
        (
            "CREATE STREAM everything AS SELECT window_end, count(*) AS n "
            "FROM traffic [RANGE 10 SECONDS];",
            {("everything",): None},
        ),
        (
            "CREATE STREAM lanes AS SELECT station, lane, ts, "
            "count(*) OVER (PARTITION BY station, lane ROWS 2 PRECEDING) AS n FROM traffic;\n"
            "CREATE STREAM busy AS SELECT lane, window_end, count(*) AS k "
            "FROM lanes [RANGE 10 SECONDS] GROUP BY lane;",
            {("busy", "lanes"): None},
        ),
        (
            "CREATE ALERT busy SEVERITY warning MESSAGE 'busy {station}' "
            "RESOLVE AFTER 30 SECONDS AS SELECT station, window_end, count(*) AS n "
            "FROM traffic [RANGE 10 SECONDS] GROUP BY station HAVING count(*) > 5 "
            "UNION ALL SELECT station, window_end, count(*) AS n FROM traffic "
            "[RANGE 20 SECONDS] GROUP BY station HAVING count(*) > 8;",
            {("busy", "busy#1"): ("station",)},
        ),
        (
            "CREATE ALERT busy SEVERITY warning MESSAGE 'busy {station}' "
            "RESOLVE AFTER 30 SECONDS AS SELECT station, window_end, count(*) AS n "
            "FROM traffic [RANGE 10 SECONDS] GROUP BY station "
            "UNION ALL SELECT lane AS station, window_end, count(*) AS n FROM traffic "
            "[RANGE 20 SECONDS] GROUP BY lane;",
            {("busy", "busy#1"): None},
        ),
    ],
    ids=[
        "two keys, two groups",
        "no key: whole",
        "a derived stream read: whole",
        "one alert from two stages by station",
        "one alert by station and by lane: whole",
    ],
)
def test_stages_split_by_the_columns_their_keys_share_or_run_whole(
    tmp_path: Path, rules: str, expected: dict[tuple[str, ...], tuple[str, ...] | None]
) -> None:
    assert groups(plan_of(tmp_path, TRAFFIC + rules)) == expected


# ---- equal results on random streams ---------------------------------------------------

STATIONS = 5


@st.composite
def arrivals(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    """Readings of a few stations over about 40 s in arrival order, cut into batches:
    event times within the 2 s slack of the newest (some beyond it: late), ties,
    redeliveries of earlier readings, heartbeats, stopped and fast vehicles."""
    count = draw(st.integers(1, 160))
    clock, seq, readings = BASE, 0, []
    for _ in range(count):
        kind = draw(st.sampled_from(["reading"] * 8 + ["repeat", "late", "beat", "gap"]))
        if kind == "gap":
            clock += draw(st.integers(1_000, 8_000))
            continue
        if kind == "repeat" and readings:
            readings.append(dict(draw(st.sampled_from(readings))))
            continue
        if kind == "beat":
            readings.append({"ts": clock, "heartbeat": True, "source": "g", "seq": None})
            continue
        clock += draw(st.integers(0, 600))
        back = draw(st.integers(2_500, 6_000)) if kind == "late" else draw(st.integers(0, 2_000))
        seq += 1
        readings.append(
            {
                "station": draw(st.integers(1, STATIONS)),
                "lane": draw(st.integers(1, 2)),
                "speed": draw(st.sampled_from([0.5, 0.8, 12.0, 20.0, 30.0, 45.0])),
                "length": draw(st.sampled_from([4.0, 12.0])),
                "ts": clock - back,
                "source": "g",
                "seq": seq,
            }
        )
    cuts = sorted(draw(st.sets(st.integers(1, max(len(readings) - 1, 1)), max_size=6)))
    bounds = [0, *cuts, len(readings)]
    return [readings[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def batches(plan: Plan, batched: list[list[dict[str, Any]]]) -> list[dict[str, pa.Table]]:
    schema = plan.streams["traffic"]
    tables = []
    for rows in batched:
        table = arrival_table(schema, rows)
        beats = pa.array([bool(r.get("heartbeat")) for r in rows], pa.bool_())
        tables.append({"traffic": table.set_column(table.schema.get_field_index(HEARTBEAT),
                                                   HEARTBEAT, beats)})  # fmt: skip
    return tables


def summary(result: ReplayResult) -> dict[str, Any]:
    tables = sink_tables(result.emitted)
    assert tables is not None
    return {
        "outputs": {sink: table.to_pylist() for sink, table in tables.items()},
        "incidents": result.incidents,
        "late": result.late,
        "conflicts": result.conflicts,
        "duplicates": result.duplicates,
        "closed": result.closed,
        "watermarks": result.watermarks,
    }


@pytest.fixture(scope="module")
def split_plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    return plan_of(tmp_path_factory.mktemp("rules"), SPLIT_RULES)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batched=arrivals(), workers=st.integers(2, 3), end=st.sampled_from([END_OF_TIME, None]))
def test_the_split_evaluation_gives_one_pipelines_result(
    split_plan: Plan, batched: list[list[dict[str, Any]]], workers: int, end: int | None
) -> None:
    split = partitioning(split_plan, workers)
    assert set(groups(split_plan, workers).values()) == {("station",), ("lane",), None}
    assert [split_plan.stages()[i].name for i in split.central] == ["fast"]
    expected = run_arrivals(split_plan, batches(split_plan, batched), end)
    assert summary(split_run(split_plan, batched, workers, end)) == summary(expected)


def split_run(
    plan: Plan, batched: list[list[dict[str, Any]]], workers: int, end: int | None, **extra: Any
) -> ReplayResult:
    """``run_split`` over the batches among ``workers`` workers in this process."""
    split = partitioning(plan, workers)
    evaluators = [PartitionWorker(plan, split.groups_of(i)) for i in range(workers)]
    return run_split(plan, batches(plan, batched), split, evaluators, end, **extra)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batched=arrivals(),
    workers=st.integers(2, 3),
    drain_every=st.integers(1, 3),
    end=st.sampled_from([END_OF_TIME, None]),
)
def test_rows_handed_on_as_they_become_final_are_the_rows_of_the_whole_run(
    split_plan: Plan,
    batched: list[list[dict[str, Any]]],
    workers: int,
    drain_every: int,
    end: int | None,
) -> None:
    """One pipeline and the split evaluation handing on their rows batch by batch give
    the rows (in order, as the sinks' own columns) and everything else of a run that
    keeps every row to the end."""
    whole = run_arrivals(split_plan, batches(split_plan, batched), end)
    tables = sink_tables(whole.emitted)
    assert tables is not None
    expected = {**summary(whole), "outputs": own_rows(tables)}
    one: list[Runs] = []
    got = run_arrivals(split_plan, batches(split_plan, batched), end, finished=one.append)
    assert got.emitted == []
    assert {**summary(got), "outputs": handed_rows(one)} == expected
    several: list[Runs] = []
    got = split_run(
        split_plan, batched, workers, end, finished=several.append, drain_every=drain_every
    )
    assert {**summary(got), "outputs": handed_rows(several)} == expected


def test_the_rules_under_test_produce_every_output_and_incident_kind(split_plan: Plan) -> None:
    """A stream that stops, speeds and falls silent reaches every sink and incident kind."""
    readings = []
    for i in range(120):
        station = 1 + i % STATIONS
        speed = 0.5 if station == 2 else 45.0 if station == 3 and i < 60 else 12.0
        readings.append({"station": station, "lane": 1, "speed": speed, "length": 12.0,
                         "ts": BASE + i * 400 + (i % 7 == 0) * 8_000 * (station == 4),
                         "source": "g", "seq": i})  # fmt: skip
    result = run_arrivals(split_plan, batches(split_plan, [readings]))
    tables = sink_tables(result.emitted)
    assert tables is not None
    assert {
        "slow",
        "minmax",
        "volume",
        "silent",
        "stopped",
        "fast",
        "per_lane",
        "fast_lanes",
    } <= set(tables)
    assert {u.alert for u in result.incidents} >= {"slow", "stopped", "fast", "silent", "busy"}


def test_a_cap_on_live_keys_that_could_be_reached_stops_the_split(split_plan: Plan) -> None:
    rows = [{"station": s, "lane": 1, "speed": 20.0, "length": 4.0, "ts": BASE + s,
             "source": "g", "seq": s} for s in range(1, 6)]  # fmt: skip
    split = partitioning(split_plan, 2)
    workers = [PartitionWorker(split_plan, split.groups_of(i)) for i in range(2)]
    run_split(split_plan, batches(split_plan, [rows]), split, workers, caps={"traffic": 6})
    with pytest.raises(CapReachable, match="5 keys of traffic"):
        run_split(split_plan, batches(split_plan, [rows]), split, workers, caps={"traffic": 5})
