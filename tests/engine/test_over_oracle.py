"""OVER windows against DuckDB's SQL:2003 window functions as an independent oracle.

Random partitioned streams with many timestamp ties (peers; half the streams on five
instants only, so every ROWS form's frame edge falls among ties), NULLs and both sources go
through the engine (shuffled, then one advance to END_OF_TIME) and through DuckDB;
every output row must match. Slides are checked with QUALIFY: every n-th row of the
partition for row slides, the last row of each time slot for time slides.
"""

from __future__ import annotations

import math
import random
from typing import Any

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.evaluator import KeyedEvaluator
from engine.core.plan import END_OF_TIME, AggCall, FrameUnits, OverWindow
from engine.core.planner.operators import pane_eligible
from engine.core.windows.panes import PaneOperator
from tests.engine.helpers import col, over_plan
from tests.examples import examples

SQL_NAME = {
    "count": "count",
    "sum": "sum",
    "avg": "avg",
    "min": "min",
    "max": "max",
    "var": "var_samp",
    "stddev": "stddev_samp",
    "first": "first_value",
    "last": "last_value",
}
# first/last depend on the order among peers, which SQL leaves open for RANGE frames.
PEER_SAFE = ["count", "sum", "avg", "min", "max", "var", "stddev"]


# One in-memory database for the whole module: connecting costs more than a query.
DB = duckdb.connect()
DB.execute("CREATE TABLE empty (ts BIGINT, source VARCHAR, seq INT, station INT, speed DOUBLE)")


def _to_rows(raw: list[tuple]) -> list[dict[str, Any]]:
    rows = [
        {"ts": ts, "source": src, "seq": seq, "station": station, "speed": speed}
        for seq, (ts, src, station, speed) in enumerate(raw)
    ]
    return sorted(rows, key=lambda r: (r["ts"], r["source"], r["seq"]))


def streams() -> st.SearchStrategy[list[dict[str, Any]]]:
    """Readings in (ts, source, seq) order, 3 stations, NULLs: half the streams on a
    0..60 range (some ties), half on 0..4 (nearly every reading ties with several
    others, of both sources, so a ROWS frame's edge falls inside a run of peers)."""

    def readings(ts: st.SearchStrategy[int]) -> st.SearchStrategy[list[dict[str, Any]]]:
        reading = st.tuples(
            ts,
            st.sampled_from(["a", "b"]),
            st.integers(0, 2),
            st.one_of(st.none(), st.integers(-20, 20).map(float)),
        )
        return st.lists(reading, max_size=40).map(_to_rows)

    return st.one_of(readings(st.integers(0, 60)), readings(st.integers(0, 4)))


def engine_rows(window: OverWindow, rows: list[dict[str, Any]]) -> list[tuple]:
    """Run one OVER query per partition (as the runtime would) and collect the outputs."""
    stage = over_plan(window).stages()[0]
    evaluators: dict[tuple, KeyedEvaluator] = {}
    arrivals = list(rows)
    # Any arrival order before the advance: the evaluator orders ties by (source, seq).
    random.Random(len(rows)).shuffle(arrivals)
    for row in arrivals:
        key = tuple(row[c] for c in stage.key)
        evaluators.setdefault(key, KeyedEvaluator(stage)).insert(dict(row))
    out = []
    for ev in evaluators.values():
        for o in ev.advance(END_OF_TIME):
            r = o.row
            out.append((r["station"], r["ts"], r["source"], r["seq"], r["v"]))
    return sorted(out, key=lambda t: t[:4])


def oracle_rows(
    sql_frame: str,
    agg: str,
    rows: list[dict[str, Any]],
    qualify: str = "",
    partition: str = "station",
    filter_: str = "",
) -> list:
    """The same window in DuckDB (``filter_``: an aggregate FILTER (WHERE ...) condition)."""
    values = ",".join(
        f"({r['ts']}, '{r['source']}', {r['seq']}, {r['station']}, "
        f"{'NULL' if r['speed'] is None else r['speed']})"
        for r in rows
    )
    source = f"(VALUES {values}) v(ts, source, seq, station, speed)" if rows else "empty"
    DB.execute(
        "CREATE OR REPLACE TEMP TABLE t AS SELECT ts::BIGINT ts, source::VARCHAR source,"
        f" seq::INT seq, station::INT station, speed::DOUBLE speed FROM {source}"
    )
    arg = "*" if agg == "count(*)" else "speed"
    fn = "count" if agg == "count(*)" else SQL_NAME[agg]
    query = f"""
        SELECT station, ts, source, seq,
               {fn}({arg}) {f"FILTER (WHERE {filter_})" if filter_ else ""}
                   OVER (PARTITION BY {partition} {sql_frame}) AS v
        FROM t {qualify}
        ORDER BY station, ts, source, seq"""
    return [tuple(r) for r in DB.execute(query).fetchall()]


