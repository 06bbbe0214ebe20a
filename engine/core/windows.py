"""Window operators: the stateful middle of a query, driven by the keyed evaluator.

An operator sees one partition's tuples in (ts, source, seq) order. The evaluator calls
``arrive`` with each group of tuples sharing one timestamp (SQL peers) and ``fire`` with
each timer instant; at one instant arrivals come first, then timers, so a timer at ``x``
runs "after every tuple with timestamp ``x``". Both return ``(event_ts, row)`` pairs for
the query's ``post`` ops. ``next_timer`` is the next instant at which ``fire`` may emit
(slot close, active expiration, extent end); silent work needs no timer:
``settle(watermark)``, called on arrival and at the end of each advance, runs it (passive
expiry, lagged tuples entering) in the same order relative to the arrivals, and lets
idle partitions drop state no future tuple can need.

**Eviction.** ``idle(watermark)`` says whether the operator, advanced to ``watermark``,
now gives every later tuple what a new operator would, once given back its
``residue()`` (what must survive: a row slide's count, a pattern's match number) with
``resume``; ``idle_wakeup()`` is the lowest watermark at which time alone can make it
idle (None: only its timers or nothing can). The evaluator's key is then evicted
(docs/engine.md, *Eviction*).

Window pieces, after the ESL paper §4-5 and the scopes of Patroumpas & Sellis, "Window
Specification over Data Streams":

* the frame decides which tuples enter and leave: ROWS n (overflow of n+1 rows, on
  arrival), RANGE r (tuple at ``t`` leaves at instant ``t + r``), UNBOUNDED (never), a
  lag delaying both, a periodic reset, fixed SINCE/UNTIL bounds;
* the slide decides which outputs are kept: every n-th row, or the last tuple of each
  time slot (emitted by a timer at the slot's last instant);
* active expiration keeps the outputs of ``expire``, stamped with the expiration instant.

Operators: :class:`StatelessOperator`, :class:`OverOperator` (data-driven windows),
:class:`PaneOperator` (row slides over algebraic aggregates), :class:`ExtentOperator`
(domain-driven extents), :class:`RelationOperator` (CQL windows of raw tuples read
through ISTREAM / DSTREAM / RSTREAM).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from engine.core.aggregates import IncrementalAggregate, WindowAggregate, make_aggregate
from engine.core.chunks import ChunkedBuffer, ChunkReader
from engine.core.plan import (
    END_OF_TIME,
    R2S,
    AggCall,
    ExtentWindow,
    FrameUnits,
    OverWindow,
    RelationWindow,
    StatelessOp,
    compiled_ops,
)

Row = dict[str, Any]
Arrival = tuple[int, Row]
"""A tuple handed to an operator: (ts, row)."""
Result = tuple[int, Row]
"""An operator's output: (event ts, row for the post ops)."""


class ExtentColumns(NamedTuple):
    """Extents' results column by column (:meth:`PaneExtentOperator.run_columns`):
    ``ends`` (each extent's end, its event ts) and ``columns``, the names a result row
    would have (group key, ``window_start``, ``window_end``, aggregate aliases) to one
    value per extent."""

    ends: list[int]
    columns: dict[str, list[Any]]


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

    def fire(self, instant: int) -> list[Result]:
        """Nothing to fire."""
        return []

    def settle(self, watermark: int) -> None:
        """Nothing to let go."""

    def get_state(self) -> Any:
        """No state."""
        return None

    def set_state(self, state: Any) -> None:
        """No state."""

    def idle(self, watermark: int) -> bool:
        """Always: nothing is kept."""
        return True

    def idle_wakeup(self) -> int | None:
        """Idle already."""
        return None

    def residue(self) -> Any:
        """Nothing survives."""
        return None

    def resume(self, residue: Any) -> None:
        """Nothing to take back."""


class _Evicting:
    """The eviction protocol's defaults (module docstring) for an operator whose idle
    state leaves nothing behind and that time alone never makes idle."""

    def idle_wakeup(self) -> int | None:
        """None: only timers or arrivals change the operator."""
        return None

    def residue(self) -> Any:
        """Nothing survives."""
        return None

    def resume(self, residue: Any) -> None:
        """Nothing to take back."""


