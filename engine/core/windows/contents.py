"""What a window with aggregates holds: its tuples and one aggregate per call.

A frame (:mod:`engine.core.windows.frames`) decides when tuples enter and leave; these
pieces keep them, in a buffer of ``(uid, ts, row, args)`` entries, oldest first (``row``
is None unless the window's outputs need the expiring tuple's columns), and keep the
aggregates up to date. The planner picks one of three from the calls:

* :class:`IncrementalContents`: every aggregate is incremental (accumulate / retract),
  the common case, kept lean: it runs per tuple;
* :class:`MixedContents`: some aggregates are ESL-shaped (``initialize`` / ``iterate``
  / ``expire`` / ``terminate`` over an ``inwindow``), one :class:`CallSlot` per call;
* :class:`PruningContents`: only ESL-shaped aggregates, in a frame whose tuples leave by
  time, so the buffer keeps only the tuples some ``inwindow`` still holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from engine.core.aggregates import IncrementalAggregate, WindowAggregate, make_aggregate
from engine.core.chunks import ChunkedBuffer, ChunkReader
from engine.core.plan import AggCall
from engine.core.windows.base import Emissions, Row

Args = tuple[tuple[Any, ...], ...]
"""One tuple's argument tuple per aggregate call."""
Entry = tuple[int, int, Row | None, Args]
"""A buffered tuple: (uid, ts, row or None, args)."""
Pending = list[tuple[int, str, int, int, Row]]
"""The evaluator's sorted arrivals: (ts, source, seq, tiebreak, row)."""


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


def args_reader(calls: tuple[AggCall, ...]) -> Callable[[Row], Args]:
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


class Contents:
    """The buffer, the uid counter, whether the next tuple is the window's first
    (ESL's INITIALIZE), and the chunks the runtime may keep the buffer in
    (:mod:`engine.core.chunks`). Subclasses hold the aggregates."""

    aggs: list[WindowAggregate]

    def __init__(self, calls: tuple[AggCall, ...]) -> None:
        self.calls = calls
        self.buffer: deque[Entry] = deque()
        self.added = 0  # tuples ever added: their uids
        self.fresh = True  # the next tuple gets INITIALIZE
        self.no_emissions: Emissions = [[] for _ in calls]  # shared, never mutated
        self.chunks: ChunkedBuffer | None = None
        self.read_args = args_reader(calls)
        self._start()

    def _start(self) -> None:
        """Every aggregate afresh."""
        raise NotImplementedError

    def restart(self) -> None:
        """Empty the window and start every aggregate afresh (a landmark reset)."""
        self._start()
        self.buffer.clear()
        if self.chunks is not None:
            self.chunks.cleared()
        self.fresh = True

    def add(self, ts: int, row: Row, keep_row: bool, expires: bool) -> Emissions:
        """Feed one tuple to every aggregate, and to the buffer if it ``expires`` (an
        UNBOUNDED frame's never do: no need to remember them), with its row if
        ``keep_row``; return the ESL-shaped aggregates' emissions per call (empty lists
        for the incremental ones)."""
        raise NotImplementedError

    def values(self, emitted: Emissions) -> Emissions:
        """``emitted`` with the incremental aggregates' current values filled in."""
        raise NotImplementedError

    def drop_before(self, horizon: int) -> None:
        """Passive expiry: remove every tuple with ts < ``horizon`` (nobody reads values)."""
        raise NotImplementedError

    def expire_oldest(self) -> tuple[Row | None, Emissions]:
        """Remove the oldest tuple, running ``retract``/``expire``; return its row and
        the values emitted per call (incremental: the value after the retraction)."""
        raise NotImplementedError

    def terminate(self) -> Emissions:
        """Each call's result over the window as it is (an extent's close)."""
        raise NotImplementedError

    def views(self) -> list[BufferView | None]:
        """Each call's ``inwindow`` (None for an incremental aggregate)."""
        raise NotImplementedError

    def _set_aggregates(self, states: list[Any], views: list[Any]) -> None:
        raise NotImplementedError

    def at_rest(self) -> bool:
        """Whether the window is empty and every aggregate gives what a new one would:
        nothing buffered or in an inwindow, each aggregate at rest
        (:meth:`~engine.core.aggregates.WindowAggregate.at_rest`), and no aggregate
        whose first tuple is special (its own ``initialize``) past its first tuple."""
        if self.buffer or any(v is not None and v.entries for v in self.views()):
            return False
        if not self.fresh and any(
            type(agg).initialize is not WindowAggregate.initialize for agg in self.aggs
        ):
            return False
        blank = [make_aggregate(c.name, c.factory) for c in self.calls]
        return all(agg.at_rest(new) for agg, new in zip(self.aggs, blank, strict=True))

    def store_in_chunks(self, span: int, read: ChunkReader | None) -> None:
        """Keep the buffer in chunks of tuples ``span`` ms apart at most, read through
        ``read``."""
        self.chunks = ChunkedBuffer(span, read)

    def prepare(self, watermark: int) -> None:
        """Load the stored chunks an advance to ``watermark`` may expire."""
        if self.chunks is not None:
            self.buffer = self.chunks.prepare(self.buffer, watermark)

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
            [None if v is None else list(v.entries) for v in self.views()],
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
        self._set_aggregates(aggs, views)


