"""CQL windows in FROM with ISTREAM / DSTREAM / RSTREAM, and the landmark, reset and
fixed-bound OVER frames, compiled from rule text and run with known answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.replay import run
from rules.language.loader import RuleCheckError, load_rules
from tests.examples import examples
from tests.rules.helpers import TRAFFIC

S = 1_000
DAY = 86_400 * S


def rows(tmp_path: Path, query: str, readings: list[tuple[int, int]]) -> list[tuple[int, Any]]:
    """(event time, row) of sink `out` for (station, ts) readings of speed 10."""
    (tmp_path / "r.sql").write_text(TRAFFIC + query)
    plan = load_rules([tmp_path / "r.sql"]).plan
    data = [
        ("traffic", {"station": k, "lane": 1, "speed": 10.0, "length": 4.0, "ts": ts})
        for k, ts in readings
    ]
    return [(o.ts, o.row) for o in run(plan, data).outputs if o.sink == "out"]


READINGS = [(1, 0), (1, 5 * S), (2, 5 * S)]
RANGE_10S = "SELECT {op}(station, count(*) AS n) FROM traffic [RANGE 10 SECONDS] GROUP BY station"


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        # R(t) per station = its tuples in [t - 10 s, t]; a tuple leaves at ts + 10 s + 1 ms.
        ("RSTREAM", [(0, 1, 1), (5 * S, 1, 2), (5 * S, 2, 1), (10 * S + 1, 1, 1)]),
        ("ISTREAM", [(0, 1, 1), (5 * S, 1, 2), (5 * S, 2, 1), (10 * S + 1, 1, 1)]),
        ("DSTREAM", [(5 * S, 1, 1), (10 * S + 1, 1, 2), (15 * S + 1, 1, 1), (15 * S + 1, 2, 1)]),
    ],
)
def test_cql_range_relation(tmp_path: Path, op: str, expected: list[tuple[int, int, int]]) -> None:
    got = rows(tmp_path, f"CREATE STREAM out AS {RANGE_10S.format(op=op)};", READINGS)
    assert sorted((ts, r["station"], r["n"]) for ts, r in got) == sorted(expected)


def test_cql_partition_rows_relation(tmp_path: Path) -> None:
    query = (
        "CREATE STREAM out AS SELECT ISTREAM(station, count(*) AS n) "
        "FROM traffic [PARTITION BY station ROWS 2] GROUP BY station;"
    )
    got = rows(tmp_path, query, [(1, 0), (1, S), (1, 2 * S), (2, 2 * S)])
    # Per station the last two tuples: counts 1, 2, then 2 again (no change, no row).
    assert [(ts, r["station"], r["n"]) for ts, r in got] == [(0, 1, 1), (S, 1, 2), (2 * S, 2, 1)]


def test_cql_now(tmp_path: Path) -> None:
    counted = rows(
        tmp_path,
        "CREATE STREAM out AS SELECT window_end, count(*) AS n FROM traffic [NOW];",
        [(1, 0), (2, 0), (1, S)],
    )
    # The tuples of each instant t, as an extent ending at t + 1 ms.
    assert [(ts, r["n"]) for ts, r in counted] == [(1, 2), (S + 1, 1)]
    same = rows(
        tmp_path, "CREATE STREAM out AS SELECT ISTREAM(station, ts) FROM traffic [NOW];", READINGS
    )
    assert [(r["station"], r["ts"]) for _, r in same] == READINGS


def test_landmark_reset_every_day(tmp_path: Path) -> None:
    query = (
        "CREATE STREAM out AS SELECT station, ts, count(*) OVER (PARTITION BY station "
        "RANGE UNBOUNDED PRECEDING RESET EVERY 1 DAY) AS n FROM traffic;"
    )
    got = rows(tmp_path, query, [(1, DAY - 2 * S), (1, DAY - S), (1, DAY), (1, DAY + S)])
    assert [r["n"] for _, r in got] == [1, 2, 1, 2]


def test_fixed_band(tmp_path: Path) -> None:
    query = (
        "CREATE STREAM out AS SELECT ts, count(*) OVER (RANGE BETWEEN "
        "TIMESTAMP '1970-01-01 00:00:01' AND TIMESTAMP '1970-01-01 00:00:02') AS n FROM traffic;"
    )
    got = rows(tmp_path, query, [(1, 0), (1, S), (1, 2 * S), (1, 3 * S)])
    # Only tuples with 1 s <= ts <= 2 s enter; every tuple still gets its row.
    assert [r["n"] for _, r in got] == [0, 1, 2, 2]


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        (
            "CREATE STREAM out AS SELECT count(*) AS n FROM traffic [ROWS 3];",
            "the engine cannot run the CQL window [ROWS] without ISTREAM, DSTREAM or RSTREAM",
        ),
        (
            "CREATE STREAM out AS SELECT RSTREAM(station, window_end, count(*) AS n) "
            "FROM traffic [RANGE 10 SECONDS] GROUP BY station;",
            "the engine cannot run window_end over the CQL window [RANGE]",
        ),
    ],
)
def test_cql_forms_the_engine_refuses(tmp_path: Path, query: str, reason: str) -> None:
    with pytest.raises(RuleCheckError) as err:
        rows(tmp_path, query, [])
    assert reason in str(err.value)


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    raw=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 60)), max_size=25),
    bounds=st.sampled_from([(10, None), (None, 40), (10, 40)]),
    op=st.sampled_from(["ISTREAM", "DSTREAM", "RSTREAM"]),
)
def test_cql_fixed_bound_windows_with_aggregates(
    tmp_path: Path, raw: list[tuple[int, int]], bounds: tuple, op: str
) -> None:
    # R(τ) per station: (station, count of its tuples with lower <= ts <= min(τ, upper)),
    # present once it has one; it changes where such a tuple arrives.
    lower, upper = bounds
    stamp = "TIMESTAMP '1970-01-01T00:00:00.{:03d}Z'".format
    spec = (
        f"[BETWEEN {stamp(lower)} AND {stamp(upper)}]"
        if lower is not None and upper is not None
        else f"[SINCE {stamp(lower)}]"
        if lower is not None
        else f"[UNTIL {stamp(upper)}]"
    )
    query = (
        f"CREATE STREAM out AS SELECT {op}(station, count(*) AS n) FROM traffic {spec} "
        "GROUP BY station;"
    )
    readings = sorted(raw, key=lambda r: r[1])
    got = sorted((ts, r["station"], r["n"]) for ts, r in rows(tmp_path, query, readings))
    want = []
    for station in {k for k, _ in readings}:
        inside = [ts for k, ts in readings if k == station]
        inside = [
            t for t in inside if (lower is None or lower <= t) and (upper is None or t <= upper)
        ]
        previous: list[tuple] = []
        for t in sorted(set(inside)):
            current = [(station, sum(1 for x in inside if x <= t))]
            new, old = (current, previous) if op != "DSTREAM" else (previous, current)
            want += [(t, *row) for row in new if op == "RSTREAM" or row not in old]
            previous = current
    assert got == sorted(want)
