"""Panes (ESL §5.1, example 15): a window over algebraic aggregates cut into panes,
one partial aggregate per call each, whose merges give the window's values, so the
state is a few partials instead of the window's tuples.

:class:`PaneQueue` slides pane partials through two stacks with ``merge`` only;
:class:`PaneOperator` runs ``ROWS n PRECEDING SLIDE s`` on it (extents on panes:
:class:`~engine.core.windows.extents.PaneExtentOperator`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from engine.core.aggregates import IncrementalAggregate, make_aggregate
from engine.core.plan import AggCall
from engine.core.windows.base import Arrival, Operator, Result, Row, combine
from engine.core.windows.contents import args_reader


def pane_accumulator(
    calls: tuple[AggCall, ...],
) -> Callable[[list[IncrementalAggregate], Row], None]:
    """A function adding one row to a pane's partials (one per call), with the one-call,
    one-argument shape (``avg(speed)``) done without argument tuples: it runs per tuple."""
    if len(calls) == 1 and len(calls[0].args) == 1:
        only = calls[0].args[0]

        def add_one(pane: list[IncrementalAggregate], row: Row) -> None:
            pane[0].accumulate(only(row))

        return add_one
    read = args_reader(calls)

    def add(pane: list[IncrementalAggregate], row: Row) -> None:
        for agg, args in zip(pane, read(row), strict=True):
            agg.accumulate(*args)

    return add


def _incremental(call: AggCall) -> IncrementalAggregate:
    agg = make_aggregate(call.name, call.factory)
    assert isinstance(agg, IncrementalAggregate)
    return agg


def maker(call: AggCall) -> Callable[[], IncrementalAggregate]:
    """What makes the call's incremental aggregate (checked once, here)."""
    first = _incremental(call)
    return call.factory if call.factory is not None else type(first)  # type: ignore[return-value]


class PaneQueue:
    """A FIFO of pane partials ``(pane index, one partial per call)`` whose total merge is
    read in O(1) amortised with ``merge`` only: ``back`` holds the newest panes and their
    running merge ``back_total``; ``front`` holds suffix merges of the oldest ones
    (oldest on top), rebuilt from ``back`` when it runs dry."""

    def __init__(self, calls: tuple[AggCall, ...]) -> None:
        self.calls = calls
        # A pane per slide can mean a partial per output: construct, don't look up.
        self.makers = tuple(maker(c) for c in calls)
        self.reads_merged = all(agg.merged_value is not None for agg in self.fresh())
        self.front: list[tuple[int, list[IncrementalAggregate]]] = []
        self.back: list[tuple[int, list[IncrementalAggregate]]] = []
        self.back_total = self.fresh()

    def fresh(self) -> list[IncrementalAggregate]:
        """New partials, one per call."""
        return [make() for make in self.makers]

    def merged(self, *parts: list[IncrementalAggregate]) -> list[IncrementalAggregate]:
        """A fresh partial merging ``parts``, oldest first."""
        total = self.fresh()
        for part in parts:
            for agg, partial in zip(total, part, strict=True):
                agg.merge(partial)
        return total

    def __len__(self) -> int:
        return len(self.front) + len(self.back)

    def push(self, index: int, pane: list[IncrementalAggregate]) -> None:
        """Append the newest pane."""
        self.back.append((index, pane))
        for agg, partial in zip(self.back_total, pane, strict=True):
            agg.merge(partial)

    def oldest(self) -> int | None:
        """The index of the oldest pane (None when empty)."""
        if self.front:
            return self.front[-1][0]
        return self.back[0][0] if self.back else None

    def evict_before(self, index: int) -> None:
        """Drop the panes older than ``index``."""
        front = self.front
        while front and front[-1][0] < index:  # the usual case: one pane, from the top
            front.pop()
        back = self.back
        if front or not back or back[0][0] >= index:  # `front` holds the oldest panes
            return
        # Each pane absorbs the newer ones' merge in place: once in `front` only its
        # suffix merge is read (`back_total` no longer holds it).
        suffix: list[IncrementalAggregate] | None = None
        for j, pane in reversed(back):
            if suffix is not None:
                for agg, newer in zip(pane, suffix, strict=True):
                    agg.merge(newer)
            suffix = pane
            front.append((j, pane))
        self.back, self.back_total = [], self.fresh()
        while front and front[-1][0] < index:
            front.pop()

    def values(self) -> list[Any]:
        """Each call's value over every pane held. With panes on both stacks the two
        partials are read through ``merged_value`` when every aggregate has it, else
        through a fresh merge (this runs once per slide)."""
        if not (self.front and self.back):
            only = self.front[-1][1] if self.front else self.back_total
            return [agg.get_value() for agg in only]
        older, newer = self.front[-1][1], self.back_total
        if self.reads_merged:
            return [a.merged_value(b) for a, b in zip(older, newer, strict=True)]  # type: ignore[misc]
        return [agg.get_value() for agg in self.merged(older, newer)]

    def get_state(self) -> Any:
        """The panes' partials as plain data."""

        def states(part: list[IncrementalAggregate]) -> list[Any]:
            return [a.get_state() for a in part]

        return (
            [(j, states(p)) for j, p in self.front],
            [(j, states(p)) for j, p in self.back],
            states(self.back_total),
        )

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        front, back, back_total = state
        self.front = [(j, self.restored(p)) for j, p in front]
        self.back = [(j, self.restored(p)) for j, p in back]
        self.back_total = self.restored(back_total)

    def restored(self, states: list[Any]) -> list[IncrementalAggregate]:
        """Partials with these states."""
        aggs = self.fresh()
        for agg, st in zip(aggs, states, strict=True):
            agg.set_state(st)
        return aggs


