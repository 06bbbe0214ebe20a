"""Window operators: the stateful middle of a query, driven by the keyed evaluator.

An operator sees one partition's tuples in (ts, source, seq) order. The evaluator calls
``arrive`` with each group of tuples sharing one timestamp (SQL peers) and ``fire`` with
each timer instant; at one instant arrivals come first, then timers, so a timer at ``x``
runs "after every tuple with timestamp ``x``". Both return ``(event_ts, row)`` pairs for
the query's ``post`` ops. ``next_timer`` is the next instant with timer work (including
silent work such as passive expiry); ``next_wakeup`` the next one that may emit.

Window pieces, after the ESL paper §4-5:

* the frame decides which tuples leave: ROWS n (overflow of n+1 rows, on arrival),
  RANGE r (tuple at ``t`` leaves at instant ``t + r``), UNBOUNDED (never);
* the slide decides which outputs are kept: every n-th row, or the last tuple of each
  time slot (emitted by a timer at the slot's last instant);
* active expiration keeps the outputs of ``expire``, stamped with the expiration instant.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from engine.core.aggregates import IncrementalAggregate, WindowAggregate, make_aggregate
from engine.core.plan import AggCall, FrameUnits, OverWindow

Row = dict[str, Any]
Arrival = tuple[int, Row]
"""A tuple handed to an operator: (ts, row)."""
Result = tuple[int, Row]
"""An operator's output: (event ts, row for the post ops)."""


