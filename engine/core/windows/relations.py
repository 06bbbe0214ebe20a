"""CQL windows of raw tuples read as a relation (:class:`plan.RelationWindow`) for one
key, with the query's relation-to-stream operator applied.

Every tuple is in R during an interval ``[enter, leave)`` of instants: for a time-based
window fixed by its ts (an :class:`Interval` piece per window form), for a ROWS window
from its arrival to the arrival that pushes it out. R changes only at those instants,
so the operator visits exactly them: arrivals (``arrive``, which also takes the entries
and leaves due at that instant) and timers (``fire``, the next ``enter`` of a waiting
tuple or ``leave`` of a member). At each such instant τ, with E the rows of the tuples
entering and L of those leaving (R changes if either is not empty), R(τ) - R(τ-1) =
E - L and R(τ-1) - R(τ) = L - E (bags): ISTREAM emits the first, DSTREAM the second,
RSTREAM all of R(τ), at event time τ (:mod:`engine.core.windows.streams`). A tuple's
rows are ``post`` applied to it once, on arrival; the results are final rows (the
evaluator runs no ``post`` on them).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from engine.core.plan import StatelessOp, compiled_ops
from engine.core.windows.base import Arrival, Operator, Result, Row
from engine.core.windows.frames import Band
from engine.core.windows.streams import StreamRows

Span = tuple[int, int | None]
"""``(enter, leave)`` of a tuple in R (leave None: never)."""


class Interval:
    """When a tuple at ``ts`` is in R: ``[ts, ∞)`` (a landmark, ``[RANGE UNBOUNDED]``)."""

    def __call__(self, ts: int) -> Span | None:
        """``(enter, leave)``, or None if the tuple is never in R."""
        return ts, None


class RangeInterval(Interval):
    """``[RANGE r [LAG d]]`` (``[NOW]``: r = 0): ``[ts + d, ts + d + r + 1)``."""

    def __init__(self, reach: int, lag: int) -> None:
        self.reach, self.lag = reach, lag

    def __call__(self, ts: int) -> Span | None:
        enter = ts + self.lag
        return enter, enter + self.reach + 1


class PeriodInterval(Interval):
    """``[RANGE UNBOUNDED RESET EVERY p]``: until the end of the tuple's period."""

    def __init__(self, every: int) -> None:
        self.every = every

    def __call__(self, ts: int) -> Span | None:
        return ts, (ts // self.every + 1) * self.every


class ExtentInterval(Interval):
    """``[RANGE r SLIDE s]``: in R(τ) iff in the extent ``[e - r, e)`` of e = the last
    multiple of s <= τ, i.e. from the first extent end after it to the first whose
    extent no longer holds it."""

    def __init__(self, reach: int, slide: int) -> None:
        self.reach, self.slide = reach, slide

    def __call__(self, ts: int) -> Span | None:
        slide = self.slide
        enter = (ts // slide + 1) * slide
        leave = ((ts + self.reach) // slide + 1) * slide
        return (enter, leave) if enter < leave else None


class BandedInterval(Interval):
    """``[SINCE a]`` / ``[UNTIL b]`` / ``[BETWEEN]``: only tuples within the band."""

    def __init__(self, inner: Interval, band: Band) -> None:
        self.inner, self.band = inner, band

    def __call__(self, ts: int) -> Span | None:
        return self.inner(ts) if self.band.admits(ts) else None


class _RelationOperator(Operator):
    """State: ``waiting``, tuples that have arrived but enter later (a lag, or an extent
    not yet ended), as ``(enter, leave, rows)``; ``members``, the tuples in R, as
    ``(leave, rows)``, both in arrival order (enter and leave grow with ts)."""

    def __init__(self, stream: StreamRows, post: tuple[StatelessOp, ...]) -> None:
        self.stream = stream
        self._rows = compiled_ops(post)  # a tuple's rows: post applied once, on arrival
        self.waiting: deque[tuple[int, int | None, list[Row]]] = deque()
        self.members: deque[tuple[int | None, list[Row]]] = deque()

    def _emit(self, now: int, entered: list[list[Row]], left: list[list[Row]]) -> list[Result]:
        """The outputs at ``now`` of tuples with these rows entering and leaving. R
        changes only if one of them has rows (a tuple the WHERE drops changes nothing)."""
        if not any(entered) and not any(left):
            return []
        return [(now, row) for row in self.stream(entered, left, self._whole)]

    def _whole(self) -> list[Row]:
        return [row for _, rows in self.members for row in rows]

    def next_timer(self) -> int | None:
        """The next instant where a waiting tuple enters or a member leaves."""
        times = []
        if self.waiting:
            times.append(self.waiting[0][0])
        if self.members and self.members[0][0] is not None:
            times.append(self.members[0][0])
        return min(times) if times else None

    def idle(self, watermark: int) -> bool:
        """No tuple waits to enter or is in R (members that never leave are not kept:
        nothing later reads them)."""
        return not self.waiting and not self.members

    def get_state(self) -> Any:
        """Plain data: the waiting tuples and the members, with their rows."""
        return (list(self.waiting), list(self.members))

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        waiting, members = state
        self.waiting, self.members = deque(waiting), deque(members)


class TimeRelationOperator(_RelationOperator):
    """A time-based window of raw tuples: each tuple's interval in R fixed by its ts.
    Members that never leave are not kept unless ``keep`` (RSTREAM needs them)."""

    def __init__(
        self, interval: Interval, keep: bool, stream: StreamRows, post: tuple[StatelessOp, ...]
    ) -> None:
        super().__init__(stream, post)
        self.interval, self.keep = interval, keep

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """The instant of the group: its tuples enter (now or later), others leave."""
        now = group[0][0]
        span = self.interval(now)
        entering: list[tuple[int | None, list[Row]]] = []
        if span is not None:
            enter, leave = span
            if enter == now:
                entering = [(leave, self._rows(row)) for _, row in group]
            else:
                self.waiting.extend((enter, leave, self._rows(row)) for _, row in group)
        return self._instant(now, entering)

    def _instant(self, now: int, entering: list[tuple[int | None, list[Row]]]) -> list[Result]:
        """Apply every change at instant ``now``: members leaving, waiting tuples and
        ``entering`` ones entering; return the relation-to-stream rows."""
        members, waiting = self.members, self.waiting
        left = []
        while members and members[0][0] == now:
            left.append(members.popleft()[1])
        entered = []
        while waiting and waiting[0][0] == now:
            _, leave, rows = waiting.popleft()
            entered.append((leave, rows))
        entered += entering
        if self.keep:
            members.extend(entered)
        return self._emit(now, [rows for _, rows in entered], left)

    def fire(self, instant: int) -> list[Result]:
        """The changes at ``instant`` (no tuple arrives then)."""
        return self._instant(instant, [])


class RowsRelationOperator(_RelationOperator):
    """``[ROWS n]`` / ``[PARTITION BY k ROWS n]``: a tuple is in R from its arrival to
    the arrival of the n-th later tuple of its partition; R moves by arrivals only."""

    def __init__(self, rows: int, stream: StreamRows, post: tuple[StatelessOp, ...]) -> None:
        super().__init__(stream, post)
        self.rows = rows

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """The group joins the window, the overflow leaves (the oldest first; new tuples
        beyond the last n are never in R)."""
        now = group[0][0]
        new = [self._rows(row) for _, row in group]
        overflow = len(self.members) + len(new) - self.rows
        left = [self.members.popleft()[1] for _ in range(min(max(overflow, 0), len(self.members)))]
        entered = new[max(overflow - len(left), 0) :]
        self.members.extend((None, rows) for rows in entered)
        return self._emit(now, entered, left)
