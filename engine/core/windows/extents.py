"""Domain-driven windows (``FROM s [RANGE r SLIDE s] GROUP BY g``) for one group: the
extents ``[e - r, e)`` for every multiple e of the slide (WID's extents), each emitted
once, when the watermark passes its end. :class:`ExtentOperator` keeps the extent's
tuples; :class:`PaneExtentOperator` keeps pane partials (algebraic aggregates)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from engine.core.aggregates import IncrementalAggregate
from engine.core.plan import END_OF_TIME, ExtentWindow
from engine.core.windows.base import Arrival, Operator, Result, Row, combine
from engine.core.windows.contents import Contents, Pending
from engine.core.windows.panes import PaneQueue, pane_accumulator


class ExtentColumns(NamedTuple):
    """Extents' results column by column (:meth:`PaneExtentOperator.run_columns`):
    ``ends`` (each extent's end, its event ts) and ``columns``, the names a result row
    would have (group key, ``window_start``, ``window_end``, aggregate aliases) to one
    value per extent."""

    ends: list[int]
    columns: dict[str, list[Any]]


class ExtentOperator(Operator):
    """A domain-driven window (``FROM s [RANGE r SLIDE s] GROUP BY g``) for one group.

    Extent ``[e - r, e)`` is a RANGE frame read at its last instant ``e - 1``: tuples are
    accumulated on arrival, and the timer at ``e - 1`` (after every tuple at that
    instant) retracts those below ``e - r`` and emits one row if the extent is not
    empty. ESL-shaped aggregates give their result through ``terminate``. After a
    non-empty extent (``showing``), the next extent end fires even if empty, so that a
    relation-to-stream DSTREAM sees the group's row go.
    """

    def __init__(self, contents: Contents, window: ExtentWindow) -> None:
        self.contents = contents
        self.calls = window.aggregates
        self.window = window
        self.key: dict[str, Any] | None = None
        self.closed = -END_OF_TIME  # end of the last extent closed
        self.showing = False  # whether that extent had rows

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Accumulate the group; extents are emitted by timers."""
        ts = group[0][0]
        add = self.contents.add
        for _, row in group:
            if self.key is None:
                self.key = {c: row[c] for c in self.window.group_by}
            add(ts, row, False, True)
        return []

    def next_timer(self) -> int | None:
        """The last instant of the next extent that may hold the oldest buffered tuple, or
        of the one right after a non-empty extent."""
        slide = self.window.slide_ms
        if self.showing:
            return self.closed + slide - 1
        buffer = self.contents.buffer
        if not buffer:
            return None
        end = (max(buffer[0][1], self.closed) // slide + 1) * slide
        return end - 1

    def fire(self, instant: int) -> list[Result]:
        """Close the extent ending at ``instant + 1``."""
        end = instant + 1
        start = end - self.window.range_ms
        contents = self.contents
        contents.drop_before(start)
        self.closed = end
        self.showing = bool(contents.buffer)
        if not contents.buffer:
            return []
        row = {**(self.key or {}), "window_start": start, "window_end": end}
        return combine(end, row, self.calls, contents.terminate())

    def settle(self, watermark: int) -> None:
        """Tuples leave at extent closes (timers), never in between."""

    def idle(self, watermark: int) -> bool:
        """Every extent holding a tuple has closed, the empty one after it too (a
        relation sees the group go): a later tuple's extents begin after ``closed``.
        Nothing survives: ``closed`` lies before every later tuple's extents."""
        return not self.showing and self.contents.at_rest()

    def get_state(self) -> Any:
        """The contents' state plus the group key and the last extent closed."""
        return (self.contents.get_state(), self.key, self.closed, self.showing)

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        base, self.key, self.closed, self.showing = state
        self.contents.set_state(base)


class PaneExtentOperator(Operator):
    """Extents ``[e - r, e)`` (``FROM s [RANGE r SLIDE s]``) over algebraic aggregates, by
    panes: ESL example 15's cascade of a tumble and a pane-less window, for logical
    windows (ESL §5.1, "similar optimization can also be applied in the case of logical
    windows"). Time is cut into panes ``[j*g, (j+1)*g)`` with ``g = gcd(r, s)``, aligned
    to the epoch like the extents, so every extent is exactly the ``r / g`` panes before
    its end: each pane keeps one partial per call (the tumble), and an extent's result
    is the merge of its panes (the window over panes), slid through a
    :class:`~engine.core.windows.panes.PaneQueue`. State: at most ``r / g + 2`` partials
    per call against every tuple of the last ``r`` for :class:`ExtentOperator`; results
    equal its results up to float round-off (partials merge, tuples are not retracted).
    Timers, the group key, ``closed`` and ``showing`` work as in :class:`ExtentOperator`.
    """

    def __init__(self, window: ExtentWindow) -> None:
        self.window = window
        self.calls = window.aggregates
        self.pane_ms = math.gcd(window.range_ms, window.slide_ms)
        self._add = pane_accumulator(self.calls)
        self._aliases = [c.alias for c in self.calls]
        self.queue = PaneQueue(self.calls)
        self.current: list[IncrementalAggregate] | None = None  # the newest, open pane
        self.current_index = 0
        self.key: dict[str, Any] | None = None
        self.closed = -END_OF_TIME
        self.showing = False

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Accumulate the group into its pane; extents are emitted by timers. A tuple in
        no extent still to close (in a gap when the slide exceeds the range) is not
        kept, so the state stays within ``r / g`` panes."""
        ts = group[0][0]
        entries = [(ts, "", 0, 0, row) for _, row in group]
        self._drive(entries, 0, len(entries), ts + 1, None)
        return []

    def run(self, pending: Pending, i: int, n: int, watermark: int) -> tuple[int, list[Result]]:
        """Every arrival and extent close below ``watermark``, in time order, from the
        evaluator's sorted ``pending`` entries ``(ts, source, seq, tiebreak, row)`` at
        index ``i`` (below ``n``): what the evaluator's loop does with ``arrive_slot`` and
        ``fire``, in one loop for an evaluator with no hook per close (no relation
        reading; a sliding window closes an extent per slide). An arrival at an extent's
        last instant comes before its close. Returns the index after the last arrival
        taken and the extents' results."""
        results: list[Result] = []
        append, row = results.append, self._row
        i = self._drive(
            pending, i, n, watermark, lambda end, values: append((end, row(end, values)))
        )
        return i, results

    def run_columns(
        self, pending: Pending, i: int, n: int, watermark: int
    ) -> tuple[int, ExtentColumns]:
        """:meth:`run` with the extents' results as columns: no row per extent, for a
        query that only copies the result's columns (a slide of 1 s closes a million
        extents in 12 days of readings)."""
        ends: list[int] = []
        values: list[list[Any]] = []
        add_end, add_values = ends.append, values.append

        def closed(end: int, extent: list[Any]) -> None:
            add_end(end)
            add_values(extent)

        i = self._drive(pending, i, n, watermark, closed)
        reach = self.window.range_ms
        columns = {name: [value] * len(ends) for name, value in (self.key or {}).items()}
        columns["window_start"] = [end - reach for end in ends]
        columns["window_end"] = ends
        by_call = zip(*values, strict=True) if values else [()] * len(self._aliases)
        columns.update(zip(self._aliases, map(list, by_call), strict=True))
        return i, ExtentColumns(ends, columns)

    def arrive_slot(self, pending: Pending, i: int, n: int, watermark: int) -> int:
        """``arrive`` for a run of the evaluator's sorted ``pending`` entries ``(ts,
        source, seq, tiebreak, row)`` from index ``i`` (below ``n``): those below
        ``watermark`` that come before the next timer. Returns the index after the run;
        no outputs (extents are emitted by timers)."""
        return self._drive(pending, i, n, watermark, None)

    def _drive(
        self,
        pending: Pending,
        i: int,
        n: int,
        watermark: int,
        closed: Callable[[int, list[Any]], None] | None,
    ) -> int:
        """Arrivals from ``pending[i:n]`` below ``watermark`` in time order, with the
        extent closes due between them, each handed to ``closed(end, values)`` (with
        ``closed`` None, up to the first close due). One loop for both: it runs per
        slide, and calls between its steps cost more here than the steps. Only a tuple
        that opens a pane can move the next close, and only while no extent is showing
        (then the next close is one slide after the last)."""
        pane_ms, add, queue = self.pane_ms, self._add, self.queue
        slide, reach = self.window.slide_ms, self.window.range_ms
        if self.key is None and i < n:
            self.key = {c: pending[i][4][c] for c in self.window.group_by}
        while True:
            timer = self.closed + slide - 1 if self.showing else self.next_timer()
            due = timer is not None and timer < watermark
            stop = timer + 1 if due else watermark  # type: ignore[operator]
            current, index = self.current, self.current_index
            while i < n and (ts := pending[i][0]) < stop:
                if current is None or ts // pane_ms != index:
                    # A new pane. Extents ending at or before `ts` are closed (their
                    # timers came first), so panes before the next one's start can go.
                    low = ((ts // slide + 1) * slide - reach) // pane_ms
                    if ts // pane_ms < low:  # in no extent still to close: not kept
                        i += 1
                        continue
                    if current is not None:
                        queue.push(index, current)
                    queue.evict_before(low)
                    index = ts // pane_ms
                    current = self.current = queue.fresh()
                    self.current_index = index
                    if not self.showing:  # the pane may move the next close
                        add(current, pending[i][4])
                        i += 1
                        break
                add(current, pending[i][4])
                i += 1
            else:
                if not (due and closed is not None):
                    return i
                values = self._close(timer)  # type: ignore[arg-type]
                if values is not None:
                    closed(timer + 1, values)  # type: ignore[operator]

    def _close_pane(self) -> None:
        if self.current is not None:
            self.queue.push(self.current_index, self.current)
            self.current = None

    def partials(self) -> int:
        """How many partial aggregates (per call) the operator holds."""
        return len(self.queue) + 1 + (self.current is not None)

    def next_timer(self) -> int | None:
        """As :meth:`ExtentOperator.next_timer`, with the oldest pane's start for the
        oldest tuple's time (the same extent end: panes divide the slide)."""
        slide = self.window.slide_ms
        if self.showing:
            return self.closed + slide - 1
        oldest = self.queue.oldest()
        if oldest is None:
            if self.current is None:
                return None
            oldest = self.current_index
        return (max(oldest * self.pane_ms, self.closed) // slide + 1) * slide - 1

    def fire(self, instant: int) -> list[Result]:
        """Close the extent ending at ``instant + 1``: its panes are complete."""
        values = self._close(instant)
        return [] if values is None else [(instant + 1, self._row(instant + 1, values))]

    def _close(self, instant: int) -> list[Any] | None:
        """Close the extent ending at ``instant + 1``; its aggregates' values, one per
        call (None when it holds no tuple: nothing to show)."""
        end = instant + 1
        self._close_pane()
        queue = self.queue
        queue.evict_before((end - self.window.range_ms) // self.pane_ms)
        self.closed = end
        self.showing = len(queue) > 0
        # Incremental aggregates give one value each: one row, no combinations.
        return queue.values() if self.showing else None

    def _row(self, end: int, values: list[Any]) -> Row:
        row = {**(self.key or {}), "window_start": end - self.window.range_ms, "window_end": end}
        row.update(zip(self._aliases, values, strict=True))
        return row

    def settle(self, watermark: int) -> None:
        """Panes leave at extent closes (timers), never in between."""

    def idle(self, watermark: int) -> bool:
        """No pane left and the empty extent after the last one closed (as
        :meth:`ExtentOperator.idle`)."""
        return not self.showing and self.current is None and not len(self.queue)

    def get_state(self) -> Any:
        """The panes' partials, the open pane, the group key and the last extent closed."""
        current = None if self.current is None else [a.get_state() for a in self.current]
        return (
            self.queue.get_state(),
            current,
            self.current_index,
            self.key,
            self.closed,
            self.showing,
        )

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        queue, current, self.current_index, self.key, self.closed, self.showing = state
        self.queue.set_state(queue)
        self.current = None if current is None else self.queue.restored(current)

    def restore_state(self, state: Any, version: int) -> None:
        """Version 5 (from before extents ran on panes) saved an :class:`ExtentOperator`
        state: its buffered tuples' arguments are accumulated pane by pane."""
        if version > 5:
            self.set_state(state)
            return
        (buffer, *_), self.key, self.closed, self.showing = state
        for _, ts, _, args in buffer:
            index = ts // self.pane_ms
            if self.current is None or index != self.current_index:
                self._close_pane()
                self.current, self.current_index = self.queue.fresh(), index
            for agg, a in zip(self.current, args, strict=True):
                agg.accumulate(*a)
