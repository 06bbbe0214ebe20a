"""Domain-driven windows against a direct evaluation of the WID ``extent`` function, and
CQL relation-to-stream operators against their definitions.

Oracle: for every e that is a multiple of the slide, the extent [e - r, e) of each
group; a non-empty one yields one row (group, window_start, window_end, aggregates),
with event time e.
"""

from __future__ import annotations

import itertools
import math
import pickle
import statistics
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.evaluator import KeyedEvaluator, OutputColumns, output_rows
from engine.core.plan import (
    END_OF_TIME,
    R2S,
    AggCall,
    ExtentWindow,
    FrameUnits,
    OverWindow,
    Plan,
    Project,
    Query,
    Sink,
    SinkKind,
)
from engine.core.planner import operators
from engine.core.windows.extents import ExtentOperator, PaneExtentOperator
from tests.engine.helpers import TRAFFIC, col, extent_plan
from tests.examples import examples

AGGS = (
    AggCall("count", (), "n"),
    AggCall("max", (col("speed"),), "max_speed"),
    AggCall("avg", (col("speed"),), "avg_speed"),
    AggCall("var", (col("speed"),), "var_speed"),
)


def minmax_plan(r: int, s: int, copies: bool = False) -> Plan:
    """``SELECT station, window_start, window_end, aggs FROM traffic [RANGE r SLIDE s]
    GROUP BY station``."""
    return extent_plan(ExtentWindow(AGGS, r, s, ("station",)), copies=copies)


