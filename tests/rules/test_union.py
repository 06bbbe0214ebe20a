"""UNION ALL of streams: one plan query per branch writing one sink, merged by event
time (then source, seq) wherever the union is read; known answers through replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.core.replay import run
from rules.language.loader import load_rules
from tests.rules.helpers import STREAMS, check_text

S = 1_000


def load(tmp_path: Path, rest: str) -> Any:
    (tmp_path / "u.sql").write_text(STREAMS + rest)
    return load_rules([tmp_path / "u.sql"])


def north(station: int, speed: float, ts: int) -> tuple[str, dict[str, Any]]:
    return "north", {"station": station, "speed": speed, "ts": ts}


def south(detector: int, velocity: float, at: int) -> tuple[str, dict[str, Any]]:
    return "south", {"detector": detector, "velocity": velocity, "at": at}


# South arrives late relative to north (its own slack is 5 s), ties at 3 s.
READINGS = [north(1, 10.0, 1 * S), north(1, 20.0, 3 * S), south(7, 30.0, 2 * S),
            south(7, 40.0, 3 * S), south(8, -1.0, 4 * S), north(2, 50.0, 6 * S)]  # fmt: skip


def sink(rule_set: Any, name: str, batch: int = 10_000) -> list[tuple[int, dict[str, Any]]]:
    return [(o.ts, o.row) for o in run(rule_set.plan, READINGS, batch).outputs if o.sink == name]


def test_union_rows_take_the_first_branch_names(tmp_path: Path) -> None:
    got = sink(load(tmp_path, ""), "both_ways")
    assert got == [
        (1 * S, {"station": 1, "speed": 10.0, "ts": 1 * S}),
        (2 * S, {"station": 7, "speed": 30.0, "ts": 2 * S}),
        (3 * S, {"station": 1, "speed": 20.0, "ts": 3 * S}),
        (3 * S, {"station": 7, "speed": 40.0, "ts": 3 * S}),
        (6 * S, {"station": 2, "speed": 50.0, "ts": 6 * S}),
    ]
    plan = load(tmp_path, "").plan
    assert [s.name for s in plan.stages()] == ["both_ways", "both_ways#1"]


def test_a_window_over_the_union_sees_the_merge_by_time(tmp_path: Path) -> None:
    rule_set = load(
        tmp_path,
        "CREATE STREAM pairs AS SELECT station, ts, "
        "first(station) OVER (ROWS 1 PRECEDING) AS before FROM both_ways;",
    )
    # In time order 1(n) 2(s) 3(n) 3(s) 6(n); at 3 s the first branch's row comes first
    # (its source ["both_ways"] sorts before ["both_ways#1"]).
    expected = [(1, 1), (7, 1), (1, 7), (7, 1), (2, 7)]
    for batch in (1, 2, 10_000):  # whenever rows are fed, the merge is the same
        got = sink(rule_set, "pairs", batch)
        assert [(row["station"], row["before"]) for _, row in got] == expected


def test_a_stateless_query_over_the_union_reads_every_branch(tmp_path: Path) -> None:
    rule_set = load(
        tmp_path,
        "CREATE ALERT fast SEVERITY info AS SELECT station, ts FROM both_ways WHERE speed > 25;",
    )
    assert [row["station"] for _, row in sink(rule_set, "fast")] == [7, 7, 2]


def test_an_alert_can_be_a_union(tmp_path: Path) -> None:
    rule_set = load(
        tmp_path,
        "CREATE ALERT slow SEVERITY info RESOLVE AFTER 1 MINUTE AS "
        "SELECT station, ts FROM north WHERE speed < 15 "
        "UNION ALL SELECT detector AS station, at FROM south WHERE velocity < 0;",
    )
    assert sink(rule_set, "slow") == [
        (1 * S, {"station": 1, "ts": 1 * S}),
        (4 * S, {"station": 8, "ts": 4 * S}),
    ]


def test_union_branches_must_carry_event_time_alike(tmp_path: Path) -> None:
    path, errors = check_text(
        tmp_path,
        STREAMS + "CREATE STREAM bad AS SELECT station, ts FROM north "
        "UNION ALL SELECT detector, detector AS d2 FROM south;",
    )
    assert [str(e) for e in errors] == [
        f"{path}:8:79: type mismatch: column 'ts' is TIMESTAMP in the first branch of "
        "UNION ALL and INT here"
    ]
    path, errors = check_text(
        tmp_path,
        STREAMS + "CREATE STREAM bad AS SELECT station, ts FROM north "
        "UNION ALL SELECT detector, at + INTERVAL 1 SECOND AS t2 FROM south;",
    )
    assert [str(e) for e in errors] == [
        f"{path}:8:79: column 'ts' is the event time of the first branch of UNION ALL, so "
        "here it must be this branch's timestamp column"
    ]


def test_a_time_window_over_the_union(tmp_path: Path) -> None:
    # Every branch carries its event time in `ts`'s position, so the union has a
    # timestamp column and takes time-based windows (here a CQL [RANGE r] relation).
    rule_set = load(
        tmp_path,
        "CREATE STREAM counts AS SELECT RSTREAM(count(*) AS n) FROM both_ways [RANGE 2 SECONDS];",
    )
    assert rule_set.plan.streams["both_ways"].timestamp == "ts"
    got = [(ts, row["n"]) for ts, row in sink(rule_set, "counts")]
    # Rows in [t - 2 s, t]: 1 at 1 s, 2 at 2 s, 4 at 3 s (both branches' 3 s rows);
    # the 1 s row leaves at 3.001 s, the 2 s row at 4.001 s, the 3 s rows at 5.001 s
    # (R empty: RSTREAM writes nothing), and the 6 s row makes 1.
    assert got == [(1 * S, 1), (2 * S, 2), (3 * S, 4), (3 * S + 1, 3), (4 * S + 1, 2), (6 * S, 1)]