class IncrementalContents(Contents):
    """Every aggregate incremental. The hot paths bind the aggregates' methods once per
    (re)start: per tuple, every attribute lookup counts."""

    def _start(self) -> None:
        self.aggs = [make_aggregate(c.name, c.factory) for c in self.calls]
        aggs: list[Any] = self.aggs  # incremental by the planner's choice
        self.accumulators = [a.accumulate for a in aggs]
        self.retractors = [a.retract for a in aggs]

    def add(self, ts: int, row: Row, keep_row: bool, expires: bool) -> Emissions:
        args = self.read_args(row)
        self.added += 1
        if expires:
            self.buffer.append((self.added, ts, row if keep_row else None, args))
        # Equal lengths by construction; strict checking would cost on every tuple.
        for accumulate, a in zip(self.accumulators, args, strict=False):
            accumulate(*a)
        return self.no_emissions

    def values(self, emitted: Emissions) -> Emissions:
        return [[agg.get_value()] for agg in self.aggs]  # type: ignore[attr-defined]

    def drop_before(self, horizon: int) -> None:
        buffer, retracts = self.buffer, self.retractors
        while buffer and buffer[0][1] < horizon:
            for retract, a in zip(retracts, buffer.popleft()[3], strict=False):
                retract(*a)

    def expire_oldest(self) -> tuple[Row | None, Emissions]:
        _, _, row, args = self.buffer.popleft()
        if row is None:  # passive expiry: nobody reads values
            for retract, a in zip(self.retractors, args, strict=False):
                retract(*a)
            return row, self.no_emissions
        emitted: Emissions = []
        for agg, a in zip(self.aggs, args, strict=True):
            agg.retract(*a)  # type: ignore[attr-defined]
            emitted.append([agg.get_value()])  # type: ignore[attr-defined]
        return row, emitted

    def terminate(self) -> Emissions:
        return [[agg.get_value()] for agg in self.aggs]  # type: ignore[attr-defined]

    def slide_through(self, pending: Pending, i: int, n: int, stop: int, reach: int) -> int:
        """Passive RANGE ``reach`` frame: each of the evaluator's ``pending`` entries
        from index ``i`` (below ``n``) with ts below ``stop`` expires the tuples before
        its frame and enters, in the order one ``drop_before`` and ``add`` per tuple
        would take (so the same floating-point sums). Returns the index after the last
        one."""
        buffer, added = self.buffer, self.added
        j = i
        calls = self.calls
        if len(calls) == 1 and len(calls[0].args) == 1:
            # One aggregate of one argument (avg(speed)): no zips, no argument lists.
            only = calls[0].args[0]
            accumulate, retract = self.accumulators[0], self.retractors[0]
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
            read, accumulates, retracts = self.read_args, self.accumulators, self.retractors
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
        return j

    def views(self) -> list[BufferView | None]:
        return [None for _ in self.calls]

    def _set_aggregates(self, states: list[Any], views: list[Any]) -> None:
        for agg, s in zip(self.aggs, states, strict=True):
            agg.set_state(s)


class CallSlot:
    """One aggregate call of a window holding ESL-shaped aggregates (base: an
    incremental aggregate, read through its value)."""

    def __init__(self, agg: WindowAggregate) -> None:
        self.agg: Any = agg

    @property
    def view(self) -> BufferView | None:
        """The call's ``inwindow`` (None: an incremental aggregate keeps none)."""
        return None

    def add(self, uid: int, args: tuple[Any, ...], fresh: bool) -> list[Any]:
        """Take tuple ``uid``; what it emits (an incremental aggregate: nothing yet)."""
        self.agg.accumulate(*args)
        return []

    def value(self, emitted: list[Any]) -> list[Any]:
        """The values an output reads, given what the tuple emitted."""
        return [self.agg.get_value()]

    def expire(self, uid: int, args: tuple[Any, ...]) -> list[Any]:
        """Let tuple ``uid``, the oldest, go; what that emits."""
        self.agg.retract(*args)
        return [self.agg.get_value()]

    def terminate(self) -> list[Any]:
        """The result over the window as it is."""
        return [self.agg.get_value()]

    def set_view(self, entries: Any) -> None:
        """Restore the inwindow (an incremental aggregate has none)."""


