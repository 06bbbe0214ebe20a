"""The library's theft alarm (``rules.udas.ItemAlarm``) against ESL example 18 as the
paper writes it: a person's reading deletes the waiting items from ``inwindow``. The
library's version keeps cleared items until they expire and counts them instead; its
alarms must be the paper's, across snapshots, and from a state saved by the version
that still deleted them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.aggregates import InWindow, WindowAggregate
from engine.core.evaluator import KeyedEvaluator, Output
from engine.core.plan import END_OF_TIME, AggCall, FrameUnits, OverWindow, Stage
from rules.udas import ItemAlarm
from tests.engine.helpers import col, over_plan
from tests.engine.test_active_expiration import TAGS
from tests.engine.test_active_expiration import ItemAlarm as PaperItemAlarm
from tests.examples import examples


class DeletingItemAlarm(WindowAggregate):
    """The library's earlier version, whose saved states a running engine may hold:
    cleared items deleted from inwindow, covered items counted, no item counts."""

    def __init__(self) -> None:
        self.covered: Counter[tuple[Any, Any]] = Counter()
        self.persons = 0

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        tagid, tagtype, tagtime = args
        if tagtype == "ap":
            self.persons += 1
            inwindow.delete(self._clear)
        elif tagtype == "item" and self.persons:
            self.covered[(tagid, tagtime)] += 1
        return ()

    def _clear(self, item: tuple[Any, ...]) -> bool:
        if item[1] != "item":
            return False
        self.covered[(item[0], item[2])] -= 1
        self.covered += Counter()  # drops counts at zero
        return True

    def expire(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        tagid, tagtype, tagtime = args
        if tagtype == "ap":
            self.persons -= 1
            return ()
        if tagtype != "item":
            return ()
        if self.covered[(tagid, tagtime)] > 0:
            self.covered[(tagid, tagtime)] -= 1
            self.covered += Counter()
            return ()
        self.covered += Counter()
        return ("larceny alarm",)


def stage(factory: type[WindowAggregate]) -> Stage:
    """``item_alarm(tagid, tagtype, tagtime) OVER (PARTITION BY door RANGE 5 SECONDS
    PRECEDING ACTIVE EXPIRATION)`` with this implementation."""
    args = (col("tagid"), col("tagtype"), col("tagtime"))
    window = OverWindow(
        (AggCall("item_alarm", args, "alarm", factory=factory),),
        FrameUnits.RANGE,
        5_000,
        ("door",),
        active_expiration=True,
    )
    (only,) = over_plan(window, TAGS, extra=("tagid",)).stages()
    return only


def alarms(rows: list[dict], stages: list[Stage], switch_at: int, restore_at: set[int]) -> list:
    """Run the rows through evaluators of ``stages[0]`` until row ``switch_at``, then of
    ``stages[-1]`` from a snapshot, snapshotting and restoring after each row in
    ``restore_at``; every alarm as (ts, tagid, door, value)."""
    evaluators: dict[int, KeyedEvaluator] = {}
    out: list[Output] = []
    current = stages[0]
    for n, row in enumerate(rows):
        if n == switch_at:
            current = stages[-1]
            evaluators = {
                d: KeyedEvaluator.restore(current, e.snapshot()) for d, e in evaluators.items()
            }
        evaluators.setdefault(row["door"], KeyedEvaluator(current)).insert(dict(row))
        for ev in evaluators.values():
            out += ev.advance(row["tagtime"])
        if n in restore_at:
            evaluators = {
                d: KeyedEvaluator.restore(current, e.snapshot()) for d, e in evaluators.items()
            }
    for ev in evaluators.values():
        out += ev.advance(END_OF_TIME)
    return sorted((o.ts, o.row["tagid"], o.row["door"], o.row["alarm"]) for o in out)


readings = st.lists(
    st.tuples(
        st.integers(0, 120),  # 250 ms steps: a 5 s window holds 20
        st.sampled_from(["item", "item", "ap", "case"]),
        st.integers(0, 1),  # door
        st.integers(0, 3),  # tag id: the same item read again
    ),
    max_size=40,
)


@settings(max_examples=examples(1000), deadline=None)
@given(raw=readings, restore_at=st.sets(st.integers(0, 39), max_size=4), data=st.data())
def test_the_library_alarm_is_the_papers(raw: list, restore_at: set[int], data: Any) -> None:
    rows = [
        {"tagid": f"t{tag}", "tagtype": kind, "door": door, "tagtime": step * 250,
         "source": "r", "seq": i}
        for i, (step, kind, door, tag) in enumerate(sorted(raw))
    ]  # fmt: skip
    expected = alarms(rows, [stage(PaperItemAlarm)], 0, set())
    assert alarms(rows, [stage(ItemAlarm)], 0, restore_at) == expected
    # From a state the deleting version saved, switched to at any row.
    switch_at = data.draw(st.integers(0, max(len(rows) - 1, 0)))
    legacy = [stage(DeletingItemAlarm), stage(ItemAlarm)]
    assert alarms(rows, legacy, switch_at, restore_at) == expected
