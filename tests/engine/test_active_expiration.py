"""ACTIVE EXPIRATION (ESL §5.2) and Python UDAs with ``inwindow``.

Brute-force oracle for built-ins: tuple τ at t expires at instant t + r, after every
tuple at t + r; its output carries τ's columns and the aggregate over the tuples that
follow τ in (ts, source, seq) order and have ts <= t + r.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.aggregates import InWindow, WindowAggregate
from engine.core.evaluator import KeyedEvaluator, Output
from engine.core.plan import (
    END_OF_TIME,
    AggCall,
    Column,
    ColumnType,
    FrameUnits,
    OverWindow,
    StreamSchema,
)
from engine.core.planner.operators import evaluator_pieces
from engine.core.replay import run
from engine.core.windows.contents import EslSlot, MixedContents
from engine.core.windows.emits import EveryTuple, ExpiryOutputs
from engine.core.windows.frames import ExpiringFrame, RangeFrame
from engine.core.windows.over import OverOperator
from rules.udas import Silence
from tests.engine.helpers import col, over_plan
from tests.examples import examples

SECOND = 1_000


def order(row: dict) -> tuple:
    """The (ts, source, seq) processing order."""
    return (row["ts"], row["source"], row["seq"])


@settings(max_examples=examples(150), deadline=None)
@given(
    raw=st.lists(
        st.tuples(st.integers(0, 40), st.sampled_from("ab"), st.integers(-9, 9)), max_size=30
    ),
    r=st.integers(0, 12),
    agg=st.sampled_from(["count", "sum", "max"]),
)
def test_expirations_match_brute_force(raw: list, r: int, agg: str) -> None:
    rows = sorted(
        (
            {"ts": ts, "source": src, "seq": i, "station": 0, "speed": float(v)}
            for i, (ts, src, v) in enumerate(raw)
        ),
        key=order,
    )
    window = OverWindow(
        (AggCall(agg, (col("speed"),), "v"),),
        FrameUnits.RANGE,
        r,
        ("station",),
        active_expiration=True,
    )
    (stage,) = over_plan(window).stages()
    ev = KeyedEvaluator(stage)
    for row in rows:
        ev.insert(row)
    outputs = ev.advance(END_OF_TIME)
    assert [o.ts for o in outputs] == sorted(o.ts for o in outputs)

    fn = {"count": len, "sum": sum, "max": max}[agg]

    def value(vals: list[float]) -> Any:
        return fn(vals) if vals or agg == "count" else None

    want = []
    for x in rows:  # arrivals: SQL RANGE frame with peers
        want.append(
            (
                x["ts"],
                order(x),
                value([y["speed"] for y in rows if x["ts"] - r <= y["ts"] <= x["ts"]]),
            )
        )
    for x in rows:  # expirations
        t = x["ts"] + r
        rest = [y["speed"] for y in rows if order(y) > order(x) and y["ts"] <= t]
        want.append((t, order(x), value(rest)))
    got = [(o.ts, order(o.row), o.row["v"]) for o in outputs]
    assert sorted(got, key=repr) == sorted(want, key=repr)


def test_expiration_fires_without_later_tuples_in_the_partition() -> None:
    window = OverWindow(
        (AggCall("count", (), "v"),), FrameUnits.RANGE, 10, ("station",), active_expiration=True
    )
    (stage,) = over_plan(window).stages()
    ev = KeyedEvaluator(stage)
    ev.insert({"ts": 5, "source": "a", "seq": 0, "station": 1})
    ev.insert({"ts": 5, "source": "a", "seq": 1, "station": 1})
    assert [o.row["v"] for o in ev.advance(6)] == [2, 2]
    assert ev.next_wakeup() == 16  # expiry instant 15 is final once the watermark is 16
    assert ev.advance(15) == []
    # Event time moved on through other partitions: both expire, in (ts, source, seq) order.
    assert [(o.ts, o.row["seq"], o.row["v"]) for o in ev.advance(16)] == [(15, 0, 1), (15, 1, 0)]
    assert ev.next_wakeup() is None


class ItemAlarm(WindowAggregate):
    """ESL example 18: an item leaving the 5 s window with no authorised person ('ap')
    seen within 5 s before or after it raises 'larceny alarm'."""

    def __init__(self) -> None:
        self.covered: list[tuple[Any, ...]] = []  # items that had an 'ap' just before them

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        _, tagtype, _ = args
        if tagtype == "ap":
            inwindow.delete(lambda t: t[1] == "item")  # every waiting item is escorted
        elif tagtype == "item" and any(t[1] == "ap" for t in inwindow):
            self.covered.append(args)
        return ()

    def expire(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        if args[1] != "item":
            return ()
        if args in self.covered:
            self.covered.remove(args)
            return ()
        return ("larceny alarm",)


TAGS = StreamSchema(
    "tag_readings",
    (
        Column("tagid", ColumnType.STRING),
        Column("tagtype", ColumnType.STRING),
        Column("door", ColumnType.INT),
        Column("tagtime", ColumnType.TIMESTAMP),
    ),
    timestamp="tagtime",
    slack_ms=1_000,
)


def larceny_outputs(readings: list[tuple[str, str, int]]) -> list[Output]:
    """Run ``item_alarm(tagid, tagtype, tagtime) OVER (PARTITION BY door RANGE 5 SECONDS
    PRECEDING ACTIVE EXPIRATION)`` over (tagid, tagtype, seconds) readings at door 1."""
    args = (col("tagid"), col("tagtype"), col("tagtime"))
    window = OverWindow(
        (AggCall("item_alarm", args, "alarm", factory=ItemAlarm),),
        FrameUnits.RANGE,
        5 * SECOND,
        ("door",),
        active_expiration=True,
    )
    plan = over_plan(window, TAGS, extra=("tagid", "tagtime"))
    rows = [
        ("tag_readings", {"tagid": t, "tagtype": k, "door": 1, "tagtime": s * SECOND})
        for t, k, s in readings
    ]
    return run(plan, rows).outputs


def test_theft_alarm_example_18() -> None:
    outputs = larceny_outputs(
        [
            ("i1", "item", 0),  # nobody within 5 s: alarm at 5 s
            ("i2", "item", 10),  # escorted: 'ap' 3 s after
            ("p1", "ap", 13),
            ("i3", "item", 16),  # escorted: 'ap' 3 s before
            ("i4", "item", 19),  # 6 s after the 'ap': alarm at 24 s
        ]
    )
    assert [(o.ts, o.row["tagid"], o.row["alarm"]) for o in outputs] == [
        (5 * SECOND, "i1", "larceny alarm"),
        (24 * SECOND, "i4", "larceny alarm"),
    ]


class PackGroup(WindowAggregate):
    """ESL example 17: number groups of items read less than 2 s apart. Over
    ``ROWS 1 PRECEDING`` the window holds just the previous reading."""

    def __init__(self) -> None:
        self.group = 0

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        previous = inwindow.oldest()
        if previous is None or args[0] - previous[0] >= 2 * SECOND:
            self.group += 1
        return (self.group,)


def test_packing_groups_example_17() -> None:
    window = OverWindow(
        (AggCall("pack_group", (col("tagtime"),), "grp", factory=PackGroup),),
        FrameUnits.ROWS,
        1,
        ("door",),
    )
    plan = over_plan(window, TAGS, extra=("tagid",))
    times = [0, 1, 2.5, 6, 7, 7.5, 20]
    rows = [
        (
            "tag_readings",
            {"tagid": f"i{n}", "tagtype": "item", "door": 1, "tagtime": int(s * SECOND)},
        )
        for n, s in enumerate(times)
    ]
    assert [o.row["grp"] for o in run(plan, rows).outputs] == [1, 1, 1, 2, 2, 2, 3]


class WindowMax(WindowAggregate):
    """ESL example 16: max by deleting dominated tuples; emits on arrival and expiry."""

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        inwindow.delete(lambda t: t[0] <= args[0])
        return (max([args[0], *(t[0] for t in inwindow)]),)

    def expire(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        rest = list(inwindow)[1:]  # the expiring tuple is still the oldest
        return (rest[0][0] if rest else None,)


@settings(max_examples=examples(100), deadline=None)
@given(
    raw=st.lists(
        st.tuples(st.integers(0, 40), st.integers(-9, 9)), max_size=30, unique_by=lambda t: t[0]
    ),
    r=st.integers(1, 12),
)
def test_uda_with_inwindow_delete_agrees_with_builtin_max(raw: list, r: int) -> None:
    # Distinct timestamps, so peers (which a UDA sees one by one) do not matter.
    rows = [
        (
            "traffic",
            {
                "ts": ts,
                "source": "s",
                "seq": i,
                "station": 0,
                "speed": float(v),
                "lane": 0,
                "length": 1.0,
            },
        )
        for i, (ts, v) in enumerate(sorted(raw))
    ]

    def outputs(call: AggCall) -> list[tuple]:
        window = OverWindow((call,), FrameUnits.RANGE, r, ("station",), active_expiration=True)
        return [(o.ts, o.row["seq"], o.row["v"]) for o in run(over_plan(window), rows).outputs]

    builtin = outputs(AggCall("max", (col("speed"),), "v"))
    uda = outputs(AggCall("window_max", (col("speed"),), "v", factory=WindowMax))

    # Arrivals (event time = the tuple's own ts, since r > 0) agree one for one; a tuple
    # deleted as dominated never expires, so the UDA's expirations are a subset.
    def arrival(o: tuple) -> bool:
        return rows[o[1]][1]["ts"] == o[0]

    assert [o for o in uda if arrival(o)] == [o for o in builtin if arrival(o)]
    assert set(uda) <= set(builtin)


def tag_rows(raw: list[tuple[int, str, int]], step_ms: int) -> list[dict]:
    """RFID readings from (step, tag type, door) triples, in time order."""
    return [
        {
            "tagid": f"t{i}",
            "tagtype": kind,
            "door": door,
            "tagtime": s * step_ms,
            "source": "r",
            "seq": i,
        }
        for i, (s, kind, door) in enumerate(sorted(raw))
    ]


@settings(max_examples=examples(100), deadline=None)
@given(
    raw=st.lists(
        st.tuples(st.integers(0, 30), st.sampled_from(["item", "ap"]), st.integers(0, 1)),
        max_size=25,
    ),
    delays=st.lists(st.integers(0, 1_000), min_size=25, max_size=25),
    restore_at=st.sets(st.integers(0, 24), max_size=4),
)
def test_theft_alarm_is_order_and_restore_independent(
    raw: list, delays: list, restore_at: set
) -> None:
    # Readings disordered within the 1 s slack, evaluators snapshotted and restored at
    # random points: the UDA's own state (covered items) and its inwindow survive.
    args = (col("tagid"), col("tagtype"), col("tagtime"))
    window = OverWindow(
        (AggCall("item_alarm", args, "alarm", factory=ItemAlarm),),
        FrameUnits.RANGE,
        5 * SECOND,
        ("door",),
        active_expiration=True,
    )
    (stage,) = over_plan(window, TAGS, extra=("tagid",)).stages()
    rows = tag_rows(raw, 500)
    arrival = sorted(range(len(rows)), key=lambda i: (rows[i]["tagtime"] + delays[i], i))

    def alarms(order: list[int], restore: set[int]) -> list[tuple]:
        evaluators: dict[int, KeyedEvaluator] = {}
        out: list[Output] = []
        high = -END_OF_TIME
        for n, i in enumerate(order):
            row = rows[i]
            evaluators.setdefault(row["door"], KeyedEvaluator(stage)).insert(dict(row))
            high = max(high, row["tagtime"])
            for ev in evaluators.values():
                out += ev.advance(high - TAGS.slack_ms)
            if n in restore:
                evaluators = {
                    d: KeyedEvaluator.restore(stage, ev.snapshot()) for d, ev in evaluators.items()
                }
        for ev in evaluators.values():
            out += ev.advance(END_OF_TIME)
        return sorted((o.ts, o.row["tagid"], o.row["alarm"]) for o in out)

    assert alarms(arrival, restore_at) == alarms(list(range(len(rows))), set())


@settings(max_examples=examples(150), deadline=None)
@given(
    raw=st.lists(
        st.tuples(st.integers(0, 60), st.sampled_from(["item", "ap"]), st.integers(0, 1)),
        max_size=30,
    ),
    uda=st.sampled_from(["item_alarm", "silence", "window_max"]),
    r=st.integers(1, 12),
)
def test_tuples_deleted_from_inwindow_leave_the_buffer_unseen(raw: list, uda: str, r: int) -> None:
    # With only ESL-shaped aggregates the frame keeps just what some inwindow holds: the
    # outputs are those of the unpruned frame, and the state holds no other tuple.
    calls = {
        "item_alarm": AggCall(
            "item_alarm", (col("tagid"), col("tagtype"), col("tagtime")), "v", factory=ItemAlarm
        ),
        "silence": AggCall("silence", (col("tagtime"),), "v", factory=Silence),
        "window_max": AggCall("window_max", (col("tagtime"),), "v", factory=WindowMax),
    }
    window = OverWindow((calls[uda],), FrameUnits.RANGE, r * 100, ("door",), active_expiration=True)
    (stage,) = over_plan(window, TAGS, extra=("tagid",)).stages()
    rows = tag_rows(raw, 50)

    def unpruned() -> OverOperator:
        # The planner's pieces but for the contents: all of the frame's tuples kept.
        frame = ExpiringFrame(MixedContents(window.aggregates, (EslSlot,)), r * 100)
        return OverOperator(frame, ExpiryOutputs(frame, window.aggregates, frame), None)

    planned = evaluator_pieces(stage)

    def outputs(prune: bool) -> list[tuple]:
        pieces = planned if prune else replace(planned, operator=unpruned)
        evaluators: dict[int, KeyedEvaluator] = {}
        out: list[Output] = []
        for row in rows:
            ev = evaluators.get(row["door"])
            if ev is None:
                ev = evaluators[row["door"]] = KeyedEvaluator(stage, pieces)
            ev.insert(dict(row))
            out += ev.advance(row["tagtime"])
            if prune:
                op = ev.operator
                assert isinstance(op, OverOperator)
                held = {uid for view in op.contents.views() if view for uid, _ in view.entries}
                assert {entry[0] for entry in op.contents.buffer} == held
        for ev in evaluators.values():
            out += ev.advance(END_OF_TIME)
        return [(o.ts, o.row["tagid"], o.row["v"], o.seq) for o in out]

    assert outputs(prune=True) == outputs(prune=False)


class ForgetsTwins(WindowAggregate):
    """Counts its inwindow; an expiring tuple deletes the later ones of its value from
    it, so that they never expire."""

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        return (len(inwindow) + 1,)

    def expire(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        oldest = inwindow.oldest()
        inwindow.delete(lambda t: t[0] == args[0] and t is not oldest)
        return ()


@settings(max_examples=examples(150), deadline=None)
@given(
    raw=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 2)), max_size=30),
    r=st.integers(1, 12),
)
def test_passive_expiry_of_a_pruned_frame_whose_expire_deletes(raw: list, r: int) -> None:
    # Passive expiry drops the tuples left behind the frame one by one; an expire that
    # deletes from inwindow prunes the buffer under that loop: the outputs are those of
    # the unpruned frame.
    calls = (AggCall("forgets_twins", (col("tagtype"),), "v", factory=ForgetsTwins),)
    window = OverWindow(calls, FrameUnits.RANGE, r * 100, ("door",))
    (stage,) = over_plan(window, TAGS, extra=("tagid",)).stages()
    rows = tag_rows([(t, str(v), 0) for t, v in raw], 50)

    def unpruned() -> OverOperator:
        frame = RangeFrame(MixedContents(calls, (EslSlot,)), r * 100)
        return OverOperator(frame, EveryTuple(frame, calls), None)

    planned = evaluator_pieces(stage)

    def outputs(prune: bool) -> list[tuple]:
        ev = KeyedEvaluator(stage, planned if prune else replace(planned, operator=unpruned))
        out: list[Output] = []
        for row in rows:
            ev.insert(dict(row))
            out += ev.advance(row["tagtime"])
        out += ev.advance(END_OF_TIME)
        return [(o.ts, o.row["tagid"], o.row["v"]) for o in out]

    assert outputs(prune=True) == outputs(prune=False)
