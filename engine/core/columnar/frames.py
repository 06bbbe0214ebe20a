"""The frames of data-driven windows per column: which rows an output's aggregates
cover, and what a key keeps between batches.

:class:`RowsFrame` (the row and the ``n`` before it, physically: ties in (ts, source,
seq) order), :class:`SlicedRowsFrame` (the same for a long frame, its rows kept in
stored slices), :class:`RangeFrame` (``[ts - t, ts]``, peers included, its rows kept in
stored slices), :class:`UnboundedFrame` (everything so far: running parts; ``RANGE``
takes peers, ``ROWS`` does not). :mod:`engine.core.columnar.over` composes one with an
emit policy.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from engine.core.columnar import aggregates as agg


@dataclass
class Run:
    """Rows of a key in (ts, source, seq) order as a frame reads them: event times, one
    argument column per aggregate, and each aggregate's running totals after each row."""

    ts: np.ndarray
    columns: list[agg.Column]
    prefixes: list[agg.Prefix]

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, start: int, end: int) -> Run:
        """Rows ``[start, end)``, their running totals with them."""
        prefixes = []
        for p in self.prefixes:
            before = p.before(np.array([start]))
            first = (int(before[0][0]), int(before[1][0]), before[2][0].item())
            prefixes.append(
                agg.Prefix(p.rows[start:end], p.valid[start:end], p.total[start:end], first)
            )
        return Run(self.ts[start:end], [c.take(start, end) for c in self.columns], prefixes)

    def ends(self, index: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per aggregate, the running totals after rows ``index``."""
        return [(p.rows[index], p.valid[index], p.total[index]) for p in self.prefixes]

    def starts(self, index: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per aggregate, the running totals before rows ``index``."""
        return [p.before(index) for p in self.prefixes]

    @staticmethod
    def then(first: Run, second: Run) -> Run:
        """``second``'s rows after ``first``'s (its totals continue ``first``'s)."""
        if not len(second):  # a key run by its wakeup: its columns have no type to join
            return first
        return Run(
            np.concatenate([first.ts, second.ts]),
            [
                agg.Column(
                    np.concatenate([a.values, b.values])
                    if a.values.dtype == b.values.dtype
                    else np.concatenate([a.values.astype(object), b.values.astype(object)]),
                    np.concatenate([a.valid, b.valid]),
                    a.numeric and b.numeric,
                    (a.extremes[0] or b.extremes[0], a.extremes[1] or b.extremes[1]),
                )
                for a, b in zip(first.columns, second.columns, strict=True)
            ],
            [
                agg.Prefix(
                    np.concatenate([a.rows, b.rows]),
                    np.concatenate([a.valid, b.valid]),
                    np.concatenate([a.total, b.total.astype(a.total.dtype)])
                    if len(a.total)
                    else b.total,
                    a.start,
                )
                for a, b in zip(first.prefixes, second.prefixes, strict=True)
            ],
        )


def _extremes(run: Run, lo: np.ndarray, hi: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    return [agg.extremes(c, lo, hi) for c in run.columns]


SliceLoader = Callable[[int], "Run"]
"""Reads a stored slice's rows back (slice number -> its rows)."""


class Frame(Protocol):
    """Which rows an output's aggregates cover, and what a key keeps between batches
    (``kept``: a frame's own shape, :meth:`fresh` for a new key)."""

    def fresh(self) -> Any:
        """What a new key keeps."""
        ...

    def parts(self, kept: Any, new: Run, emit: np.ndarray) -> list[agg.Parts]:
        """Each aggregate's parts over the frames of the rows ``emit`` of ``new``."""
        ...

    def keep(self, kept: Any, new: Run, watermark: int) -> Any:
        """What the key keeps after ``new``, advanced to ``watermark``."""
        ...

    def empty(self, kept: Any) -> bool:
        """Whether nothing kept can reach a later row's frame."""
        ...

    def idle_wakeup(self, kept: Any) -> int | None:
        """The watermark at which time alone empties the frame (None: never)."""
        ...


class _Lasting:
    """A frame whose rows stay for every later row's frame: a key is never idle."""

    def fresh(self) -> Any:
        return None

    def empty(self, kept: Any) -> bool:
        return False

    def idle_wakeup(self, kept: Any) -> int | None:
        return None


class RowsFrame(_Lasting):
    """``ROWS n PRECEDING``: the row and the ``n`` rows before it; a key keeps its last
    ``n`` rows."""

    def __init__(self, preceding: int) -> None:
        self.n = preceding

    def parts(self, kept: Run | None, new: Run, emit: np.ndarray) -> list[agg.Parts]:
        whole = new if kept is None else Run.then(kept, new)
        at = emit + (0 if kept is None else len(kept))
        lo = np.maximum(at - self.n, 0)
        ends, starts = whole.ends(at), whole.starts(lo)
        extremes = _extremes(whole, lo, at + 1)
        return [
            agg.parts(e, s, least, most)
            for e, s, (least, most) in zip(ends, starts, extremes, strict=True)
        ]

    def keep(self, kept: Run | None, new: Run, watermark: int) -> Run | None:
        whole = new if kept is None else Run.then(kept, new)
        return whole.take(max(len(whole) - self.n, 0), len(whole)) if self.n else None


class UnboundedFrame(_Lasting):
    """``UNBOUNDED PRECEDING``: every row so far; a key keeps its least and greatest
    values (its sums are its running totals). ``RANGE`` frames take a row's later peers
    too, ``ROWS`` frames end at the row itself."""

    def __init__(self, peers: bool) -> None:
        self.peers = peers

    def parts(
        self, kept: list[tuple[np.ndarray, np.ndarray]] | None, new: Run, emit: np.ndarray
    ) -> list[agg.Parts]:
        hi = np.searchsorted(new.ts, new.ts[emit], "right") if self.peers else emit + 1
        zero = np.zeros(len(emit), dtype=np.int64)
        out = []
        for i, (e, (least, most)) in enumerate(
            zip(new.ends(hi - 1), _extremes(new, zero, hi), strict=True)
        ):
            if kept is not None:
                before_least, before_most = (np.repeat(x, len(emit)) for x in kept[i])
                least = agg.combine_extremes(before_least, least, np.minimum)
                most = agg.combine_extremes(before_most, most, np.maximum)
            origin = (zero, zero, np.zeros(len(emit), dtype=e[2].dtype))
            out.append(agg.parts(e, origin, least, most))
        return out

    def keep(
        self, kept: list[tuple[np.ndarray, np.ndarray]] | None, new: Run, watermark: int
    ) -> list[tuple[np.ndarray, np.ndarray]] | None:
        if not len(new):
            return kept
        n = np.array([len(new)])
        now = _extremes(new, np.zeros(1, dtype=np.int64), n)
        if kept is None:
            return now
        return [
            (
                agg.combine_extremes(a_least, b_least, np.minimum),
                agg.combine_extremes(a_most, b_most, np.maximum),
            )
            for (a_least, a_most), (b_least, b_most) in zip(kept, now, strict=True)
        ]


@dataclass
class Slice:
    """Rows of a RANGE frame's key that arrived together: stored once (``number``), with
    their first and last event times and each aggregate's least and greatest values;
    the rows themselves stay in memory only while a frame's start may fall among them."""

    number: int
    first: int
    last: int
    extremes: list[tuple[Any, Any]]
    run: Run | None = None
    stored: bool = False
    size: int = 0

    @staticmethod
    def of(number: int, run: Run) -> Slice:
        """A new (not yet stored) slice of ``run``'s rows."""
        whole = _extremes(run, np.zeros(1, dtype=np.int64), np.array([len(run)]))
        extremes = [(least[0], most[0]) for least, most in whole]
        return Slice(number, int(run.ts[0]), int(run.ts[-1]), extremes, run, False, len(run))


@dataclass
class SliceBuffer:
    """A RANGE frame key's rows, in slices (oldest first)."""

    slices: list[Slice] = field(default_factory=list)
    next_number: int = 0
    dropped: list[int] = field(default_factory=list)  # stored slices to delete
    paged: tuple[int, int] = (0, 0)  # pages [a, b) of slice descriptions in the store


class RangeFrame:
    """``RANGE t PRECEDING``: rows in ``[ts - t, ts]``, later peers included. A key keeps
    the rows of the last ``t`` in slices. An output's sums are its running totals minus
    those before the frame's first row, found in the batch's rows or in one slice (read
    back from the store if not in memory); its extremes combine the batch's rows, that
    slice's rows from there, and the later slices' own extremes."""

    def __init__(self, range_ms: int, load: SliceLoader) -> None:
        self.t = range_ms
        self.load = load  # for a slice not in memory

    def fresh(self) -> SliceBuffer:
        return SliceBuffer()

    def empty(self, kept: SliceBuffer) -> bool:
        """Every row has left every later row's frame (the frame let go of its slices
        below ``watermark - t``)."""
        return not kept.slices

    def idle_wakeup(self, kept: SliceBuffer) -> int | None:
        """When the newest row leaves (``last + t + 1``)."""
        return int(kept.slices[-1].last) + self.t + 1 if kept.slices else None

    def parts(self, kept: SliceBuffer, new: Run, emit: np.ndarray) -> list[agg.Parts]:
        ts = new.ts[emit]
        start = ts - self.t
        hi = np.searchsorted(new.ts, ts, "right")  # peers included
        lo = np.searchsorted(new.ts, start, "left")
        ends = new.ends(hi - 1)
        starts = new.starts(lo)
        extremes = _extremes(new, lo, hi)
        slices = kept.slices
        reach = lo == 0  # the frame may start among the kept rows
        if slices and reach.any():
            # Slices in arrival order end in time order; only those between the earliest
            # and the latest frame start are looked at (a long frame keeps a thousand).
            low = bisect.bisect_left(slices, int(start[reach].min()), key=_last)
            high = bisect.bisect_left(slices, int(start[reach].max()), key=_last) + 1
            last = np.array([s.last for s in slices[low:high]], dtype=np.int64)
            first_in = low + np.searchsorted(last, start, "left")  # first slice with a row in it
            for b in np.unique(first_in[reach]):
                if b >= len(slices):
                    continue  # every kept row is before the frame
                at = np.flatnonzero(reach & (first_in == b))
                run = _loaded(slices[b], self.load)
                begin = np.searchsorted(run.ts, start[at], "left")
                _start_in_slice(slices, int(b), at, begin, starts, extremes)
        return [
            agg.parts(e, s, least, most)
            for e, s, (least, most) in zip(ends, starts, extremes, strict=True)
        ]

    def keep(self, kept: SliceBuffer, new: Run, watermark: int) -> SliceBuffer:
        if len(new):
            kept.slices.append(Slice.of(kept.next_number, new))
            kept.next_number += 1
        horizon = watermark - self.t  # a later row's frame starts at or after it
        while kept.slices and kept.slices[0].last < horizon:
            gone = kept.slices.pop(0)
            if gone.stored:
                kept.dropped.append(gone.number)
        return kept


def _last(piece: Slice) -> int:
    return piece.last


def _loaded(piece: Slice, load: Any) -> Run:
    """``piece``'s rows, read back from the store if they left memory."""
    if piece.run is None:
        piece.run = load(piece.number)
    return piece.run


def _start_in_slice(
    slices: list[Slice],
    b: int,
    at: np.ndarray,
    begin: np.ndarray,
    starts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    extremes: list[tuple[np.ndarray, np.ndarray]],
) -> None:
    """Outputs ``at`` have frames starting at rows ``begin`` of slice ``b`` (in memory):
    their running totals before the frame come from that slice, and their extremes (so
    far over the batch's rows) take in the rest of it and every later slice."""
    run = slices[b].run
    assert run is not None
    before = run.starts(begin)
    suffix = _extremes(run, begin, np.full(len(at), len(run), dtype=np.int64))
    for i in range(len(starts)):
        for part in range(3):
            starts[i][part][at] = before[i][part]
        if run.columns[i].extremes == (False, False):
            continue  # a count, sum or avg: its extremes are never read
        least, most = suffix[i]
        for later in slices[b + 1 :]:
            low, high = later.extremes[i]
            least = agg.combine_extremes(
                least, np.repeat(np.array([low], dtype=least.dtype), len(at)), np.minimum
            )
            most = agg.combine_extremes(
                most, np.repeat(np.array([high], dtype=most.dtype), len(at)), np.maximum
            )
        all_least, all_most = extremes[i]
        merged_least = agg.combine_extremes(all_least[at], least, np.minimum)
        merged_most = agg.combine_extremes(all_most[at], most, np.maximum)
        all_least = all_least.astype(merged_least.dtype)
        all_most = all_most.astype(merged_most.dtype)
        all_least[at], all_most[at] = merged_least, merged_most
        extremes[i] = (all_least, all_most)


SLICE_ROWS = 256
"""Rows a :class:`SlicedRowsFrame` slice gathers (rewritten each batch meanwhile) before
later rows start a new one."""


class SlicedRowsFrame(_Lasting):
    """``ROWS n PRECEDING`` for a long frame: the key's last ``n`` rows in slices of
    about :data:`SLICE_ROWS` rows, each stored once full, so a batch writes the rows it
    added, not all ``n`` (the whole frame pickled into the key's state every batch made
    most of a busy batch's state bytes). Sums and extremes come from the slices as in
    :class:`RangeFrame`; a frame's first row is found by counting rows, not by time."""

    def __init__(self, preceding: int, load: SliceLoader) -> None:
        self.n = preceding
        self.load = load  # for a slice not in memory

    def fresh(self) -> SliceBuffer:
        return SliceBuffer()

    def parts(self, kept: SliceBuffer, new: Run, emit: np.ndarray) -> list[agg.Parts]:
        slices = kept.slices
        offsets = np.concatenate([[0], np.cumsum([s.size for s in slices])]).astype(np.int64)
        held = int(offsets[-1])  # kept rows, before the batch's
        lo = np.maximum(held + emit - self.n, 0)  # each frame's first row, kept rows first
        reach = lo < held  # the frame starts among the kept rows
        lo_new = np.where(reach, 0, lo - held)
        ends, starts = new.ends(emit), new.starts(lo_new)
        extremes = _extremes(new, lo_new, emit + 1)
        if reach.any():
            first_in = np.searchsorted(offsets, lo, "right") - 1
            for b in np.unique(first_in[reach]):
                at = np.flatnonzero(reach & (first_in == b))
                _loaded(slices[b], self.load)
                _start_in_slice(slices, int(b), at, lo[at] - offsets[b], starts, extremes)
        return [
            agg.parts(e, s, least, most)
            for e, s, (least, most) in zip(ends, starts, extremes, strict=True)
        ]

    def keep(self, kept: SliceBuffer, new: Run, watermark: int) -> SliceBuffer:
        if len(new):
            last = kept.slices[-1] if kept.slices else None
            if last is not None and last.size < SLICE_ROWS:
                # Same number: the stored copy is overwritten when the state is saved.
                kept.slices[-1] = Slice.of(last.number, Run.then(_loaded(last, self.load), new))
            else:
                kept.slices.append(Slice.of(kept.next_number, new))
                kept.next_number += 1
        held = sum(s.size for s in kept.slices)
        # The next row's frame starts at row held - n: a slice wholly before it is done.
        while kept.slices and held - kept.slices[0].size >= self.n:
            gone = kept.slices.pop(0)
            held -= gone.size
            if gone.stored:
                kept.dropped.append(gone.number)
        return kept