def oracle(rows: list[dict], r: int, s: int) -> list[tuple]:
    """Every non-empty extent of every group, straight from the definition."""
    out = []
    if not rows:
        return out
    lo = min(x["ts"] for x in rows)
    hi = max(x["ts"] for x in rows)
    for station in sorted({x["station"] for x in rows}):
        mine = [x for x in rows if x["station"] == station]
        for e in range((lo // s + 1) * s, hi + r + s + 1, s):
            inside = [x["speed"] for x in mine if e - r <= x["ts"] < e]
            if inside:
                var = statistics.variance(inside) if len(inside) > 1 else None
                out.append(
                    (e, station, e - r, e, len(inside), max(inside), sum(inside) / len(inside), var)
                )
    return sorted(out)


@settings(max_examples=examples(150), deadline=None)
@given(
    raw=st.lists(
        st.tuples(st.integers(-50, 150), st.integers(0, 2), st.integers(-20, 20)), max_size=40
    ),
    r=st.integers(1, 40),
    s=st.integers(1, 40),
    paned=st.booleans(),
    copies=st.booleans(),
    cuts=st.lists(st.integers(0, 40), max_size=4),
)
def test_extents_match_the_wid_definition(
    raw: list, r: int, s: int, paned: bool, copies: bool, cuts: list[int]
) -> None:
    # The aggregates are algebraic, so extents run on panes of gcd(r, s) ms; with panes
    # switched off, on the buffered tuples (ExtentOperator). The rows come in batches
    # cut at `cuts`, each advanced to the next batch's first timestamp. A projection
    # that copies columns lets results on panes leave as columns.
    rows = [
        {"ts": ts, "station": k, "speed": float(v), "source": "s", "seq": i}
        for i, (ts, k, v) in enumerate(sorted(raw))
    ]
    (stage,) = minmax_plan(r, s, copies).stages()
    assert stage.key == ("station",)
    evaluators: dict[Any, KeyedEvaluator] = {}
    outputs: dict[Any, list] = {}
    bounds = [0, *sorted(c for c in cuts if c < len(rows)), len(rows)]
    with mock.patch.object(
        operators, "MAX_EXTENT_PANES", operators.MAX_EXTENT_PANES if paned else 0
    ):
        for lo, hi in itertools.pairwise(bounds):
            for row in rows[lo:hi]:
                evaluators.setdefault(row["station"], KeyedEvaluator(stage)).insert(row)
            watermark = rows[hi]["ts"] if hi < len(rows) else END_OF_TIME
            for key, ev in evaluators.items():
                batch = ev.advance_columns(watermark)
                as_columns = paned and copies
                assert all(isinstance(o, OutputColumns) == as_columns for o in batch)
                outputs.setdefault(key, []).extend(output_rows(batch))
    kind = PaneExtentOperator if paned else ExtentOperator
    assert all(type(ev.operator) is kind for ev in evaluators.values())
    got = []
    for mine in outputs.values():
        assert [o.ts for o in mine] == sorted(o.ts for o in mine)
        assert [o.seq for o in mine] == list(range(len(mine)))
        got += [(o.ts, *o.row.values()) for o in mine]
    want = oracle(rows, r, s)
    got.sort()
    assert [g[:6] for g in got] == [w[:6] for w in want]
    for g, w in zip(got, want, strict=True):
        assert math.isclose(g[6], w[6], abs_tol=1e-9)
        assert (g[7] is None) == (w[7] is None)
        assert g[7] is None or math.isclose(g[7], w[7], rel_tol=1e-9, abs_tol=1e-6)


def test_an_extent_is_emitted_when_the_watermark_passes_its_end() -> None:
    # RANGE 5 min SLIDE 1 min over ms: extents [e - 300000, e) with e a whole minute.
    (stage,) = minmax_plan(300_000, 60_000).stages()
    ev = KeyedEvaluator(stage)
    ev.insert({"ts": 61_000, "station": 3, "speed": 7.0, "source": "s", "seq": 0})
    assert ev.advance(119_999) == []  # instant 119999 may still receive a reading
    assert ev.next_wakeup() == 120_000
    (first,) = ev.advance(120_000)
    assert first.ts == 120_000
    assert first.row["window_start"] == -180_000 and first.row["window_end"] == 120_000
    assert [o.row["window_end"] for o in ev.advance(END_OF_TIME)] == [
        180_000,
        240_000,
        300_000,
        360_000,
    ]
    assert ev.next_wakeup() is None


def relation_oracle(rows: list[dict], r: int, s: int, r2s: R2S) -> list[tuple]:
    """ISTREAM / DSTREAM of R(e) = {(station, max speed)} of extent [e - r, e), by the
    CQL definitions: bag differences between consecutive extents' relations."""
    out = []
    if not rows:
        return out
    lo, hi = min(x["ts"] for x in rows), max(x["ts"] for x in rows)
    for station in sorted({x["station"] for x in rows}):
        previous: list[tuple] = []
        for e in range((lo // s + 1) * s, hi + r + 2 * s + 1, s):
            inside = [x["speed"] for x in rows if x["station"] == station and e - r <= x["ts"] < e]
            current = [(station, max(inside))] if inside else []
            new, old = (current, previous) if r2s is R2S.ISTREAM else (previous, current)
            out += [(e, *row) for row in new if row not in old]
            previous = current
    return sorted(out)


@settings(max_examples=examples(150), deadline=None)
@given(
    raw=st.lists(st.tuples(st.integers(0, 100), st.integers(0, 1), st.integers(0, 2)), max_size=30),
    r=st.integers(1, 30),
    s=st.integers(1, 30),
    r2s=st.sampled_from([R2S.ISTREAM, R2S.DSTREAM]),
)
def test_istream_and_dstream_follow_cql(raw: list, r: int, s: int, r2s: R2S) -> None:
    rows = [
        {"ts": ts, "station": k, "speed": float(v), "source": "s", "seq": i}
        for i, (ts, k, v) in enumerate(sorted(raw))
    ]
    window = ExtentWindow((AggCall("max", (col("speed"),), "m"),), r, s, ("station",))
    (stage,) = extent_plan(window, r2s=r2s, bounds=False).stages()
    evaluators: dict[Any, KeyedEvaluator] = {}
    for row in rows:
        evaluators.setdefault(row["station"], KeyedEvaluator(stage)).insert(row)
    got = sorted(
        (o.ts, o.row["station"], o.row["m"])
        for ev in evaluators.values()
        for o in ev.advance(END_OF_TIME)
    )
    assert got == relation_oracle(rows, r, s, r2s)


@settings(max_examples=examples(150), deadline=None)
@given(
    raw=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 1), st.integers(0, 2)), max_size=30),
    n=st.integers(1, 4),
    r2s=st.sampled_from([R2S.ISTREAM, R2S.DSTREAM, R2S.RSTREAM]),
    tied=st.booleans(),
)
def test_cql_partition_rows_relation(raw: list, n: int, r2s: R2S, tied: bool) -> None:
    # SELECT r2s(station, sum(speed)) FROM traffic [PARTITION BY station ROWS n]
    # GROUP BY station: R(t) per station is {(station, sum of its last n tuples up to t)},
    # changing at the instants where the station has readings. Tied: five instants only,
    # so several tuples enter (and push others out) at one instant.
    if tied:
        raw = [(ts % 5, k, v) for ts, k, v in raw]
    rows = [
        {"ts": ts, "station": k, "speed": float(v), "source": "s", "seq": i}
        for i, (ts, k, v) in enumerate(sorted(raw))
    ]
    window = OverWindow(
        (AggCall("sum", (col("speed"),), "total"),), FrameUnits.ROWS, n - 1, ("station",)
    )
    post = (Project((("station", col("station")), ("total", col("total")))),)
    query = Query(Sink("out", SinkKind.STREAM), "traffic", window=window, post=post, r2s=r2s)
    (stage,) = Plan({"traffic": TRAFFIC}, (query,)).stages()
    evaluators: dict[Any, KeyedEvaluator] = {}
    for row in rows:
        evaluators.setdefault(row["station"], KeyedEvaluator(stage)).insert(row)
    got = sorted(
        (o.ts, o.row["station"], o.row["total"])
        for ev in evaluators.values()
        for o in ev.advance(END_OF_TIME)
    )
    want = []
    for station in {r["station"] for r in rows}:
        mine = [r for r in rows if r["station"] == station]
        previous: list[tuple] = []
        for t in sorted({r["ts"] for r in mine}):
            upto = [r["speed"] for r in mine if r["ts"] <= t]
            current = [(station, sum(upto[-n:]))]
            if r2s is R2S.RSTREAM:
                want += [(t, *row) for row in current]
            else:
                new, old = (current, previous) if r2s is R2S.ISTREAM else (previous, current)
                want += [(t, *row) for row in new if row not in old]
            previous = current
    assert got == sorted(want)


@settings(max_examples=examples(150), deadline=None)
@given(
    raw=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 1), st.integers(0, 2)), max_size=30),
    r=st.integers(0, 10),
    r2s=st.sampled_from([R2S.ISTREAM, R2S.DSTREAM, R2S.RSTREAM]),
)
def test_cql_range_relation(raw: list, r: int, r2s: R2S) -> None:
    # SELECT r2s(station, count(*), sum(speed)) FROM traffic [RANGE r] GROUP BY station:
    # R(t) holds the station's row while it has tuples in [t - r, t]; it changes where a
    # tuple arrives (t) or leaves (t + r + 1), and is empty when the window is.
    rows = [
        {"ts": ts, "station": k, "speed": float(v), "source": "s", "seq": i}
        for i, (ts, k, v) in enumerate(sorted(raw))
    ]
    aggs = (AggCall("count", (), "n"), AggCall("sum", (col("speed"),), "total"))
    window = OverWindow(aggs, FrameUnits.RANGE, r, ("station",), active_expiration=True)
    names = ("station", "n", "total")
    post = (Project(tuple((name, col(name)) for name in names)),)
    query = Query(Sink("out", SinkKind.STREAM), "traffic", window=window, post=post, r2s=r2s)
    (stage,) = Plan({"traffic": TRAFFIC}, (query,)).stages()
    evaluators: dict[Any, KeyedEvaluator] = {}
    for row in rows:
        evaluators.setdefault(row["station"], KeyedEvaluator(stage)).insert(row)
    got = sorted(
        (o.ts, *o.row.values()) for ev in evaluators.values() for o in ev.advance(END_OF_TIME)
    )
    want = []
    for station in {x["station"] for x in rows}:
        mine = [x for x in rows if x["station"] == station]
        previous: list[tuple] = []
        for t in sorted({x["ts"] for x in mine} | {x["ts"] + r + 1 for x in mine}):
            inside = [x["speed"] for x in mine if t - r <= x["ts"] <= t]
            current = [(station, len(inside), sum(inside))] if inside else []
            if r2s is R2S.RSTREAM:
                want += [(t, *row) for row in current]
            else:
                new, old = (current, previous) if r2s is R2S.ISTREAM else (previous, current)
                want += [(t, *row) for row in new if row not in old]
            previous = current
    assert got == sorted(want)