class _Aggregating:
    """What every window with aggregates holds: the calls, one aggregate per call, one
    ``inwindow`` per ESL-shaped aggregate, and the frame buffer of
    ``(uid, ts, row, args)`` entries, oldest first (``row`` is None unless the
    window's outputs need the expiring tuple's columns)."""

    def __init__(self, calls: tuple[AggCall, ...]) -> None:
        self.calls = calls
        self.aggs: list[WindowAggregate] = [make_aggregate(c.name, c.factory) for c in calls]
        self.incremental = [isinstance(a, IncrementalAggregate) for a in self.aggs]
        self.all_incremental = all(self.incremental)
        self.no_emissions: list[list[Any]] = [[] for _ in calls]  # shared, never mutated
        self.views: list[BufferView | None] = [
            None if inc else BufferView() for inc in self.incremental
        ]
        self.buffer: deque[tuple[int, int, Row | None, tuple[tuple[Any, ...], ...]]] = deque()
        self.added = 0  # tuples ever added: their uids
        self.fresh = True  # the next tuple gets INITIALIZE
        # Whether the buffer keeps only the tuples some inwindow holds (`_prune`); the
        # window decides (only a data-driven RANGE frame may).
        self.prune = False
        # Set when the runtime keeps the buffer in chunks (`OverOperator.store_in_chunks`).
        self.chunks: ChunkedBuffer | None = None
        self._bind()

    def _bind(self) -> None:
        """Hot-path shortcuts (per tuple, every attribute lookup counts): the argument
        reader and, when all aggregates are incremental, their bound methods."""
        self._read_args = args_reader(self.calls)
        if self.all_incremental:
            self._accumulate = [a.accumulate for a in self.aggs]  # type: ignore[attr-defined]
            self._retract = [a.retract for a in self.aggs]  # type: ignore[attr-defined]

    def _restart(self) -> None:
        """Empty the window and start every aggregate afresh (a landmark reset)."""
        self.aggs = [make_aggregate(c.name, c.factory) for c in self.calls]
        self.views = [None if inc else BufferView() for inc in self.incremental]
        self.buffer.clear()
        if self.chunks is not None:
            self.chunks.cleared()
        self.fresh = True
        self._bind()

    def _add(self, ts: int, row: Row, keep_row: bool, expires: bool) -> list[list[Any]]:
        """Feed one tuple to every aggregate, then to the buffers; return the ESL-shaped
        aggregates' emissions per call (empty lists for the incremental ones)."""
        args = self._read_args(row)
        self.added += 1
        if expires:  # an UNBOUNDED frame never expires: no need to remember the tuple
            self.buffer.append((self.added, ts, row if keep_row else None, args))
        if self.all_incremental:  # the common case, kept lean
            # Equal lengths by construction; strict checking would cost on every tuple.
            for accumulate, a in zip(self._accumulate, args, strict=False):
                accumulate(*a)
            return self.no_emissions
        emitted: list[list[Any]] = []
        for agg, inc, view, a in zip(self.aggs, self.incremental, self.views, args, strict=True):
            if inc:
                agg.accumulate(*a)  # type: ignore[attr-defined]
                emitted.append([])
            else:
                assert view is not None
                step = agg.initialize if self.fresh else agg.iterate
                emitted.append([*step(a, view), *agg.terminate(view)])
                view.entries.append((self.added, a))
        self.fresh = False
        if self.prune:
            self._prune()
        return emitted

    def _prune(self) -> None:
        """Drop the buffered tuples that no inwindow holds any more. With only ESL-shaped
        aggregates such a tuple can neither emit nor be read when it expires, and keeping
        it would hold every tuple of the range in the state (a silence detector deletes
        all but the newest) and fire a timer at each one's expiry."""
        views = [v for v in self.views if v is not None]
        live = len(views[0].entries) if len(views) == 1 else None
        if live == len(self.buffer):
            return
        kept = {uid for v in views for uid, _ in v.entries}
        if len(kept) < len(self.buffer):
            self.buffer = deque(e for e in self.buffer if e[0] in kept)

    def _values(self, emitted: list[list[Any]]) -> list[list[Any]]:
        """Fill in the incremental aggregates' current values."""
        if self.all_incremental:
            return [[agg.get_value()] for agg in self.aggs]  # type: ignore[attr-defined]
        return [
            [agg.get_value()] if inc else em  # type: ignore[attr-defined]
            for agg, inc, em in zip(self.aggs, self.incremental, emitted, strict=True)
        ]

    def _drop_before(self, horizon: int) -> None:
        """Passive expiry: remove every tuple with ts < ``horizon`` (nobody reads values)."""
        buffer = self.buffer
        if self.all_incremental:  # inlined `_expire_oldest`: one call less per tuple
            retracts = self._retract
            while buffer and buffer[0][1] < horizon:
                for retract, a in zip(retracts, buffer.popleft()[3], strict=False):
                    retract(*a)
            return
        while buffer and buffer[0][1] < horizon:
            self._expire_oldest()

    def _expire_oldest(self) -> tuple[Row | None, list[list[Any]]]:
        """Remove the oldest tuple, running ``retract``/``expire``; return its row and
        the values emitted per call (incremental: the value after the retraction)."""
        uid, _, row, args = self.buffer.popleft()
        if self.all_incremental and row is None:  # passive expiry: nobody reads values
            for retract, a in zip(self._retract, args, strict=False):
                retract(*a)
            return row, self.no_emissions
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
        if self.prune:
            self._prune()  # an expire may delete from inwindow too
        return row, emitted

    def _at_rest(self) -> bool:
        """Whether the window is empty and every aggregate gives what a new one would:
        nothing buffered or in an inwindow, each aggregate at rest
        (:meth:`~engine.core.aggregates.WindowAggregate.at_rest`), and no aggregate
        whose first tuple is special (its own ``initialize``) past its first tuple."""
        if self.buffer or any(v is not None and v.entries for v in self.views):
            return False
        if not self.fresh and any(
            type(agg).initialize is not WindowAggregate.initialize for agg in self.aggs
        ):
            return False
        blank = [make_aggregate(c.name, c.factory) for c in self.calls]
        return all(agg.at_rest(new) for agg, new in zip(self.aggs, blank, strict=True))

    def stored_chunks(self) -> list[int]:
        """The numbers of the buffer's chunks in the store (none unless chunked)."""
        return sorted(self.chunks.newest) if self.chunks is not None else []

    def get_state(self, chunked: bool = False) -> Any:
        """Plain data: buffer, aggregate states, inwindows, counters. ``chunked``: the
        buffer as its chunk index, the changed chunks left in ``self.chunks.writes``."""
        if self.chunks is not None and chunked:
            buffer: Any = self.chunks.save(self.buffer)
        else:
            if self.chunks is not None:
                self.buffer = self.chunks.fill(self.buffer)
            buffer = list(self.buffer)
        return (
            buffer,
            [a.get_state() for a in self.aggs],
            [None if v is None else list(v.entries) for v in self.views],
            self.added,
            self.fresh,
        )

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        buffer, aggs, views, self.added, self.fresh = state
        if not ChunkedBuffer.is_stored(buffer):
            self.buffer = deque(buffer)
        elif self.chunks is None:
            raise ValueError("this snapshot keeps its buffer in chunks: restore it with load()")
        else:
            self.buffer = self.chunks.restore(buffer)
        for agg, s in zip(self.aggs, aggs, strict=True):
            agg.set_state(s)
        self.views = [None if v is None else BufferView(deque(v)) for v in views]


