"""Emit policies: which of a data-driven window's outputs are kept, and when they leave.

Each arrival goes through the frame (:mod:`engine.core.windows.frames`); the policy
turns the tuples' emissions into outputs:

* :class:`EveryTuple`: one output per tuple (SQL's window function);
* :class:`LastOfInstant`: only the last tuple of an instant (an OVER window read as a
  CQL relation: what the instant leaves);
* :class:`RowSlide`: the n-th, 2n-th, ... tuple's (ESL ``SLIDE n``);
* :class:`TimeSlide`: the last tuple of each time slot ``[k·s, (k+1)·s)``, emitted by a
  timer at the slot's last instant (ESL's yield tuple); :class:`BatchedTimeSlide` takes
  a slot's arrivals in one call;
* :class:`ExpiryOutputs`: every tuple's, and at each expiry the outputs of ``expire``,
  stamped with the expiration instant (ACTIVE EXPIRATION);
  :class:`RelationExpiryOutputs` the same read as a relation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.core.plan import AggCall
from engine.core.windows.base import Arrival, Emissions, Result, Row, combine
from engine.core.windows.contents import IncrementalContents, Pending
from engine.core.windows.frames import Entered, ExpiringFrame, Frame

SlotBatch = Callable[[Pending, int, int, int], int]
"""``arrive_slot(pending, i, n, watermark) -> index after the run`` (the evaluator's)."""


class EveryTuple:
    """Every tuple's output. The base of the policies: ``arrived`` counts the tuples;
    ``pending`` / ``pending_close`` are a time slot's yield and its last instant."""

    def __init__(self, frame: Frame, calls: tuple[AggCall, ...]) -> None:
        self.frame, self.calls = frame, calls
        self.arrived = 0
        self.pending: tuple[int, Row, Emissions] | None = None
        self.pending_close: int | None = None

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Process one peer group (equal ts) in order; return the kept outputs."""
        ts = group[0][0]
        entered = self.frame.enter(ts, group)
        self.arrived += len(group)
        return self._outputs(ts, entered)

    def _outputs(self, ts: int, entered: Entered) -> list[Result]:
        values, calls = self.frame.values, self.calls
        return [r for row, em in entered for r in combine(ts, row, calls, values(em))]

    def batched(self) -> SlotBatch | None:
        """The call taking a run of arrivals at once, if the policy has one."""
        return None

    def next_timer(self) -> int | None:
        """None: outputs leave on arrival."""
        return None

    def fire(self, instant: int) -> list[Result]:
        """Nothing to fire."""
        return []

    def settle(self) -> None:
        """Nothing held."""

    def residue(self) -> Any:
        """Nothing survives eviction."""
        return None

    def resume(self, residue: Any) -> None:
        """Nothing to take back."""


class LastOfInstant(EveryTuple):
    """Only the last tuple of each instant counts (a relation's rows at the instant)."""

    def _outputs(self, ts: int, entered: Entered) -> list[Result]:
        return super()._outputs(ts, entered[-1:])


class RowSlide(EveryTuple):
    """``SLIDE n`` in rows: the n-th, 2n-th, ... tuple of the partition."""

    def __init__(self, frame: Frame, calls: tuple[AggCall, ...], every: int) -> None:
        super().__init__(frame, calls)
        self.every = every

    def _outputs(self, ts: int, entered: Entered) -> list[Result]:
        values, calls, every = self.frame.values, self.calls, self.every
        first = self.arrived - len(entered) + 1
        return [
            r
            for i, (row, em) in enumerate(entered, start=first)
            if i % every == 0
            for r in combine(ts, row, calls, values(em))
        ]

    def residue(self) -> Any:
        """The place in the slot (its ``n``-th tuples are kept)."""
        return self.arrived % self.every

    def resume(self, residue: Any) -> None:
        """Take back the place in the slot."""
        if residue:
            self.arrived = residue


class TimeSlide(EveryTuple):
    """``SLIDE s`` in time: the last tuple of each slot, emitted by the timer at the
    slot's last instant. The yield's values are read only when its slot's outputs are
    sure to be needed (a later slot begins, the slot closes, a snapshot, passive expiry
    from outside): most tuples of a slot are replaced before that. Until then the
    window must not change, which ``_value_pending`` guards."""

    def __init__(self, frame: Frame, calls: tuple[AggCall, ...], slide: int) -> None:
        super().__init__(frame, calls)
        self.slide = slide
        self.unvalued = False

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Replace the slot's yield; outputs are built when the slot closes."""
        ts = group[0][0]
        if self.unvalued and ts > self.pending_close:  # type: ignore[operator]
            self._value_pending()  # its slot is over: the window is about to change
        entered = self.frame.enter(ts, group)
        self.arrived += len(group)
        self.pending = (ts, *entered[-1])
        self.unvalued = True
        self.pending_close = (ts // self.slide + 1) * self.slide - 1
        return []

    def next_timer(self) -> int | None:
        """The slot's close."""
        return self.pending_close

    def fire(self, instant: int) -> list[Result]:
        """Close the slot ending at ``instant``: its yield's outputs."""
        self._value_pending()
        assert self.pending is not None
        out = combine(*self.pending[:2], self.calls, self.pending[2])
        self.pending, self.pending_close = None, None
        return out

    def settle(self) -> None:
        """Read the yield's values (the window is about to change)."""
        self._value_pending()

    def _value_pending(self) -> None:
        if self.unvalued:
            assert self.pending is not None
            ts, row, em = self.pending
            self.pending, self.unvalued = (ts, row, self.frame.values(em)), False


class BatchedTimeSlide(TimeSlide):
    """:class:`TimeSlide` over a passive RANGE frame of incremental aggregates, with no
    reset: a slot's tuples only enter and leave the frame, and its yield is valued when
    the slot closes, so a slot's arrivals go through one call, no peer grouping."""

    def __init__(
        self,
        frame: Frame,
        calls: tuple[AggCall, ...],
        slide: int,
        contents: IncrementalContents,
        reach: int,
    ) -> None:
        super().__init__(frame, calls, slide)
        self.contents, self.reach = contents, reach

    def batched(self) -> SlotBatch | None:
        """``_arrive_slot``. A bound method is made at each call, never kept on the
        operator: kept, it would be a reference cycle, and an evicted key's operator
        would wait for the cyclic collector."""
        return self._arrive_slot

    def _arrive_slot(self, pending: Pending, i: int, n: int, watermark: int) -> int:
        """``arrive`` for a run of tuples: the evaluator's sorted ``pending`` entries
        ``(ts, source, seq, tiebreak, row)`` from index ``i`` (below ``n``) that lie in the
        time slot of ``pending[i]`` and below ``watermark``, i.e. every arrival before the
        slot's timer. Each one expires the tuples below its frame and enters it, in the
        same order as ``arrive`` group by group (so the same floating-point sums); the
        last one becomes the slot's pending yield. Returns the index after the run. No
        outputs: the slot's yield is emitted by its timer (``fire``)."""
        ts = pending[i][0]
        if self.unvalued and ts > self.pending_close:  # type: ignore[operator]
            self._value_pending()
        close = (ts // self.slide + 1) * self.slide - 1
        stop = close + 1 if close < watermark else watermark
        j = self.contents.slide_through(pending, i, n, stop, self.reach)
        self.arrived += j - i
        last = pending[j - 1]
        self.pending = (last[0], last[4], self.contents.no_emissions)
        self.unvalued = True
        self.pending_close = close
        return j


class ExpiryOutputs(EveryTuple):
    """ACTIVE EXPIRATION: every tuple's output on arrival, and when a tuple expires
    (timers at the expiration instants of ``expiring``) the outputs of its ``expire``,
    with its own plain columns, stamped with that instant."""

    def __init__(self, frame: Frame, calls: tuple[AggCall, ...], expiring: ExpiringFrame) -> None:
        super().__init__(frame, calls)
        self.expiring = expiring

    def next_timer(self) -> int | None:
        """The next expiration."""
        return self.expiring.next_expiry()

    def fire(self, instant: int) -> list[Result]:
        """The expirations due at ``instant``, in (ts, source, seq) order."""
        out: list[Result] = []
        for due, row, emitted in self.expiring.expire(instant):
            out += combine(due, row, self.calls, emitted)
        return out


class RelationExpiryOutputs(ExpiryOutputs):
    """ACTIVE EXPIRATION read as a relation: the last tuple of an instant, and of the
    expirations at an instant what the last one leaves."""

    def _outputs(self, ts: int, entered: Entered) -> list[Result]:
        return super()._outputs(ts, entered[-1:])

    def fire(self, instant: int) -> list[Result]:
        out: list[Result] = []
        for due, row, emitted in self.expiring.expire(instant):
            rows = combine(due, row, self.calls, emitted)
            # A relation is what the last expiry leaves: nothing once the window is empty.
            out = rows if self.expiring.contents.buffer else []
        return out