class PaneOperator(Operator):
    """``ROWS n PRECEDING SLIDE s`` over algebraic aggregates, by panes (ESL §5.1, ex. 15).

    The stream is cut into panes of ``g = gcd(n + 1, s)`` rows, each summarised by one
    partial aggregate per call instead of its tuples; every yield tuple ends a pane, and
    its window is exactly the last ``k = (n + 1) / g`` panes. The panes slide through a
    :class:`PaneQueue` (only ``merge`` needed, no inverse), so a yield costs O(1)
    merges amortised. State: at most
    ``k + 2`` partials per call (``window / slide + 2`` when the slide divides the
    window) against ``n + 1`` buffered tuples without panes. Outputs equal
    :class:`OverOperator`'s up to float round-off (partials merge, not retract).
    """

    def __init__(self, calls: tuple[AggCall, ...], preceding: int, slide: int) -> None:
        self.calls = calls
        self.slide = slide
        self.pane_rows = math.gcd(preceding + 1, slide)
        self.per_window = (preceding + 1) // self.pane_rows
        self._add = pane_accumulator(calls)
        self.queue = PaneQueue(calls)  # completed panes, numbered from 0
        self.current = self.queue.fresh()
        self.arrived = 0

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Accumulate into the open pane; at each yield tuple, read the window's panes."""
        out: list[Result] = []
        for ts, row in group:
            self._add(self.current, row)
            self.arrived += 1
            if self.arrived % self.pane_rows:
                continue
            done = self.arrived // self.pane_rows  # panes completed, this one included
            self.queue.push(done - 1, self.current)
            self.current = self.queue.fresh()
            self.queue.evict_before(done - self.per_window)
            if self.arrived % self.slide == 0:
                values = [[v] for v in self.queue.values()]
                out.extend(combine(ts, row, self.calls, values))
        return out

    def partials(self) -> int:
        """How many partial aggregates (per call) the operator holds."""
        return len(self.queue) + 2

    def idle(self, watermark: int) -> bool:
        """Only before its first tuple: a ROWS frame's tuples stay for the next ones."""
        return self.arrived == 0

    def get_state(self) -> Any:
        """The partials' states and the arrival count (pane numbers follow from it)."""
        front, back, back_total = self.queue.get_state()
        return (
            [p for _, p in front],
            [p for _, p in back],
            back_total,
            [a.get_state() for a in self.current],
            self.arrived,
        )

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        front, back, back_total, current, self.arrived = state
        # `back` holds the newest completed panes, `front` the ones before, oldest last.
        first_back = self.arrived // self.pane_rows - len(back)
        self.queue.set_state(
            (
                [(first_back - 1 - k, p) for k, p in enumerate(front)],
                [(first_back + k, p) for k, p in enumerate(back)],
                back_total,
            )
        )
        self.current = self.queue.restored(current)
