"""Frames: which tuples a data-driven window (``agg OVER (...)``) holds, and when they
enter and leave it (Patroumpas & Sellis' scopes; ESL §4).

One piece per frame form; the planner picks it and wraps it in :class:`LaggedRowsFrame`
or :class:`ResettingFrame` where the window says so:

* ROWS n (:class:`RowsFrame`: the overflow of n + 1 rows leaves on arrival) or ROWS
  UNBOUNDED (:class:`UnboundedRowsFrame`), the tuple ``lag`` rows back entering instead
  of the new one (:class:`LaggedRowsFrame`); ROWS tuples read the aggregates' values as
  they enter;
* RANGE r with passive expiry (:class:`RangeFrame`: a tuple at ``t`` leaves at instant
  ``t + r``, silently), with a lag delaying both (:class:`LaggedRangeFrame`), or with
  active expiration (:class:`ExpiringFrame`: it leaves by a timer, and the window's
  outputs say so);
* RANGE UNBOUNDED, a landmark (:class:`LandmarkFrame`, :class:`LaggedLandmarkFrame`),
  within fixed SINCE/UNTIL bounds (:class:`Band`);
* a periodic reset (:class:`ResettingFrame`) around any of them.

RANGE peers (equal ts) all read the values after the last one: a RANGE frame hands the
emit piece each tuple's raw emissions and its ``values`` fills them in for the outputs
kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from engine.core.windows.base import Arrival, Emissions, Row
from engine.core.windows.contents import Contents

Entered = list[tuple[Row, Emissions]]
"""Each tuple of a peer group with what it made the calls emit."""


def as_read(emitted: Emissions) -> Emissions:
    """The values of a tuple whose frame read them as it entered (ROWS)."""
    return emitted


class Band:
    """Fixed bounds ``since <= ts <= until`` (either may be None: unbounded)."""

    def __init__(self, since: int | None, until: int | None) -> None:
        self.since, self.until = since, until

    def admits(self, ts: int) -> bool:
        """Whether a tuple at ``ts`` lies within the bounds."""
        return (self.since is None or self.since <= ts) and (self.until is None or ts <= self.until)


class Frame:
    """A frame over ``contents``; ``waiting`` holds the tuples that arrived but enter
    later (a lag), oldest first."""

    def __init__(self, contents: Contents) -> None:
        self.contents = contents
        self.waiting: deque[Arrival] = deque()
        self.values: Callable[[Emissions], Emissions] = contents.values

    def enter(self, ts: int, group: list[Arrival]) -> Entered:
        """Take one peer group at ``ts``; each tuple with its emissions."""
        raise NotImplementedError

    def settle(self, watermark: int) -> None:
        """Run the silent events below ``watermark`` (none by default)."""

    def restart(self) -> None:
        """Empty the window (a reset period begins); waiting tuples stay."""
        self.contents.restart()

    def idle(self, watermark: int) -> bool:
        """Whether the frame, nothing waiting, gives what a new one would."""
        return self.contents.at_rest()

    def idle_wakeup(self) -> int | None:
        """None: time alone never empties the frame."""
        return None

    def get_state(self) -> tuple[list[Arrival], int | None]:
        """The waiting tuples and the reset period (None: no reset)."""
        return list(self.waiting), None

    def set_state(self, waiting: list[Arrival], period: int | None) -> None:
        """Restore what ``get_state`` returned."""
        self.waiting.clear()  # in place: a wrapper shares the deque
        self.waiting.extend(waiting)


class _TupleFrame(Frame):
    """A ROWS frame: tuples enter one by one and read the values as they enter."""

    def __init__(self, contents: Contents) -> None:
        super().__init__(contents)
        self.values = as_read

    def enter(self, ts: int, group: list[Arrival]) -> Entered:
        values, enter = self.contents.values, self.enter_one
        return [(row, values(enter(ts, row))) for _, row in group]

    def enter_one(self, ts: int, row: Row) -> Emissions:
        """One tuple's arrival."""
        raise NotImplementedError