def args_reader(calls: tuple[AggCall, ...]) -> Callable[[Row], tuple[tuple[Any, ...], ...]]:
    """A row's argument tuple per call, with the common shapes (one call of one
    argument, one argument each) read without nested loops: it runs per tuple."""
    if len(calls) == 1 and len(calls[0].args) == 1:
        only = calls[0].args[0]
        return lambda row: ((only(row),),)
    if all(len(c.args) == 1 for c in calls):
        firsts = [c.args[0] for c in calls]
        return lambda row: tuple([(e(row),) for e in firsts])
    every = [c.args for c in calls]
    return lambda row: tuple([tuple([e(row) for e in a]) for a in every])


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


def _as_is(emitted: list[list[Any]]) -> list[list[Any]]:
    return emitted


class OverOperator(_Aggregating):
    """A data-driven window (``agg OVER (...)``) for one partition.

    Besides the frame: ``waiting``, the tuples of a lagged window that have arrived but
    not yet entered the frame; ``arrived``, the tuple count (row slides); ``period``,
    the current reset period; and the pending yield of the current time slot
    (``pending``: its ts, row and aggregate values, read when it arrived and turned into
    outputs by the timer at ``pending_close``, the slot's last
    instant). A lagged RANGE tuple at ``t`` enters at instant ``t + lag`` (before the
    outputs at that instant) and leaves at ``t + lag + range`` (after them).
    """

    def __init__(self, window: OverWindow, relation: bool = False) -> None:
        _check(window)
        super().__init__(window.aggregates)
        self.relation = relation  # CQL relation: only the last tuple of an instant counts
        if window.lag and not all(self.incremental):
            raise ValueError("a lagged window takes incremental aggregates only")
        self.window = window
        self.range = window.preceding if window.units is FrameUnits.RANGE else None
        self.lag = window.lag
        self.banded = window.since_ms is not None or window.until_ms is not None
        self.rows_frame = window.units is FrameUnits.ROWS
        self.keep_rows = window.active_expiration  # expiring tuples' columns are output
        self.expires = window.preceding is not None
        # The common RANGE case, settled straight off the buffer's front: passive
        # expiry, no lag (None otherwise).
        self.passive_range = self.range if not window.active_expiration and not self.lag else None
        # A RANGE frame's tuples leave by time, so with only ESL-shaped aggregates the
        # ones deleted from every inwindow may go at once. Not for ROWS frames (they
        # count deleted tuples) nor a relation (each expiry replaces its rows).
        self.prune = self.range is not None and not any(self.incremental) and not relation
        self.waiting: deque[tuple[int, Row]] = deque()
        self.arrived = 0
        self.period: int | None = None
        self.pending: tuple[int, Row, list[list[Any]]] | None = None
        self.pending_close: int | None = None
        # A RANGE yield's incremental values are read only when its slot's outputs are
        # sure to be needed (a later slot begins, the slot closes, a snapshot, passive
        # expiry from outside): most tuples of a slot are replaced before that. Until
        # then the window must not change, which `_value_pending` guards.
        self.unvalued = False
        # Whether the batched path for the common sliding case runs (`arrive_slot`).
        self._slots = self._slot_batchable()

    @property
    def arrive_slot(
        self,
    ) -> Callable[[list[tuple[int, str, int, int, Row]], int, int, int], int] | None:
        """The batched path for the common sliding case (``_arrive_slot``), or None. A
        property, not an attribute: a bound method kept on the operator is a reference
        cycle, and an evicted key's operator would wait for the cyclic collector."""
        return self._arrive_slot if self._slots else None

    def _slot_batchable(self) -> bool:
        """Whether ``arrive_slot`` may stand in for ``arrive``: a bounded RANGE frame with
        passive expiry and a time slide, incremental aggregates, no lag, reset, bounds or
        relation reading. Then a slot's tuples only enter and leave the frame, and its
        yield is valued when the slot closes, so no peer grouping is needed."""
        w = self.window
        return (
            self.passive_range is not None
            and w.slide_ms is not None
            and w.reset_every_ms is None
            and not self.banded
            and not self.relation
            and not self.keep_rows
            and self.all_incremental
        )

    def _arrive_slot(
        self, pending: list[tuple[int, str, int, int, Row]], i: int, n: int, watermark: int
    ) -> int:
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
        slide = self.window.slide_ms
        assert slide is not None and self.passive_range is not None
        close = (ts // slide + 1) * slide - 1
        stop = close + 1 if close < watermark else watermark
        buffer = self.buffer
        reach = self.passive_range
        added = self.added
        j = i
        if len(self.calls) == 1 and len(self.calls[0].args) == 1:
            # One aggregate of one argument (avg(speed)): no zips, no argument lists.
            only = self.calls[0].args[0]
            accumulate, retract = self._accumulate[0], self._retract[0]
            while j < n:
                entry = pending[j]
                ts = entry[0]
                if ts >= stop:
                    break
                horizon = ts - reach
                while buffer and buffer[0][1] < horizon:
                    retract(buffer.popleft()[3][0][0])
                x = only(entry[4])
                added += 1
                buffer.append((added, ts, None, ((x,),)))
                accumulate(x)
                j += 1
        else:
            read, accumulates, retracts = self._read_args, self._accumulate, self._retract
            while j < n:
                entry = pending[j]
                ts = entry[0]
                if ts >= stop:
                    break
                horizon = ts - reach
                while buffer and buffer[0][1] < horizon:
                    for retract_one, a in zip(retracts, buffer.popleft()[3], strict=False):
                        retract_one(*a)
                args = read(entry[4])
                added += 1
                buffer.append((added, ts, None, args))
                for accumulate_one, a in zip(accumulates, args, strict=False):
                    accumulate_one(*a)
                j += 1
        self.added = added
        self.arrived += j - i
        last = pending[j - 1]
        self.pending = (last[0], last[4], self.no_emissions)
        self.unvalued = True
        self.pending_close = close
        return j

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Process one peer group (equal ts) in order; return the kept outputs."""
        w = self.window
        ts = group[0][0]
        if self.unvalued and ts > self.pending_close:  # type: ignore[operator]
            self._value_pending()  # its slot is over: the window is about to change
        if w.reset_every_ms is not None and ts // w.reset_every_ms != self.period:
            self.period = ts // w.reset_every_ms
            self._restart()
        # (row, emissions per call): ROWS tuples read the aggregates' values as they
        # enter; RANGE peers all read the values after the last peer, so those are
        # filled in (by `_values`) only for the outputs kept.
        per_tuple: list[tuple[Row, list[list[Any]]]] = []
        values = self._values
        if self.rows_frame:
            for _, row in group:
                per_tuple.append((row, values(self._enter_row(ts, row))))
            values = _as_is
        else:
            if self.passive_range is not None:  # `_settle`'s common case, one call less
                self._drop_before(ts - self.passive_range)
            else:
                self._settle(ts)
            if self.lag:
                for _, row in group:
                    self.waiting.append((ts, row))
                    per_tuple.append((row, [[] for _ in self.calls]))
                while self.waiting and self.waiting[0][0] + self.lag <= ts:
                    self._enter(*self.waiting.popleft())
            elif self.banded:
                per_tuple = [(row, self._enter(ts, row)) for _, row in group]
            elif len(group) == 1:  # `_enter` without its bounds check or a comprehension
                row = group[0][1]
                per_tuple = [(row, self._add(ts, row, self.keep_rows, self.expires))]
            else:
                add, keep, expires = self._add, self.keep_rows, self.expires
                per_tuple = [(row, add(ts, row, keep, expires)) for _, row in group]
        self.arrived += len(group)
        if self.relation and not w.slide_rows:
            per_tuple = per_tuple[-1:]
        if w.slide_rows:
            first = self.arrived - len(group) + 1
            return [
                r
                for i, (row, em) in enumerate(per_tuple, start=first)
                if i % w.slide_rows == 0
                for r in _combine(ts, row, self.calls, values(em))
            ]
        if w.slide_ms:
            # Outputs are built only for the slot's last tuple, when the slot closes.
            self.pending = (ts, *per_tuple[-1])
            self.unvalued = values is not _as_is
            self.pending_close = (ts // w.slide_ms + 1) * w.slide_ms - 1
            return []
        return [r for row, em in per_tuple for r in _combine(ts, row, self.calls, values(em))]

    def _enter(self, ts: int, row: Row) -> list[list[Any]]:
        """Add a tuple to the frame unless it falls outside the fixed bounds."""
        w = self.window
        if self.banded and not (
            (w.since_ms is None or w.since_ms <= ts) and (w.until_ms is None or ts <= w.until_ms)
        ):
            return [[] for _ in self.calls]
        return self._add(ts, row, self.keep_rows, self.expires)

    def _enter_row(self, ts: int, row: Row) -> list[list[Any]]:
        """ROWS frames: the tuple ``lag`` rows back enters, the overflow leaves."""
        if self.lag:
            self.waiting.append((ts, row))
            if len(self.waiting) <= self.lag:
                return [[] for _ in self.calls]
            ts, row = self.waiting.popleft()
        if self.window.preceding is not None:
            while len(self.buffer) > self.window.preceding:
                self._expire_oldest()
        return self._enter(ts, row)

    def _expiry_instant(self) -> int | None:
        if self.range is not None and self.buffer:
            return self.buffer[0][1] + self.lag + self.range
        return None

    def next_timer(self) -> int | None:
        """The earliest slot close or active expiration (passive expiry needs no timer:
        ``arrive`` and ``settle`` do it, in the same order relative to the arrivals)."""
        if self.window.active_expiration:
            return self._expiry_instant()
        return self.pending_close

    def fire(self, instant: int) -> list[Result]:
        """Close the time slot ending at ``instant`` or run the active expirations due at
        it; each expiring tuple's outputs are stamped ``instant``."""
        if not self.window.active_expiration:
            self._value_pending()
            assert self.pending is not None
            out = _combine(*self.pending[:2], self.calls, self.pending[2])
            self.pending, self.pending_close = None, None
            return out
        out = []
        while (due := self._expiry_instant()) is not None and due <= instant:
            row, emitted = self._expire_oldest()
            if row is not None:
                rows = _combine(due, row, self.calls, emitted)
                # A relation is what the last expiry leaves: nothing once the window is empty.
                out = (rows if self.buffer else []) if self.relation else out + rows
        return out

    def _value_pending(self) -> None:
        """Read the pending yield's incremental values now (see ``unvalued``)."""
        if self.unvalued:
            assert self.pending is not None
            ts, row, em = self.pending
            self.pending, self.unvalued = (ts, row, self._values(em)), False

    def settle(self, watermark: int) -> None:
        """Run the silent RANGE events below ``watermark`` in instant order: lagged tuples
        entering the frame, then (passive expiry) tuples leaving it. No future tuple's
        frame can tell the difference, and idle partitions let go of old tuples."""
        self._value_pending()
        self._settle(watermark)

    def _settle(self, watermark: int) -> None:
        """``settle`` without reading the pending yield (``arrive`` replaces it)."""
        if self.rows_frame:
            return  # ROWS frames move by arrivals only
        if self.passive_range is not None:  # the common case: only leaves
            self._drop_before(watermark - self.passive_range)
            return
        if not self.lag:
            return  # an unbounded frame, or tuples leave by active expiration (timers)
        leaves = self.range is not None and not self.window.active_expiration
        while True:
            enter = self.waiting[0][0] + self.lag if self.waiting else None
            leave = self._expiry_instant() if leaves else None
            if enter is not None and enter < watermark and (leave is None or enter <= leave):
                self._enter(*self.waiting.popleft())
            elif leave is not None and leave < watermark:
                self._expire_oldest()
            else:
                return

    def store_in_chunks(self, read: ChunkReader | None) -> bool:
        """Keep the buffer in chunks between batches (:mod:`engine.core.chunks`), read
        through ``read``, if the frame only appends tuples and expires them by time:
        a RANGE frame, not a relation, not pruned. Returns whether it does."""
        if self.range is None or self.relation or self.prune:
            return False
        self.chunks = ChunkedBuffer(self.range + self.lag, read)
        return True

    def prepare(self, watermark: int) -> None:
        """Load the stored chunks an advance to ``watermark`` may expire."""
        if self.chunks is not None:
            self.buffer = self.chunks.prepare(self.buffer, watermark)

    def idle(self, watermark: int) -> bool:
        """Nothing waits (lagged tuples, a slot's yield) and the window is at rest; or a
        reset period is over: every later tuple starts a new one, from scratch."""
        if self.pending is not None or self.waiting:
            return False
        period = self.window.reset_every_ms
        if (
            period is not None
            and self.period is not None
            and watermark >= (self.period + 1) * period
        ):
            return True
        return self._at_rest()

    def idle_wakeup(self) -> int | None:
        """When the newest tuple leaves a passive RANGE frame (``newest + lag + range +
        1``), or the reset period ends; None otherwise (ROWS and UNBOUNDED frames keep
        their tuples, active expiration and slides move by timers)."""
        found = []
        period = self.window.reset_every_ms
        if period is not None and self.period is not None:
            found.append((self.period + 1) * period)
        if self.range is not None and not self.window.active_expiration:
            newest = self.waiting[-1][0] if self.waiting else None
            if newest is None and self.buffer:
                newest = self.buffer[-1][1]
            if newest is not None:
                found.append(newest + self.lag + self.range + 1)
        return min(found, default=None)

    def residue(self) -> Any:
        """A row slide's place in its slot (its ``n``-th tuples are kept)."""
        slide = self.window.slide_rows
        return self.arrived % slide if slide else None

    def resume(self, residue: Any) -> None:
        """Take back the row slide's place."""
        if residue:
            self.arrived = residue

    def get_state(self, chunked: bool = False) -> Any:
        """The frame's state plus the lag queue, counters and the pending yield."""
        self._value_pending()  # the values as they were when it arrived
        return (
            super().get_state(chunked),
            list(self.waiting),
            self.arrived,
            self.period,
            self.pending,
            self.pending_close,
        )

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        base, waiting, self.arrived, self.period, self.pending, self.pending_close = state
        self.waiting = deque(waiting)
        super().set_state(base)


class ExtentOperator(_Aggregating):
    """A domain-driven window (``FROM s [RANGE r SLIDE s] GROUP BY g``) for one group.

    Extent ``[e - r, e)`` is a RANGE frame read at its last instant ``e - 1``: tuples are
    accumulated on arrival, and the timer at ``e - 1`` (after every tuple at that
    instant) retracts those below ``e - r`` and emits one row if the extent is not
    empty. ESL-shaped aggregates give their result through ``terminate``. After a
    non-empty extent (``showing``), the next extent end fires even if empty, so that a
    relation-to-stream DSTREAM sees the group's row go.
    """

    def __init__(self, window: ExtentWindow) -> None:
        if window.range_ms <= 0 or window.slide_ms <= 0:
            raise ValueError("extent RANGE and SLIDE must be positive")
        super().__init__(window.aggregates)
        self.window = window
        self.key: dict[str, Any] | None = None
        self.closed = -END_OF_TIME  # end of the last extent closed
        self.showing = False  # whether that extent had rows

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Accumulate the group; extents are emitted by timers."""
        ts = group[0][0]
        for _, row in group:
            if self.key is None:
                self.key = {c: row[c] for c in self.window.group_by}
            self._add(ts, row, keep_row=False, expires=True)
        return []

    def next_timer(self) -> int | None:
        """The last instant of the next extent that may hold the oldest buffered tuple, or
        of the one right after a non-empty extent."""
        slide = self.window.slide_ms
        if self.showing:
            return self.closed + slide - 1
        if not self.buffer:
            return None
        end = (max(self.buffer[0][1], self.closed) // slide + 1) * slide
        return end - 1

    def fire(self, instant: int) -> list[Result]:
        """Close the extent ending at ``instant + 1``."""
        end = instant + 1
        start = end - self.window.range_ms
        self._drop_before(start)
        self.closed = end
        self.showing = bool(self.buffer)
        if not self.buffer:
            return []
        values: list[list[Any]] = []
        for agg, inc, view in zip(self.aggs, self.incremental, self.views, strict=True):
            if inc:
                values.append([agg.get_value()])  # type: ignore[attr-defined]
            else:
                assert view is not None  # an ESL-shaped aggregate has its inwindow
                values.append(list(agg.terminate(view)))
        row = {**(self.key or {}), "window_start": start, "window_end": end}
        return _combine(end, row, self.calls, values)

    def settle(self, watermark: int) -> None:
        """Tuples leave at extent closes (timers), never in between."""

    def idle(self, watermark: int) -> bool:
        """Every extent holding a tuple has closed, the empty one after it too (a
        relation sees the group go): a later tuple's extents begin after ``closed``."""
        return not self.showing and self._at_rest()

    def idle_wakeup(self) -> int | None:
        """None: extent closes are timers."""
        return None

    def residue(self) -> Any:
        """Nothing survives (``closed`` lies before every later tuple's extents)."""
        return None

    def resume(self, residue: Any) -> None:
        """Nothing to take back."""

    def get_state(self, chunked: bool = False) -> Any:
        """The frame's state plus the group key and the last extent closed."""
        return (super().get_state(chunked), self.key, self.closed, self.showing)

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        base, self.key, self.closed, self.showing = state
        super().set_state(base)


class PaneOperator(_Evicting):
    """``ROWS n PRECEDING SLIDE s`` over algebraic aggregates, by panes (ESL §5.1, ex. 15).

    The stream is cut into panes of ``g = gcd(n + 1, s)`` rows, each summarised by one
    partial aggregate per call instead of its tuples; every yield tuple ends a pane, and
    its window is exactly the last ``k = (n + 1) / g`` panes. The panes slide through a
    :class:`_PaneQueue` (only ``merge`` needed, no inverse), so a yield costs O(1)
    merges amortised. State: at most
    ``k + 2`` partials per call (``window / slide + 2`` when the slide divides the
    window) against ``n + 1`` buffered tuples without panes. Outputs equal
    :class:`OverOperator`'s up to float round-off (partials merge, not retract).
    """

    def __init__(self, window: OverWindow) -> None:
        assert pane_eligible(window)
        assert window.preceding is not None and window.slide_rows is not None
        self.calls = window.aggregates
        self.slide = window.slide_rows
        self.pane_rows = math.gcd(window.preceding + 1, self.slide)
        self.per_window = (window.preceding + 1) // self.pane_rows
        self._add = pane_accumulator(self.calls)
        self.queue = _PaneQueue(self.calls)  # completed panes, numbered from 0
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
                out.extend(_combine(ts, row, self.calls, values))
        return out

    def partials(self) -> int:
        """How many partial aggregates (per call) the operator holds."""
        return len(self.queue) + 2

    def next_timer(self) -> int | None:
        """Row panes need no timers."""
        return None

    def fire(self, instant: int) -> list[Result]:
        """Nothing to fire."""
        return []

    def settle(self, watermark: int) -> None:
        """Panes move by arrivals only."""

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


MAX_EXTENT_PANES = 4096
"""An extent window runs on panes only if an extent spans at most this many (``r /
gcd(r, s)``): its state is then bounded whatever the tuple rate."""


class _PaneQueue:
    """A FIFO of pane partials ``(pane index, one partial per call)`` whose total merge is
    read in O(1) amortised with ``merge`` only: ``back`` holds the newest panes and their
    running merge ``back_total``; ``front`` holds suffix merges of the oldest ones
    (oldest on top), rebuilt from ``back`` when it runs dry."""

    def __init__(self, calls: tuple[AggCall, ...]) -> None:
        self.calls = calls
        # A pane per slide can mean a partial per output: construct, don't look up.
        self.makers = tuple(_maker(c) for c in calls)
        self.reads_merged = all(agg.merged_value is not None for agg in self.fresh())
        self.front: list[tuple[int, list[IncrementalAggregate]]] = []
        self.back: list[tuple[int, list[IncrementalAggregate]]] = []
        self.back_total = self.fresh()

    def fresh(self) -> list[IncrementalAggregate]:
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
        def states(part: list[IncrementalAggregate]) -> list[Any]:
            return [a.get_state() for a in part]

        return (
            [(j, states(p)) for j, p in self.front],
            [(j, states(p)) for j, p in self.back],
            states(self.back_total),
        )

    def set_state(self, state: Any) -> None:
        front, back, back_total = state
        self.front = [(j, self.restored(p)) for j, p in front]
        self.back = [(j, self.restored(p)) for j, p in back]
        self.back_total = self.restored(back_total)

    def restored(self, states: list[Any]) -> list[IncrementalAggregate]:
        aggs = self.fresh()
        for agg, st in zip(aggs, states, strict=True):
            agg.set_state(st)
        return aggs


class PaneExtentOperator(_Evicting):
    """Extents ``[e - r, e)`` (``FROM s [RANGE r SLIDE s]``) over algebraic aggregates, by
    panes: ESL example 15's cascade of a tumble and a pane-less window, for logical
    windows (ESL §5.1, "similar optimization can also be applied in the case of logical
    windows"). Time is cut into panes ``[j*g, (j+1)*g)`` with ``g = gcd(r, s)``, aligned
    to the epoch like the extents, so every extent is exactly the ``r / g`` panes before
    its end: each pane keeps one partial per call (the tumble), and an extent's result
    is the merge of its panes (the window over panes), slid through a
    :class:`_PaneQueue`. State: at most ``r / g + 2`` partials per call against every
    tuple of the last ``r`` for :class:`ExtentOperator`; results equal its results up to
    float round-off (partials merge, tuples are not retracted). Timers, the group key,
    ``closed`` and ``showing`` work as in :class:`ExtentOperator`.
    """

    def __init__(self, window: ExtentWindow) -> None:
        assert extent_pane_eligible(window)
        self.window = window
        self.calls = window.aggregates
        self.pane_ms = math.gcd(window.range_ms, window.slide_ms)
        self._add = pane_accumulator(self.calls)
        self._aliases = [c.alias for c in self.calls]
        self.queue = _PaneQueue(self.calls)
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

    def run(
        self, pending: list[tuple[int, str, int, int, Row]], i: int, n: int, watermark: int
    ) -> tuple[int, list[Result]]:
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
        self, pending: list[tuple[int, str, int, int, Row]], i: int, n: int, watermark: int
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

    def arrive_slot(
        self, pending: list[tuple[int, str, int, int, Row]], i: int, n: int, watermark: int
    ) -> int:
        """``arrive`` for a run of the evaluator's sorted ``pending`` entries ``(ts,
        source, seq, tiebreak, row)`` from index ``i`` (below ``n``): those below
        ``watermark`` that come before the next timer. Returns the index after the run;
        no outputs (extents are emitted by timers)."""
        return self._drive(pending, i, n, watermark, None)

    def _drive(
        self,
        pending: list[tuple[int, str, int, int, Row]],
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

    def set_tuple_state(self, state: Any) -> None:
        """Restore an :class:`ExtentOperator` state (a version-5 snapshot, from before
        extents ran on panes): its buffered tuples' arguments, pane by pane."""
        (buffer, *_), self.key, self.closed, self.showing = state
        for _, ts, _, args in buffer:
            index = ts // self.pane_ms
            if self.current is None or index != self.current_index:
                self._close_pane()
                self.current, self.current_index = self.queue.fresh(), index
            for agg, a in zip(self.current, args, strict=True):
                agg.accumulate(*a)


def extent_pane_eligible(window: ExtentWindow) -> bool:
    """Whether :class:`PaneExtentOperator` runs ``window``: algebraic aggregates only, and
    at most :data:`MAX_EXTENT_PANES` panes per extent."""
    panes = window.range_ms // math.gcd(window.range_ms, window.slide_ms)
    return panes <= MAX_EXTENT_PANES and all(_algebraic(c) for c in window.aggregates)


class RelationOperator(_Evicting):
    """A CQL window of raw tuples read as a relation (:class:`plan.RelationWindow`) for
    one key, with the query's relation-to-stream operator applied.

    Every tuple is in R during an interval ``[enter, leave)`` of instants: for a
    time-based window fixed by its ts (``_interval``), for a ROWS window from its arrival
    to the arrival that pushes it out. R changes only at those instants, so the operator
    visits exactly them: arrivals (``arrive``, which also takes the entries and leaves
    due at that instant) and timers (``fire``, the next ``enter`` of a waiting tuple or
    ``leave`` of a member). At each such instant τ, with E the rows of the tuples
    entering and L of those leaving (R changes if either is not empty), R(τ) - R(τ-1) =
    E - L and R(τ-1) - R(τ) = L - E (bags): ISTREAM emits the first, DSTREAM the second,
    RSTREAM all of R(τ), at event time τ. A tuple's rows are ``post`` applied to it once,
    on arrival; the results are final rows (the evaluator runs no ``post`` on them).

    State: ``waiting``, tuples that have arrived but enter later (a lag, or an extent
    not yet ended), as ``(enter, leave, rows)``; ``members``, the tuples in R, as
    ``(leave, rows)``, both in arrival order (enter and leave grow with ts). Members
    that never leave are not kept unless RSTREAM needs them.
    """

    def __init__(self, window: RelationWindow, r2s: R2S, post: tuple[StatelessOp, ...]) -> None:
        _check_relation(window)
        self.window = window
        self.r2s = r2s
        self._rows = compiled_ops(post)  # a tuple's rows: post applied once, on arrival
        self.rows_frame = window.units is FrameUnits.ROWS
        leaves = self.rows_frame or window.range_ms is not None or bool(window.reset_every_ms)
        self.keep = leaves or r2s is R2S.RSTREAM
        self.waiting: deque[tuple[int, int | None, list[Row]]] = deque()
        self.members: deque[tuple[int | None, list[Row]]] = deque()

    def _interval(self, ts: int) -> tuple[int, int | None] | None:
        """``(enter, leave)`` of a tuple at ``ts`` in a time-based window (leave None:
        never), or None if it is never in R."""
        w = self.window
        if (w.since_ms is not None and ts < w.since_ms) or (
            w.until_ms is not None and ts > w.until_ms
        ):
            return None
        if w.slide_ms is not None:
            # In R(τ) iff in the extent [e - r, e) of e = the last multiple of s <= τ.
            assert w.range_ms is not None
            enter = (ts // w.slide_ms + 1) * w.slide_ms
            leave = ((ts + w.range_ms) // w.slide_ms + 1) * w.slide_ms
            return (enter, leave) if enter < leave else None
        enter = ts + w.lag_ms
        if w.range_ms is not None:
            return enter, enter + w.range_ms + 1
        if w.reset_every_ms:
            return enter, (ts // w.reset_every_ms + 1) * w.reset_every_ms
        return enter, None

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """The instant of the group: its tuples enter (now or later), others leave."""
        now = group[0][0]
        if self.rows_frame:
            return self._arrive_rows(now, group)
        interval = self._interval(now)
        entering: list[tuple[int | None, list[Row]]] = []
        if interval is not None:
            enter, leave = interval
            if enter == now:
                entering = [(leave, self._rows(row)) for _, row in group]
            else:
                self.waiting.extend((enter, leave, self._rows(row)) for _, row in group)
        return self._instant(now, entering)

    def _arrive_rows(self, now: int, group: list[Arrival]) -> list[Result]:
        """ROWS n: the group joins its partition's window, the overflow leaves (the
        oldest first; new tuples beyond the last n are never in R)."""
        assert self.window.rows is not None
        new = [self._rows(row) for _, row in group]
        overflow = len(self.members) + len(new) - self.window.rows
        left = [self.members.popleft()[1] for _ in range(min(max(overflow, 0), len(self.members)))]
        entered = new[max(overflow - len(left), 0) :]
        self.members.extend((None, rows) for rows in entered)
        return self._emit(now, entered, left)

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

    def _emit(self, now: int, entered: list[list[Row]], left: list[list[Row]]) -> list[Result]:
        """The outputs at ``now`` of tuples with these rows entering and leaving. R
        changes only if one of them has rows (a tuple the WHERE drops changes nothing)."""
        if not any(entered) and not any(left):
            return []
        if self.r2s is R2S.RSTREAM:
            return [(now, row) for _, rows in self.members for row in rows]
        new = [row for rows in entered for row in rows]
        old = [row for rows in left for row in rows]
        if self.r2s is R2S.DSTREAM:
            new, old = old, new
        return [(now, row) for row in bag_minus(new, old)]

    def next_timer(self) -> int | None:
        """The next instant where a waiting tuple enters or a member leaves."""
        times = []
        if self.waiting:
            times.append(self.waiting[0][0])
        if self.members and self.members[0][0] is not None:
            times.append(self.members[0][0])
        return min(times) if times else None

    def fire(self, instant: int) -> list[Result]:
        """The changes at ``instant`` (no tuple arrives then)."""
        return self._instant(instant, [])

    def settle(self, watermark: int) -> None:
        """Every change is at a timer or an arrival: nothing silent."""

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


def bag_minus(rows: list[Row], other: list[Row]) -> list[Row]:
    """``rows`` minus ``other`` as bags (one copy of ``other`` cancels one of ``rows``),
    the survivors in their order. Linear when the values hash (a relation of many
    groups is diffed at every change), else by comparison."""
    if not other or not rows:
        return rows
    try:
        counts = Counter(tuple(row.items()) for row in other)
        kept = []
        for row in rows:
            key = tuple(row.items())
            if counts[key]:
                counts[key] -= 1
            else:
                kept.append(row)
        return kept
    except TypeError:  # an unhashable value (a Python aggregate's list, say)
        remaining = list(other)
        kept = []
        for row in rows:
            if row in remaining:
                remaining.remove(row)
            else:
                kept.append(row)
        return kept


def _check_relation(window: RelationWindow) -> None:
    """Reject relation windows the definitions do not cover."""
    if window.units is FrameUnits.ROWS:
        if window.rows is None or window.rows < 1:
            raise ValueError("a ROWS relation window holds at least one row")
        times = (window.range_ms, window.slide_ms, window.reset_every_ms, window.since_ms)
        if any(v is not None for v in (*times, window.until_ms)) or window.lag_ms:
            raise ValueError("a ROWS relation window has no time parameters")
        return
    if window.rows is not None:
        raise ValueError("a RANGE relation window has no row count")
    if window.range_ms is not None and window.range_ms < 0:
        raise ValueError("RANGE cannot be negative")
    if window.lag_ms < 0:
        raise ValueError("LAG cannot be negative")
    if window.slide_ms is not None and (
        window.slide_ms <= 0 or window.range_ms is None or window.range_ms <= 0 or window.lag_ms
    ):
        raise ValueError("a sliding relation window needs positive RANGE and SLIDE, no LAG")
    bounded = window.since_ms is not None or window.until_ms is not None
    if (bounded or window.reset_every_ms is not None) and window.range_ms is not None:
        raise ValueError("bounds and RESET EVERY apply to unbounded relation windows only")
    if window.reset_every_ms is not None and window.reset_every_ms <= 0:
        raise ValueError("RESET EVERY needs a positive period")
    if window.lag_ms and window.range_ms is None:
        raise ValueError("LAG applies to a bounded RANGE relation window only")


def _incremental(call: AggCall) -> IncrementalAggregate:
    agg = make_aggregate(call.name, call.factory)
    assert isinstance(agg, IncrementalAggregate)
    return agg


def _maker(call: AggCall) -> Callable[[], IncrementalAggregate]:
    """What makes the call's incremental aggregate (checked once, here)."""
    first = _incremental(call)
    return call.factory if call.factory is not None else type(first)  # type: ignore[return-value]


def pane_eligible(window: OverWindow) -> bool:
    """Whether :class:`PaneOperator` can run ``window``: a plain ROWS frame sliding by
    more than one row, over algebraic aggregates only."""
    if not (
        window.units is FrameUnits.ROWS
        and window.preceding is not None
        and window.slide_rows is not None
        and window.slide_rows > 1
        and not window.lag
        and window.reset_every_ms is None
    ):
        return False
    return all(_algebraic(c) for c in window.aggregates)


def _algebraic(call: AggCall) -> bool:
    """Whether the call's partials merge: declared ALGEBRAIC (UDA), or a built-in that is."""
    if call.factory is not None:
        return call.algebraic
    return bool(getattr(_aggregate_class(call), "algebraic", False))


def _aggregate_class(call: AggCall) -> type:
    return type(make_aggregate(call.name, call.factory))


def _check(window: OverWindow) -> None:
    """Reject window specs the semantics pins do not define."""
    bounded_range = window.units is FrameUnits.RANGE and window.preceding is not None
    if window.active_expiration and not bounded_range:
        raise ValueError("ACTIVE EXPIRATION needs a bounded RANGE frame")
    if window.active_expiration and (window.slide_rows or window.slide_ms or window.lag):
        raise ValueError("ACTIVE EXPIRATION cannot be combined with SLIDE or LAG")
    if window.slide_rows and window.slide_ms:
        raise ValueError("a window slides in rows or in time, not both")
    if (window.since_ms is not None or window.until_ms is not None) and (
        window.units is not FrameUnits.RANGE or window.preceding is not None
    ):
        raise ValueError("SINCE/UNTIL bounds apply to RANGE landmark windows only")
    if window.reset_every_ms is not None and window.reset_every_ms <= 0:
        raise ValueError("RESET EVERY needs a positive period")
    if window.lag < 0:
        raise ValueError("LAG cannot be negative")


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