@settings(max_examples=examples(100), deadline=None)
@given(r=st.integers(1, 90), s=st.integers(1, 90), step=st.integers(1, 7))
def test_extent_panes_hold_one_partial_per_pane_of_the_extent(r: int, s: int, step: int) -> None:
    # Panes of gcd(r, s) ms: at most r / gcd(r, s) panes of the next extent, the back
    # stack's merge and the open pane, whatever the slide (gaps between extents too);
    # RANGE 60 SLIDE 15 keeps 6 partials where a tuple every ms would keep 60 tuples.
    (stage,) = minmax_plan(r, s).stages()
    ev = KeyedEvaluator(stage)
    operator = ev.operator
    assert isinstance(operator, PaneExtentOperator)
    for i in range(0, 400, step):
        ev.insert({"ts": i, "station": 0, "speed": float(i % 7), "source": "s", "seq": i})
        ev.advance(i + 1)
        assert operator.partials() <= r // math.gcd(r, s) + 2


def test_extent_panes_only_for_algebraic_aggregates_and_bounded_panes() -> None:
    last = ExtentWindow((AggCall("last", (col("speed"),), "v"),), 60, 15, ("station",))
    (stage,) = extent_plan(last).stages()
    assert type(KeyedEvaluator(stage).operator) is ExtentOperator  # last has no merge
    # RANGE 100 s SLIDE 99999 ms: panes of 1 ms, 100,000 per extent: tuples are cheaper.
    sliver = ExtentWindow(AGGS, 100_000, 99_999, ("station",))
    (stage,) = extent_plan(sliver).stages()
    assert type(KeyedEvaluator(stage).operator) is ExtentOperator