class RowsFrame(_TupleFrame):
    """``ROWS n PRECEDING``: the row and the n before it."""

    def __init__(self, contents: Contents, preceding: int) -> None:
        super().__init__(contents)
        self.preceding = preceding

    def enter_one(self, ts: int, row: Row) -> Emissions:
        contents = self.contents
        while len(contents.buffer) > self.preceding:
            contents.expire_oldest()
        return contents.add(ts, row, False, True)


class UnboundedRowsFrame(_TupleFrame):
    """``ROWS UNBOUNDED PRECEDING``: nothing leaves (nor is kept to leave)."""

    def enter_one(self, ts: int, row: Row) -> Emissions:
        return self.contents.add(ts, row, False, False)


class LaggedRowsFrame(_TupleFrame):
    """``ROWS ... LAG d``: each arrival lets the tuple ``d`` rows back enter ``inner``."""

    def __init__(self, inner: _TupleFrame, lag: int) -> None:
        super().__init__(inner.contents)
        self.inner, self.lag = inner, lag

    def enter_one(self, ts: int, row: Row) -> Emissions:
        self.waiting.append((ts, row))
        if len(self.waiting) <= self.lag:
            return [[] for _ in self.contents.calls]
        ts, row = self.waiting.popleft()
        return self.inner.enter_one(ts, row)


class RangeFrame(Frame):
    """``RANGE r PRECEDING``, passive expiry: a tuple at ``t`` leaves at instant
    ``t + r`` (after the tuples at it), on the next arrival or settle past it."""

    def __init__(self, contents: Contents, reach: int) -> None:
        super().__init__(contents)
        self.reach = reach

    def enter(self, ts: int, group: list[Arrival]) -> Entered:
        contents = self.contents
        contents.drop_before(ts - self.reach)
        if len(group) == 1:  # the usual group, without a comprehension
            row = group[0][1]
            return [(row, contents.add(ts, row, False, True))]
        add = contents.add
        return [(row, add(ts, row, False, True)) for _, row in group]

    def settle(self, watermark: int) -> None:
        self.contents.drop_before(watermark - self.reach)

    def idle_wakeup(self) -> int | None:
        """When the newest tuple leaves."""
        buffer = self.contents.buffer
        return buffer[-1][1] + self.reach + 1 if buffer else None


class LandmarkFrame(Frame):
    """``RANGE UNBOUNDED PRECEDING``: every tuple within the band enters, none leaves."""

    def __init__(self, contents: Contents, band: Band) -> None:
        super().__init__(contents)
        self.band = band

    def enter(self, ts: int, group: list[Arrival]) -> Entered:
        if not self.band.admits(ts):
            return [(row, [[] for _ in self.contents.calls]) for _, row in group]
        add = self.contents.add
        return [(row, add(ts, row, False, False)) for _, row in group]


class LaggedRangeFrame(Frame):
    """``RANGE r PRECEDING LAG d``: a tuple at ``t`` enters at instant ``t + d`` (before
    the outputs at that instant) and leaves at ``t + d + r`` (after them); an arrival
    reads the frame as it is then. Entering and leaving are silent (``settle``)."""

    def __init__(self, contents: Contents, reach: int, lag: int) -> None:
        super().__init__(contents)
        self.reach, self.lag = reach, lag

    def enter(self, ts: int, group: list[Arrival]) -> Entered:
        self.settle(ts)
        waiting, calls = self.waiting, self.contents.calls
        entered: Entered = []
        for _, row in group:
            waiting.append((ts, row))
            entered.append((row, [[] for _ in calls]))
        while waiting and waiting[0][0] + self.lag <= ts:
            self._admit(*waiting.popleft())
        return entered

    def _admit(self, ts: int, row: Row) -> None:
        self.contents.add(ts, row, False, True)

    def _next_leave(self) -> int | None:
        buffer = self.contents.buffer
        return buffer[0][1] + self.lag + self.reach if buffer else None

    def settle(self, watermark: int) -> None:
        """Lagged tuples entering and tuples leaving below ``watermark``, in instant
        order (entering first at one instant)."""
        waiting = self.waiting
        while True:
            enter = waiting[0][0] + self.lag if waiting else None
            leave = self._next_leave()
            if enter is not None and enter < watermark and (leave is None or enter <= leave):
                self._admit(*waiting.popleft())
            elif leave is not None and leave < watermark:
                self.contents.expire_oldest()
            else:
                return

    def idle_wakeup(self) -> int | None:
        """When the newest tuple, waiting or in the frame, leaves."""
        buffer = self.contents.buffer
        newest = self.waiting[-1][0] if self.waiting else None
        if newest is None and buffer:
            newest = buffer[-1][1]
        return None if newest is None else newest + self.lag + self.reach + 1