class BufferView:
    """A UDA's ``inwindow``: (uid, args) entries oldest first; see ``aggregates.InWindow``."""

    def __init__(self, entries: deque[tuple[int, tuple[Any, ...]]] | None = None) -> None:
        self.entries = entries if entries is not None else deque()

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return (args for _, args in self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def oldest(self) -> tuple[Any, ...] | None:
        """The oldest argument tuple, or None when empty."""
        return self.entries[0][1] if self.entries else None

    def delete(self, predicate: Callable[[tuple[Any, ...]], bool]) -> int:
        """Drop the entries whose args satisfy ``predicate``; return how many."""
        kept = [e for e in self.entries if not predicate(e[1])]
        removed = len(self.entries) - len(kept)
        if removed:
            self.entries = deque(kept)
        return removed


class StatelessOperator:
    """No window: every tuple passes through at its own event time."""

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Pass the group through."""
        return group

    def next_timer(self) -> int | None:
        """Never any timer work."""
        return None

    next_wakeup = next_timer

    def fire(self, instant: int) -> list[Result]:
        """Nothing to fire."""
        return []

    def get_state(self) -> Any:
        """No state."""
        return None

    def set_state(self, state: Any) -> None:
        """No state."""


class OverOperator:
    """A data-driven window (``agg OVER (...)``) for one partition.

    State: the frame's buffer of ``(uid, ts, row, args)`` entries (``row`` only kept
    under active expiration, whose outputs carry the expiring tuple's columns), one
    aggregate per call, one ``inwindow`` per ESL-shaped aggregate, the arrival count
    (row slides), and the pending yield of the current time slot.
    """

    def __init__(self, window: OverWindow) -> None:
        if window.lag:
            raise NotImplementedError("lagged OVER windows are not implemented yet")
        if window.active_expiration and (
            window.units is not FrameUnits.RANGE or window.preceding is None
        ):
            raise ValueError("ACTIVE EXPIRATION needs a bounded RANGE frame")
        if window.active_expiration and (window.slide_rows or window.slide_ms):
            raise ValueError("ACTIVE EXPIRATION replaces SLIDE; they cannot be combined")
        if window.slide_rows and window.slide_ms:
            raise ValueError("a window slides in rows or in time, not both")
        self.window = window
        self.calls = window.aggregates
        self.aggs: list[WindowAggregate] = [
            make_aggregate(c.name, c.factory) for c in window.aggregates
        ]
        self.incremental = [isinstance(a, IncrementalAggregate) for a in self.aggs]
        self.views: list[BufferView | None] = [
            None if inc else BufferView() for inc in self.incremental
        ]
        self.buffer: deque[tuple[int, int, Row | None, tuple[tuple[Any, ...], ...]]] = deque()
        self.arrived = 0
        self.pending: list[Result] = []
        self.pending_close: int | None = None

    # -- arrivals ---------------------------------------------------------------------

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Process one peer group (equal ts) in order; return the kept outputs."""
        w = self.window
        ts = group[0][0]
        per_tuple: list[tuple[Row, list[list[Any]]]] = []
        for _, row in group:
            if w.units is FrameUnits.ROWS and w.preceding is not None:
                while len(self.buffer) > w.preceding:
                    self._expire_oldest()
            args = tuple(tuple(e(row) for e in c.args) for c in self.calls)
            emitted = self._accumulate(args)
            self.arrived += 1
            self.buffer.append((self.arrived, ts, row if w.active_expiration else None, args))
            for view, a in zip(self.views, args, strict=True):
                if view is not None:
                    view.entries.append((self.arrived, a))
            if w.units is FrameUnits.ROWS:
                emitted = self._with_values(emitted)
            per_tuple.append((row, emitted))
        if w.units is FrameUnits.RANGE:
            # RANGE frames include peers: every peer reads the value after the last one.
            per_tuple = [(row, self._with_values(em)) for row, em in per_tuple]
        first = self.arrived - len(group) + 1
        if w.slide_rows:
            return [
                r
                for i, (row, em) in enumerate(per_tuple, start=first)
                if i % w.slide_rows == 0
                for r in _combine(ts, row, self.calls, em)
            ]
        if w.slide_ms:
            row, em = per_tuple[-1]
            self.pending = _combine(ts, row, self.calls, em)
            self.pending_close = (ts // w.slide_ms + 1) * w.slide_ms - 1
            return []
        return [r for row, em in per_tuple for r in _combine(ts, row, self.calls, em)]

    def _accumulate(self, args: tuple[tuple[Any, ...], ...]) -> list[list[Any]]:
        """Feed one tuple to every aggregate; the ESL-shaped ones' emissions, per call."""
        emitted: list[list[Any]] = []
        for agg, inc, view, a in zip(self.aggs, self.incremental, self.views, args, strict=True):
            if inc:
                agg.accumulate(*a)  # type: ignore[attr-defined]
                emitted.append([])
            else:
                assert view is not None
                step = agg.initialize if self.arrived == 0 else agg.iterate
                emitted.append([*step(a, view), *agg.terminate(view)])
        return emitted

    def _with_values(self, emitted: list[list[Any]]) -> list[list[Any]]:
        """Fill in the incremental aggregates' current values."""
        return [
            [agg.get_value()] if inc else em  # type: ignore[attr-defined]
            for agg, inc, em in zip(self.aggs, self.incremental, emitted, strict=True)
        ]

    # -- timers -----------------------------------------------------------------------

    def _expiry_instant(self) -> int | None:
        w = self.window
        if w.units is FrameUnits.RANGE and w.preceding is not None and self.buffer:
            return self.buffer[0][1] + w.preceding
        return None

    def next_timer(self) -> int | None:
        """The earliest slot close or RANGE expiry."""
        times = [t for t in (self.pending_close, self._expiry_instant()) if t is not None]
        return min(times) if times else None

    def next_wakeup(self) -> int | None:
        """The earliest timer that can emit: a slot close or an active expiration."""
        if self.window.active_expiration:
            return self._expiry_instant()
        return self.pending_close

    def fire(self, instant: int) -> list[Result]:
        """Close the time slot ending at ``instant`` and expire tuples due at it."""
        out: list[Result] = []
        if self.pending_close is not None and self.pending_close <= instant:
            out, self.pending, self.pending_close = self.pending, [], None
        while (due := self._expiry_instant()) is not None and due <= instant:
            out.extend(self._expire_oldest(due))
        return out

    def _expire_oldest(self, instant: int | None = None) -> list[Result]:
        """Remove the oldest tuple, running ``expire``/``retract``; under active
        expiration return its outputs, stamped ``instant``."""
        uid, _, row, args = self.buffer.popleft()
        emitted: list[list[Any]] = []
        for agg, inc, view, a in zip(self.aggs, self.incremental, self.views, args, strict=True):
            if inc:
                agg.retract(*a)  # type: ignore[attr-defined]
                emitted.append([agg.get_value()])  # type: ignore[attr-defined]
            elif view is not None and view.entries and view.entries[0][0] == uid:
                emitted.append(list(agg.expire(a, view)))
                view.entries.popleft()
            else:
                emitted.append([])  # deleted from inwindow earlier: it does not expire
        if row is None or instant is None:
            return []
        return _combine(instant, row, self.calls, emitted)

    # -- snapshot ---------------------------------------------------------------------

    def get_state(self) -> Any:
        """Plain data: buffer, aggregate states, inwindows, counters, pending yield."""
        return (
            list(self.buffer),
            [a.get_state() for a in self.aggs],
            [None if v is None else list(v.entries) for v in self.views],
            self.arrived,
            self.pending,
            self.pending_close,
        )

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        buffer, aggs, views, self.arrived, self.pending, self.pending_close = state
        self.buffer = deque(buffer)
        for agg, s in zip(self.aggs, aggs, strict=True):
            agg.set_state(s)
        self.views = [None if v is None else BufferView(deque(v)) for v in views]


def _combine(
    ts: int, row: Row, calls: tuple[AggCall, ...], emitted: list[list[Any]]
) -> list[Result]:
    """One output row per combination of the calls' emitted values (usually one)."""
    if len(emitted) == 1:
        return [(ts, {**row, calls[0].alias: v}) for v in emitted[0]]
    return [
        (ts, {**row, **{c.alias: v for c, v in zip(calls, values, strict=True)}})
        for values in itertools.product(*emitted)
    ]