def assert_same(got: list[tuple], want: list[tuple]) -> None:
    """Equal keys, values equal up to float round-off of delta maintenance."""
    assert [g[:4] for g in got] == [w[:4] for w in want]
    for g, w in zip(got, want, strict=True):
        if g[4] is None or w[4] is None:
            assert g[4] is None and w[4] is None, (g, w)
        else:
            assert math.isclose(g[4], w[4], rel_tol=1e-9, abs_tol=1e-6), (g, w)


def window(agg: str, units: FrameUnits, preceding: int | None, **kw: Any) -> OverWindow:
    """An OVER window computing ``agg`` into ``v``, partitioned by station."""
    name, args = ("count", ()) if agg == "count(*)" else (agg, (col("speed"),))
    return OverWindow((AggCall(name, args, "v"),), units, preceding, ("station",), **kw)


SETTINGS = settings(max_examples=examples(30), deadline=None)


@pytest.mark.parametrize("agg", ["count(*)", *PEER_SAFE])
@SETTINGS
@given(rows=streams(), r=st.integers(0, 25))
def test_range_frames_include_peers(agg: str, rows: list, r: int) -> None:
    frame = f"ORDER BY ts RANGE BETWEEN {r} PRECEDING AND CURRENT ROW"
    assert_same(engine_rows(window(agg, FrameUnits.RANGE, r), rows), oracle_rows(frame, agg, rows))


@pytest.mark.parametrize("agg", ["count(*)", *SQL_NAME])
@SETTINGS
@given(rows=streams(), n=st.integers(0, 8))
def test_rows_frames(agg: str, rows: list, n: int) -> None:
    frame = f"ORDER BY ts, source, seq ROWS BETWEEN {n} PRECEDING AND CURRENT ROW"
    assert_same(engine_rows(window(agg, FrameUnits.ROWS, n), rows), oracle_rows(frame, agg, rows))


@pytest.mark.parametrize("agg", ["count(*)", "sum", "max", "var"])
@SETTINGS
@given(rows=streams())
def test_unbounded_preceding(agg: str, rows: list) -> None:
    frame = "ORDER BY ts RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
    got = engine_rows(window(agg, FrameUnits.RANGE, None), rows)
    assert_same(got, oracle_rows(frame, agg, rows))
    frame = "ORDER BY ts, source, seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
    got = engine_rows(window(agg, FrameUnits.ROWS, None), rows)
    assert_same(got, oracle_rows(frame, agg, rows))


@pytest.mark.parametrize("agg", ["count(*)", "avg", "min"])
@SETTINGS
@given(rows=streams(), r=st.integers(0, 25), slide=st.integers(1, 5))
def test_row_slide_keeps_every_nth_tuple(agg: str, rows: list, r: int, slide: int) -> None:
    frame = f"ORDER BY ts RANGE BETWEEN {r} PRECEDING AND CURRENT ROW"
    qualify = (
        f"QUALIFY row_number() OVER (PARTITION BY station ORDER BY ts, source, seq) % {slide} = 0"
    )
    got = engine_rows(window(agg, FrameUnits.RANGE, r, slide_rows=slide), rows)
    assert_same(got, oracle_rows(frame, agg, rows, qualify))


@pytest.mark.parametrize("agg", ["count(*)", "avg", "max"])
@SETTINGS
@given(rows=streams(), r=st.integers(0, 25), slide=st.integers(1, 20), rows_frame=st.booleans())
def test_time_slide_keeps_last_tuple_of_each_slot(
    agg: str, rows: list, r: int, slide: int, rows_frame: bool
) -> None:
    if rows_frame:
        units, frame = FrameUnits.ROWS, f"ORDER BY ts, source, seq ROWS {r % 6} PRECEDING"
        spec = window(agg, units, r % 6, slide_ms=slide)
    else:
        units, frame = FrameUnits.RANGE, f"ORDER BY ts RANGE {r} PRECEDING"
        spec = window(agg, units, r, slide_ms=slide)
    qualify = (
        f"QUALIFY row_number() OVER (PARTITION BY station, ts // {slide}"
        " ORDER BY ts DESC, source DESC, seq DESC) = 1"
    )
    assert_same(engine_rows(spec, rows), oracle_rows(frame, agg, rows, qualify))