@settings(max_examples=examples(100), deadline=None)
@given(
    raw=st.lists(st.tuples(st.integers(0, 100), st.integers(0, 10)), max_size=40),
    r=st.integers(1, 30),
    s=st.integers(1, 30),
    cut=st.integers(0, 110),
)
def test_a_version_5_snapshot_of_tuples_restores_into_panes(
    raw: list, r: int, s: int, cut: int
) -> None:
    # Before panes, extents kept their tuples (snapshot version 5): such a snapshot, taken
    # at any watermark, restores into the pane operator and gives the same outputs.
    rows = [
        {"ts": ts, "station": 0, "speed": float(v), "source": "s", "seq": i}
        for i, (ts, v) in enumerate(sorted(raw))
    ]
    (stage,) = minmax_plan(r, s).stages()
    whole = KeyedEvaluator(stage)
    with mock.patch.object(operators, "MAX_EXTENT_PANES", 0):
        old = KeyedEvaluator(stage)
    for row in rows:
        whole.insert(dict(row))
        old.insert(dict(row))
    expected = whole.advance(cut) + whole.advance(END_OF_TIME)
    first = old.advance(cut)
    state = list(pickle.loads(old.snapshot()))
    state[0] = 5
    restored = KeyedEvaluator.restore(stage, pickle.dumps(tuple(state)))
    assert isinstance(restored.operator, PaneExtentOperator)
    got = first + restored.advance(END_OF_TIME)
    assert [(o.ts, o.seq, o.row["n"], o.row["max_speed"]) for o in got] == [
        (o.ts, o.seq, o.row["n"], o.row["max_speed"]) for o in expected
    ]
    for g, e in zip(got, expected, strict=True):
        assert math.isclose(g.row["avg_speed"], e.row["avg_speed"], abs_tol=1e-9)