class EslSlot(CallSlot):
    """An ESL-shaped aggregate and its ``inwindow``: the new tuple joins ``inwindow``
    after ``iterate``; an expiring tuple is still ``oldest()`` during ``expire``;
    tuples ``delete`` d from it never expire."""

    def __init__(self, agg: WindowAggregate) -> None:
        super().__init__(agg)
        self._view = BufferView()

    @property
    def view(self) -> BufferView:
        return self._view

    def add(self, uid: int, args: tuple[Any, ...], fresh: bool) -> list[Any]:
        agg, view = self.agg, self._view
        step = agg.initialize if fresh else agg.iterate
        emitted = [*step(args, view), *agg.terminate(view)]
        view.entries.append((uid, args))
        return emitted

    def value(self, emitted: list[Any]) -> list[Any]:
        return emitted

    def expire(self, uid: int, args: tuple[Any, ...]) -> list[Any]:
        view = self._view
        if view.entries and view.entries[0][0] == uid:
            emitted = list(self.agg.expire(args, view))
            view.entries.popleft()
            return emitted
        return []  # deleted from inwindow earlier: it does not expire

    def terminate(self) -> list[Any]:
        return list(self.agg.terminate(self._view))

    def set_view(self, entries: Any) -> None:
        self._view = BufferView(deque(entries))


class MixedContents(Contents):
    """Some aggregates ESL-shaped: one slot per call, of the kind the planner chose
    (:class:`CallSlot` or :class:`EslSlot`)."""

    def __init__(self, calls: tuple[AggCall, ...], kinds: tuple[type[CallSlot], ...]) -> None:
        self.kinds = kinds
        super().__init__(calls)

    def _start(self) -> None:
        self.slots = [
            kind(make_aggregate(c.name, c.factory))
            for kind, c in zip(self.kinds, self.calls, strict=True)
        ]
        self.aggs = [slot.agg for slot in self.slots]

    def add(self, ts: int, row: Row, keep_row: bool, expires: bool) -> Emissions:
        args = self.read_args(row)
        self.added += 1
        uid, fresh = self.added, self.fresh
        if expires:
            self.buffer.append((uid, ts, row if keep_row else None, args))
        emitted = [slot.add(uid, a, fresh) for slot, a in zip(self.slots, args, strict=True)]
        self.fresh = False
        return emitted

    def values(self, emitted: Emissions) -> Emissions:
        return [slot.value(em) for slot, em in zip(self.slots, emitted, strict=True)]

    def drop_before(self, horizon: int) -> None:
        # Read the buffer afresh each time: pruning after an expire replaces it.
        while self.buffer and self.buffer[0][1] < horizon:
            self.expire_oldest()

    def expire_oldest(self) -> tuple[Row | None, Emissions]:
        uid, _, row, args = self.buffer.popleft()
        return row, [slot.expire(uid, a) for slot, a in zip(self.slots, args, strict=True)]

    def terminate(self) -> Emissions:
        return [slot.terminate() for slot in self.slots]

    def views(self) -> list[BufferView | None]:
        return [slot.view for slot in self.slots]

    def _set_aggregates(self, states: list[Any], views: list[Any]) -> None:
        for slot, s, v in zip(self.slots, states, views, strict=True):
            slot.agg.set_state(s)
            slot.set_view(v)


class PruningContents(MixedContents):
    """Only ESL-shaped aggregates, tuples leaving by time: a tuple no inwindow holds any
    more can neither emit nor be read when it expires, so it leaves the buffer at once.
    Keeping it would hold every tuple of the range in the state (a silence detector
    deletes all but the newest) and fire a timer at each one's expiry."""

    def add(self, ts: int, row: Row, keep_row: bool, expires: bool) -> Emissions:
        emitted = super().add(ts, row, keep_row, expires)
        self._prune()
        return emitted

    def expire_oldest(self) -> tuple[Row | None, Emissions]:
        expired = super().expire_oldest()
        self._prune()  # an expire may delete from inwindow too
        return expired

    def _prune(self) -> None:
        views = [v for v in self.views() if v is not None]
        live = len(views[0].entries) if len(views) == 1 else None
        if live == len(self.buffer):
            return
        kept = {uid for v in views for uid, _ in v.entries}
        if len(kept) < len(self.buffer):
            self.buffer = deque(e for e in self.buffer if e[0] in kept)


def slot_kind(call: AggCall) -> type[CallSlot]:
    """The slot a call's aggregate takes (made once to see its kind)."""
    incremental = isinstance(make_aggregate(call.name, call.factory), IncrementalAggregate)
    return CallSlot if incremental else EslSlot