class LaggedLandmarkFrame(LaggedRangeFrame):
    """``RANGE UNBOUNDED PRECEDING LAG d``: tuples enter ``d`` late and never leave."""

    def __init__(self, contents: Contents, lag: int, band: Band) -> None:
        super().__init__(contents, 0, lag)
        self.band = band

    def _admit(self, ts: int, row: Row) -> None:
        if self.band.admits(ts):
            self.contents.add(ts, row, False, False)

    def _next_leave(self) -> int | None:
        return None

    def idle_wakeup(self) -> int | None:
        return None


class ExpiringFrame(Frame):
    """``RANGE r PRECEDING ACTIVE EXPIRATION``: a tuple at ``t`` leaves at instant
    ``t + r`` by a timer, after the tuples at it, its row kept for the outputs of its
    expiry."""

    def __init__(self, contents: Contents, reach: int) -> None:
        super().__init__(contents)
        self.reach = reach

    def enter(self, ts: int, group: list[Arrival]) -> Entered:
        add = self.contents.add
        return [(row, add(ts, row, True, True)) for _, row in group]

    def next_expiry(self) -> int | None:
        """The instant the oldest tuple expires at."""
        buffer = self.contents.buffer
        return buffer[0][1] + self.reach if buffer else None

    def expire(self, instant: int) -> Iterator[tuple[int, Row, Emissions]]:
        """Expire the tuples due at or before ``instant``, oldest first: each one's
        instant, row and emissions."""
        while (due := self.next_expiry()) is not None and due <= instant:
            row, emitted = self.contents.expire_oldest()
            if row is not None:
                yield due, row, emitted


class ResettingFrame(Frame):
    """``RESET EVERY p`` around ``inner``: the window restarts (fresh aggregates, ESL
    INITIALIZE) at each multiple of p from the epoch."""

    def __init__(self, inner: Frame, every: int) -> None:
        self.inner, self.every = inner, every
        self.contents, self.waiting, self.values = inner.contents, inner.waiting, inner.values
        self.period: int | None = None  # the current period

    def enter(self, ts: int, group: list[Arrival]) -> Entered:
        if ts // self.every != self.period:
            self.period = ts // self.every
            self.inner.restart()
        return self.inner.enter(ts, group)

    def settle(self, watermark: int) -> None:
        self.inner.settle(watermark)

    def restart(self) -> None:
        self.inner.restart()

    def idle(self, watermark: int) -> bool:
        """Also once the period is over: every later tuple starts a new one."""
        if self.period is not None and watermark >= (self.period + 1) * self.every:
            return True
        return self.inner.idle(watermark)

    def idle_wakeup(self) -> int | None:
        """The period's end, or the inner frame's wakeup if that comes first."""
        found: list[Any] = []
        if self.period is not None:
            found.append((self.period + 1) * self.every)
        inner = self.inner.idle_wakeup()
        if inner is not None:
            found.append(inner)
        return min(found, default=None)

    def get_state(self) -> tuple[list[Arrival], int | None]:
        waiting, _ = self.inner.get_state()
        return waiting, self.period

    def set_state(self, waiting: list[Arrival], period: int | None) -> None:
        self.inner.set_state(waiting, None)
        self.period = period
