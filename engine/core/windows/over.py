"""The data-driven window operator (``agg OVER (...)``) for one partition: a frame
(:mod:`~engine.core.windows.frames`, which tuples the window holds) composed with an emit
policy (:mod:`~engine.core.windows.emits`, which outputs leave and when), as the planner
chose them for the window's form."""

from __future__ import annotations

from typing import Any

from engine.core.chunks import ChunkedBuffer, ChunkReader
from engine.core.windows.base import Operator, Result
from engine.core.windows.emits import EveryTuple, SlotBatch
from engine.core.windows.frames import Frame


class OverOperator(Operator):
    """``frame`` and ``emit`` over one partition. State: the frame's contents, its
    waiting tuples and reset period, and the policy's tuple count and pending yield.

    ``chunk_span``: if the frame only appends tuples and expires them by time (a RANGE
    frame, not a relation, not pruned), how far apart the tuples of a chunk may lie when
    the runtime keeps the buffer in chunks (:meth:`store_in_chunks`); None: never."""

    def __init__(self, frame: Frame, emit: EveryTuple, chunk_span: int | None) -> None:
        self.frame, self.emit, self.chunk_span = frame, emit, chunk_span
        self.contents = frame.contents
        # The policy's own method: the evaluator calls it per distinct timestamp.
        self.arrive = emit.arrive  # type: ignore[method-assign]

    @property
    def arrive_slot(self) -> SlotBatch | None:
        """The call taking a time slot's arrivals at once, if the policy has one."""
        return self.emit.batched()

    def next_timer(self) -> int | None:
        """The earliest slot close or active expiration (passive expiry needs no timer:
        ``arrive`` and ``settle`` do it, in the same order relative to the arrivals)."""
        return self.emit.next_timer()

    def fire(self, instant: int) -> list[Result]:
        """Close the time slot ending at ``instant`` or run the active expirations due at
        it."""
        return self.emit.fire(instant)

    def settle(self, watermark: int) -> None:
        """Run the silent events below ``watermark`` in instant order: lagged tuples
        entering the frame, then (passive expiry) tuples leaving it. No future tuple's
        frame can tell the difference, and idle partitions let go of old tuples."""
        self.emit.settle()
        self.frame.settle(watermark)

    @property
    def chunks(self) -> ChunkedBuffer | None:
        """The buffer's chunks, when the runtime keeps it in chunks."""
        return self.contents.chunks

    def store_in_chunks(self, read: ChunkReader | None) -> bool:
        """Keep the buffer in chunks between batches (:mod:`engine.core.chunks`), read
        through ``read``, if ``chunk_span`` allows. Returns whether it does."""
        if self.chunk_span is None:
            return False
        self.contents.store_in_chunks(self.chunk_span, read)
        return True

    def prepare(self, watermark: int) -> None:
        """Load the stored chunks an advance to ``watermark`` may expire."""
        self.contents.prepare(watermark)

    def stored_chunks(self) -> list[int]:
        """The numbers of the buffer's chunks in the store (none unless chunked)."""
        return self.contents.stored_chunks()

    def idle(self, watermark: int) -> bool:
        """Nothing waits (lagged tuples, a slot's yield) and the frame is at rest."""
        if self.emit.pending is not None or self.frame.waiting:
            return False
        return self.frame.idle(watermark)

    def idle_wakeup(self) -> int | None:
        """When time alone empties the frame (the newest tuple leaves a passive RANGE
        frame, a reset period ends); None otherwise (ROWS and UNBOUNDED frames keep
        their tuples, active expiration and slides move by timers)."""
        return self.frame.idle_wakeup()

    def at_rest(self) -> bool:
        """Whether the window is empty and its aggregates as new."""
        return self.contents.at_rest()

    def residue(self) -> Any:
        """A row slide's place in its slot."""
        return self.emit.residue()

    def resume(self, residue: Any) -> None:
        """Take back the row slide's place."""
        self.emit.resume(residue)

    def get_state(self, chunked: bool = False) -> Any:
        """The contents' state plus the lag queue, counters and the pending yield."""
        emit = self.emit
        emit.settle()  # the yield's values as they were when it arrived
        waiting, period = self.frame.get_state()
        return (
            self.contents.get_state(chunked),
            waiting,
            emit.arrived,
            period,
            emit.pending,
            emit.pending_close,
        )

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        base, waiting, arrived, period, pending, pending_close = state
        emit = self.emit
        emit.arrived, emit.pending, emit.pending_close = arrived, pending, pending_close
        self.frame.set_state(waiting, period)
        self.contents.set_state(base)