@pytest.mark.parametrize("agg", ["count(*)", "sum", "min", "avg"])
@SETTINGS
@given(rows=streams(), size=st.integers(0, 20), lag=st.integers(1, 15), rows_frame=st.booleans())
def test_lagged_frames(agg: str, rows: list, size: int, lag: int, rows_frame: bool) -> None:
    # Patroumpas & Sellis's lag δ: RANGE t LAG d is [ts - d - t, ts - d], ROWS n LAG d is the rows
    # d + n .. d before; SQL spells both as BETWEEN ... PRECEDING AND d PRECEDING.
    if rows_frame:
        n, d = size % 6, lag % 4
        spec = window(agg, FrameUnits.ROWS, n, lag=d)
        frame = f"ORDER BY ts, source, seq ROWS BETWEEN {n + d} PRECEDING AND {d} PRECEDING"
    else:
        spec = window(agg, FrameUnits.RANGE, size, lag=lag)
        frame = f"ORDER BY ts RANGE BETWEEN {size + lag} PRECEDING AND {lag} PRECEDING"
    assert_same(engine_rows(spec, rows), oracle_rows(frame, agg, rows))


@pytest.mark.parametrize("agg", ["count(*)", "sum", "max"])
@SETTINGS
@given(rows=streams(), period=st.integers(1, 30))
def test_landmark_reset_every(agg: str, rows: list, period: int) -> None:
    # The window restarts at every multiple of the period: SQL partitions by the period.
    spec = window(agg, FrameUnits.RANGE, None, reset_every_ms=period)
    got = engine_rows(spec, rows)
    frame = "ORDER BY ts RANGE UNBOUNDED PRECEDING"
    want = oracle_rows(frame, agg, rows, partition=f"station, ts // {period}")
    assert_same(got, want)


@pytest.mark.parametrize("agg", ["count(*)", "sum", "min"])
@SETTINGS
@given(
    rows=streams(),
    since=st.one_of(st.none(), st.integers(0, 60)),
    until=st.one_of(st.none(), st.integers(0, 60)),
)
def test_fixed_bound_landmarks_and_band(
    agg: str, rows: list, since: int | None, until: int | None
) -> None:
    # Only tuples with since <= ts <= until enter; every tuple still gets its row.
    spec = window(agg, FrameUnits.RANGE, None, since_ms=since, until_ms=until)
    lo = -1 if since is None else since
    hi = 10**6 if until is None else until
    frame = "ORDER BY ts RANGE UNBOUNDED PRECEDING"
    want = oracle_rows(frame, agg, rows, filter_=f"ts >= {lo} AND ts <= {hi}")
    assert_same(engine_rows(spec, rows), want)


@pytest.mark.parametrize("agg", ["count(*)", *PEER_SAFE])
@SETTINGS
@given(rows=streams(), n=st.integers(0, 9), slide=st.integers(2, 6))
def test_row_slides_by_panes(agg: str, rows: list, n: int, slide: int) -> None:
    # ROWS n SLIDE s over algebraic aggregates runs on panes of gcd(n + 1, s) rows.
    spec = window(agg, FrameUnits.ROWS, n, slide_rows=slide)
    assert pane_eligible(spec)
    frame = f"ORDER BY ts, source, seq ROWS BETWEEN {n} PRECEDING AND CURRENT ROW"
    qualify = (
        f"QUALIFY row_number() OVER (PARTITION BY station ORDER BY ts, source, seq) % {slide} = 0"
    )
    assert_same(engine_rows(spec, rows), oracle_rows(frame, agg, rows, qualify))


def test_panes_hold_at_most_window_over_slide_plus_two_partials() -> None:
    # ESL Fig. 6: sum over ROWS 39 PRECEDING (40 rows) with slide 8 keeps the 40/8 panes
    # of the window (as panes or suffix merges), the back stack's merge and the open pane.
    (stage,) = over_plan(window("sum", FrameUnits.ROWS, 39, slide_rows=8)).stages()
    ev = KeyedEvaluator(stage)
    operator = ev.operator
    assert isinstance(operator, PaneOperator)
    for i in range(200):
        ev.insert({"ts": i, "source": "a", "seq": i, "station": 0, "speed": 1.0})
        ev.advance(i + 1)
        assert operator.partials() <= 40 // 8 + 2
