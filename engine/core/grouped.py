"""A CQL tuple-based window grouped by any columns (:class:`RowsGroupWindow`).

Two pieces: the window, the last n tuples of each partition as a queue of (tuple id,
group), and one :class:`GroupFrame` per group holding the group's tuples that are in
the window and its aggregates. A tuple entering pushes at most one tuple out of its
partition's queue, and that one leaves its own group's frame. The operator hands the
evaluator the whole relation (every group's row) at each instant with arrivals; the
evaluator's relation-to-stream step diffs it with the previous one (CQL §5.1).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from engine.core.aggregates import IncrementalAggregate, make_aggregate
from engine.core.plan import AggCall, RowsGroupWindow
from engine.core.windows.base import Arrival, Operator, Result, Row
from engine.core.windows.contents import args_reader

Args = tuple[tuple[Any, ...], ...]
"""One tuple's argument tuple per aggregate call."""


def _fresh(calls: tuple[AggCall, ...]) -> list[IncrementalAggregate]:
    aggs: list[IncrementalAggregate] = []
    for call in calls:
        agg = make_aggregate(call.name, call.factory)
        if not isinstance(agg, IncrementalAggregate):
            raise ValueError(f"'{call.name}' over a grouped ROWS window must be incremental")
        aggs.append(agg)
    return aggs


class GroupFrame:
    """One group's tuples in the window (oldest first) and its aggregates over them."""

    def __init__(self, calls: tuple[AggCall, ...]) -> None:
        self.calls = calls
        self.aggs = _fresh(calls)
        self.tuples: deque[tuple[int, Args]] = deque()

    def enter(self, uid: int, args: Args) -> None:
        """Add the tuple ``uid`` (the newest of the group)."""
        self.tuples.append((uid, args))
        for agg, a in zip(self.aggs, args, strict=True):
            agg.accumulate(*a)

    def leave(self, uid: int) -> None:
        """Remove the tuple ``uid``. Aggregates retract only their oldest tuple, which
        it is unless the group spans partitions (a partition's tuple can leave before
        an older one of another): then the aggregates are rebuilt from the rest."""
        if self.tuples[0][0] == uid:
            for agg, a in zip(self.aggs, self.tuples.popleft()[1], strict=True):
                agg.retract(*a)
            return
        self.tuples = deque(t for t in self.tuples if t[0] != uid)
        self.aggs = _fresh(self.calls)
        for _, args in self.tuples:
            for agg, a in zip(self.aggs, args, strict=True):
                agg.accumulate(*a)

    def values(self) -> list[Any]:
        """The aggregates' values, one per call."""
        return [agg.get_value() for agg in self.aggs]


class RowsGroupOperator(Operator):
    """``FROM s [ROWS n] GROUP BY g`` / ``[PARTITION BY p ROWS n] GROUP BY g`` for one
    evaluator (all partitions, or one when every group lies inside one partition).
    Tuples leave on arrivals only: no timers, and nothing survives eviction (tuple ids
    count only among themselves)."""

    def __init__(self, window: RowsGroupWindow) -> None:
        if window.rows < 1:
            raise ValueError("a ROWS window holds at least one row")
        self.window = window
        self.calls = window.aggregates
        _fresh(self.calls)  # refuse aggregates that cannot retract, at construction
        self._read_args = args_reader(self.calls)
        self.added = 0  # tuples ever added: their ids
        # Per partition value, its tuples in the window, oldest first: (id, group value).
        self.windows: dict[tuple[Any, ...], deque[tuple[int, tuple[Any, ...]]]] = {}
        # Per group value with tuples in the window, in order of first entry (the order
        # of R's rows, which depends on the input only).
        self.groups: dict[tuple[Any, ...], GroupFrame] = {}

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Let a peer group (equal ts) enter in order; return R after the instant."""
        w = self.window
        for _, row in group:
            self.added += 1
            key = tuple(row[c] for c in w.group_by)
            frame = self.groups.get(key)
            if frame is None:
                frame = self.groups[key] = GroupFrame(self.calls)
            frame.enter(self.added, self._read_args(row))
            queue = self.windows.setdefault(tuple(row[c] for c in w.partition_by), deque())
            queue.append((self.added, key))
            if len(queue) > w.rows:
                uid, gone = queue.popleft()
                self.groups[gone].leave(uid)
                if not self.groups[gone].tuples:
                    del self.groups[gone]
        ts = group[0][0]
        return [(ts, self._row(key, frame)) for key, frame in self.groups.items()]

    def _row(self, key: tuple[Any, ...], frame: GroupFrame) -> Row:
        row = dict(zip(self.window.group_by, key, strict=True))
        row.update(zip((c.alias for c in self.calls), frame.values(), strict=True))
        return row

    def idle(self, watermark: int) -> bool:
        """Only before its first tuple: a ROWS window's tuples stay for the next ones."""
        return not self.windows and not self.groups

    def get_state(self) -> Any:
        """Plain data: the id counter, the partitions' queues, the groups' tuples and
        aggregate states (groups in their order)."""
        return (
            self.added,
            [(p, list(q)) for p, q in self.windows.items()],
            [
                (key, list(f.tuples), [a.get_state() for a in f.aggs])
                for key, f in self.groups.items()
            ],
        )

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        self.added, windows, groups = state
        self.windows = {p: deque(q) for p, q in windows}
        self.groups = {}
        for key, tuples, aggs in groups:
            frame = self.groups[key] = GroupFrame(self.calls)
            frame.tuples = deque(tuples)
            for agg, saved in zip(frame.aggs, aggs, strict=True):
                agg.set_state(saved)
