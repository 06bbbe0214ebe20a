"""Snapshot-equivalence: arrival order within slack, batching of insert/advance calls and
snapshot/restore in mid-stream never change the outputs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.evaluator import KeyedEvaluator, Output
from engine.core.plan import (
    END_OF_TIME,
    R2S,
    AggCall,
    ExtentWindow,
    FrameUnits,
    OverWindow,
    OverWindows,
    Plan,
    Project,
    Query,
    RelationWindow,
    RowsGroupWindow,
    Sink,
    SinkKind,
)
from engine.core.planner.operators import evaluator_pieces
from engine.core.replay import run
from engine.core.windows.contents import IncrementalContents
from engine.core.windows.emits import TimeSlide
from engine.core.windows.frames import RangeFrame
from engine.core.windows.over import OverOperator
from tests.engine.helpers import TRAFFIC, col, extent_plan, over_plan
from tests.examples import examples

SLACK = 20

WINDOWS = [
    OverWindow((AggCall("avg", (col("speed"),), "v"),), FrameUnits.RANGE, 30, ("station",)),
    OverWindow(
        (AggCall("max", (col("speed"),), "v"),),
        FrameUnits.RANGE,
        40,
        ("station",),
        slide_ms=15,
    ),
    OverWindow(
        (AggCall("stddev", (col("speed"),), "v"),), FrameUnits.ROWS, 4, ("station",), slide_rows=3
    ),
    OverWindow((AggCall("count", (), "v"),), FrameUnits.RANGE, None, ("station",)),
    OverWindow(
        (AggCall("sum", (col("speed"),), "v"),),
        FrameUnits.RANGE,
        25,
        ("station",),
        active_expiration=True,
    ),
    OverWindow((AggCall("sum", (col("speed"),), "v"),), FrameUnits.RANGE, 20, ("station",), lag=15),
    OverWindow((AggCall("min", (col("speed"),), "v"),), FrameUnits.ROWS, 3, ("station",), lag=2),
    OverWindow(
        (AggCall("avg", (col("speed"),), "v"),),
        FrameUnits.RANGE,
        None,
        ("station",),
        reset_every_ms=50,
        since_ms=20,
        until_ms=150,
    ),
    ExtentWindow((AggCall("min", (col("speed"),), "v"),), 30, 10, ("station",)),
    ExtentWindow((AggCall("avg", (col("speed"),), "v"),), 7, 20, ("station",)),
    (ExtentWindow((AggCall("max", (col("speed"),), "v"),), 20, 10, ("station",)), R2S.DSTREAM),
    (
        OverWindow(
            (AggCall("count", (), "v"),),
            FrameUnits.RANGE,
            15,
            ("station",),
            active_expiration=True,
        ),
        R2S.ISTREAM,
    ),
    (RelationWindow(FrameUnits.RANGE, range_ms=12, lag_ms=5), R2S.DSTREAM),
    (RelationWindow(FrameUnits.RANGE, range_ms=30, slide_ms=20), R2S.RSTREAM),
    (RelationWindow(FrameUnits.ROWS, rows=2, partition_by=("station",)), R2S.ISTREAM),
    OverWindows(
        (
            OverWindow((AggCall("avg", (col("speed"),), "v"),), FrameUnits.RANGE, 30, ("station",)),
            OverWindow((AggCall("min", (col("speed"),), "w"),), FrameUnits.ROWS, 3, (), lag=2),
        )
    ),
    (RowsGroupWindow((AggCall("sum", (col("speed"),), "v"),), 3, (), ("station",)), R2S.DSTREAM),
    (RowsGroupWindow((AggCall("max", (col("speed"),), "v"),), 2, ("station",)), R2S.RSTREAM),
]


def plan_for(window: Any) -> Plan:
    """The test query over a traffic stream with the test slack (a window may come with
    a relation-to-stream operator, as a (window, R2S) pair)."""
    if isinstance(window, tuple) and isinstance(window[0], RelationWindow):
        post = (Project((("station", col("station")), ("speed", col("speed")))),)
        query = Query(Sink("out", SinkKind.STREAM), "traffic", window=window[0], post=post)
        plan = Plan({"traffic": TRAFFIC}, (replace(query, r2s=window[1]),))
    elif isinstance(window, tuple) and isinstance(window[0], RowsGroupWindow):
        columns = [(c, col(c)) for c in window[0].group_by] + [("v", col("v"))]
        post = (Project(tuple(columns)),)
        query = Query(Sink("out", SinkKind.STREAM), "traffic", window=window[0], post=post)
        plan = Plan({"traffic": TRAFFIC}, (replace(query, r2s=window[1]),))
    elif isinstance(window, OverWindows):
        post = (Project(tuple((c, col(c)) for c in ("ts", "station", "v", "w"))),)
        query = Query(Sink("out", SinkKind.STREAM), "traffic", window=window, post=post)
        plan = Plan({"traffic": TRAFFIC}, (query,))
    elif isinstance(window, OverWindow):
        plan = over_plan(window)
    elif isinstance(window, tuple) and isinstance(window[0], OverWindow):
        plan = over_plan(window[0], r2s=window[1])
    elif isinstance(window, tuple):
        plan = extent_plan(window[0], r2s=window[1], bounds=False)
    else:
        plan = extent_plan(window)
    return replace(plan, streams={"traffic": replace(TRAFFIC, slack_ms=SLACK)})


@st.composite
def disordered(draw: Any) -> tuple[list[dict], list[dict]]:
    """(readings in ts order, the same readings in an arrival order within the slack):
    each reading is delayed by at most SLACK, so none is ever late."""
    raw = draw(
        st.lists(
            st.tuples(st.integers(0, 200), st.integers(0, 2), st.floats(0, 40, width=32)),
            max_size=50,
        )
    )
    rows = [
        {
            "ts": ts,
            "station": k,
            "speed": float(v),
            "lane": 0,
            "length": 1.0,
            "source": "s",
            "seq": i,
        }
        for i, (ts, k, v) in enumerate(sorted(raw))
    ]
    delays = draw(st.lists(st.integers(0, SLACK), min_size=len(rows), max_size=len(rows)))
    arrival = sorted(range(len(rows)), key=lambda i: (rows[i]["ts"] + delays[i], i))
    return rows, [rows[i] for i in arrival]


SETTINGS = settings(max_examples=examples(200), deadline=None)


@SETTINGS
@given(data=disordered(), window=st.sampled_from(WINDOWS), batch=st.integers(1, 7))
def test_disorder_within_slack_gives_identical_outputs(
    data: tuple, window: Any, batch: int
) -> None:
    in_order, shuffled = data
    plan = plan_for(window)
    expected = run(plan, [("traffic", r) for r in in_order])
    got = run(plan, [("traffic", r) for r in shuffled], batch=batch)
    assert got.late == [] and expected.late == []
    assert got.outputs == expected.outputs


def drive(
    stage: Any, arrivals: list[dict], schedule: list[int], restore_at: set[int]
) -> list[Output]:
    """Insert ``arrivals`` one evaluator per key; after arrival i, advance to the slack
    watermark if ``schedule[i]`` is odd, and swap every evaluator for a restored copy of
    its snapshot if i is in ``restore_at`` (its next wakeup unchanged); finish at
    END_OF_TIME."""
    evaluators: dict[tuple, KeyedEvaluator] = {}
    out: list[Output] = []
    max_ts = -END_OF_TIME
    for i, row in enumerate(arrivals):
        key = tuple(row[c] for c in stage.key)
        evaluators.setdefault(key, KeyedEvaluator(stage)).insert(dict(row))
        max_ts = max(max_ts, row["ts"])
        if schedule[i] % 2:
            for ev in evaluators.values():
                out.extend(ev.advance(max_ts - SLACK))
        if i in restore_at:
            restored = {
                k: KeyedEvaluator.restore(stage, ev.snapshot()) for k, ev in evaluators.items()
            }
            # The Spark runtime reads the timer it set from the restored evaluator.
            for k, ev in evaluators.items():
                assert restored[k].next_wakeup() == ev.next_wakeup()
            evaluators = restored
    for ev in evaluators.values():
        out.extend(ev.advance(END_OF_TIME))
    return sorted(out, key=lambda o: (o.ts, repr(o.row)))


@SETTINGS
@given(
    data=disordered(),
    window=st.sampled_from(WINDOWS),
    schedule=st.lists(st.integers(0, 3), min_size=50, max_size=50),
    restore_at=st.sets(st.integers(0, 49), max_size=5),
)
def test_batching_and_restore_do_not_change_outputs(
    data: tuple, window: Any, schedule: list[int], restore_at: set[int]
) -> None:
    _, shuffled = data
    (stage,) = plan_for(window).stages()
    once = drive(stage, shuffled, [0] * len(shuffled), set())
    assert drive(stage, shuffled, schedule, set()) == once
    assert drive(stage, shuffled, schedule, restore_at) == once


def test_next_wakeup_is_where_the_time_slide_yields() -> None:
    (stage,) = plan_for(WINDOWS[1]).stages()  # RANGE 40, SLIDE 15 ms
    ev = KeyedEvaluator(stage)
    assert ev.next_wakeup() is None
    ev.insert({"ts": 16, "station": 0, "speed": 1.0, "source": "s", "seq": 0})
    assert ev.next_wakeup() == 17  # the buffered tuple is processed once ts < watermark
    assert ev.advance(17) == []  # processed, but slot [15, 30) is still open
    assert ev.next_wakeup() == 30  # the slot's last instant 29 becomes final at 30
    assert ev.advance(29) == []
    assert [o.ts for o in ev.advance(30)] == [16]
    assert ev.next_wakeup() is None


@SETTINGS
@given(
    data=disordered(),
    schedule=st.lists(st.integers(0, 3), min_size=50, max_size=50),
    slide=st.integers(1, 30),
    calls=st.integers(1, 3),
)
def test_batched_slot_arrivals_equal_group_by_group(
    data: tuple, schedule: list[int], slide: int, calls: int
) -> None:
    # A sliding RANGE window takes each time slot's arrivals in one call (arrive_slot);
    # tuple group by tuple group (arrive) must give the same outputs and the same state.
    aggs = (
        AggCall("avg", (col("speed"),), "a"),
        AggCall("max", (col("speed"),), "m"),
        AggCall("count", (), "n"),
    )
    window = OverWindow(aggs[:calls], FrameUnits.RANGE, 40, slide_ms=slide)
    (stage,) = plan_for(window).stages()

    def group_by_group() -> OverOperator:
        # The planner's pieces but for the slide: the one without the batched path.
        frame = RangeFrame(IncrementalContents(aggs[:calls]), 40)
        return OverOperator(frame, TimeSlide(frame, aggs[:calls], slide), 40)

    fast = KeyedEvaluator(stage)
    slow = KeyedEvaluator(stage, replace(evaluator_pieces(stage), operator=group_by_group))
    assert fast.operator.arrive_slot is not None  # type: ignore[attr-defined]
    assert slow.operator.arrive_slot is None  # type: ignore[attr-defined]
    max_ts = -END_OF_TIME
    for row, step in zip(data[1], schedule, strict=False):
        fast.insert(dict(row))
        slow.insert(dict(row))
        max_ts = max(max_ts, row["ts"])
        if step % 2:
            assert fast.advance(max_ts - SLACK) == slow.advance(max_ts - SLACK)
            assert fast.snapshot() == slow.snapshot()
    assert fast.advance(END_OF_TIME) == slow.advance(END_OF_TIME)
    assert fast.snapshot() == slow.snapshot()
