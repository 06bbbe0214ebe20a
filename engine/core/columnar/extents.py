"""Domain-driven windows (``FROM s [RANGE r SLIDE s] GROUP BY g``) per column, on panes.

The extents are ``[e - r, e)`` for every ``e`` a multiple of the slide; each non-empty
one gives one row per group, with event time ``e``, once the watermark passes ``e``.
Rows are summed into panes of ``gcd(r, s)`` (ESL's pane optimisation, Flink's slices):
an extent is the parts of the panes it covers, and a group keeps only the panes a later
extent can still cover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from engine.core.columnar import aggregates as agg
from engine.core.columnar.stage import ColumnarRunner
from engine.core.plan import ExtentWindow, Stage
from engine.core.runners import TS, HasStore, Key


@dataclass
class PaneParts:
    """One aggregate over a group's panes: the running totals before each pane's first
    row and after its last (rows, non-NULL values, sum), and its least and greatest."""

    before: tuple[np.ndarray, np.ndarray, np.ndarray]
    end: tuple[np.ndarray, np.ndarray, np.ndarray]
    least: np.ndarray
    most: np.ndarray

    def select(self, keep: np.ndarray) -> PaneParts:
        return PaneParts(
            tuple(a[keep] for a in self.before),
            tuple(a[keep] for a in self.end),
            self.least[keep],
            self.most[keep],
        )


@dataclass
class Panes:
    """A group's panes (numbers ascending), each aggregate's parts of them, and its
    running totals after its rows so far."""

    numbers: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    parts: list[PaneParts] = field(default_factory=list)
    totals: list[tuple[int, int, Any]] = field(default_factory=list)
    closed: int | None = None
    """Every extent ending at or before this instant has been emitted."""


class ExtentRunner(ColumnarRunner):
    """An extent window stage per column (module docstring)."""

    kind = "columnar-extent"

    def __init__(self, index: int, stage: Stage, owner: HasStore) -> None:
        super().__init__(index, stage, owner)
        window = stage.query.window
        assert isinstance(window, ExtentWindow)
        self.spec = window
        self.range, self.slide = window.range_ms, window.slide_ms
        self.pane = math.gcd(window.range_ms, window.slide_ms)

    def new_state(self, key: Key) -> Panes:
        return Panes(totals=[agg.START] * len(self.spec.aggregates))

    def wakeup(self, state: Panes) -> int | None:
        """The end of the next extent holding one of the group's panes."""
        firsts, _ = self._spans(state.numbers, after=state.closed)
        return int(firsts[0]) if len(firsts) else None

    def _spans(
        self, numbers: np.ndarray, after: int | None = None, upto: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The extent ends in ``(after, upto]`` whose extent holds one of the panes
        ``numbers`` (ascending), as runs of consecutive grid points: their first and last
        ends, ascending. A pane lies in the extents ending on the grid points of ``[pane
        end, pane start + range]``; both bounds grow with the pane, so the runs of
        neighbouring panes overlap or touch unless a gap lies between them."""
        p, s, r = self.pane, self.slide, self.range
        first = -(-(numbers + 1) * p // s) * s
        last = (numbers * p + r) // s * s
        if after is not None:
            first = np.maximum(first, (after // s + 1) * s)
        if upto is not None:
            last = np.minimum(last, upto // s * s)
        held = last >= first
        first, last = first[held], last[held]
        if not len(first):
            return first, last
        opens = np.flatnonzero(np.concatenate([[True], first[1:] > last[:-1] + s]))
        closes = np.concatenate([opens[1:] - 1, [len(first) - 1]])
        return first[opens], last[closes]

    def _ends(self, numbers: np.ndarray, after: int | None, upto: int) -> np.ndarray:
        """Every extent end in ``(after, upto]`` whose extent holds one of the panes
        ``numbers``, ascending."""
        firsts, lasts = self._spans(numbers, after, upto)
        counts = (lasts - firsts) // self.slide + 1
        total = int(counts.sum())
        steps = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        return np.repeat(firsts, counts) + steps * self.slide

    def window(
        self, key: Key, state: Panes, watermark: int, span: tuple[int, int]
    ) -> pa.Table | None:
        rows = self.rows_in(span)
        n = rows.num_rows
        if n:
            ts = np.asarray(rows.column(self.stage.timestamp).to_numpy(zero_copy_only=False))
            numbers = ts // self.pane
            cuts = np.flatnonzero(np.concatenate([[True], numbers[1:] != numbers[:-1]]))
            lo, hi = cuts, np.concatenate([cuts[1:], [n]])
            fresh = []
            totals = []
            for call, start in zip(self.spec.aggregates, state.totals, strict=True):
                column = agg.Column.of(call.vector_args[0](rows) if call.args else None, n)  # type: ignore[index]
                prefix = agg.Prefix.after(column, start)
                least, most = agg.extremes(column, lo, hi)
                end = (prefix.rows[hi - 1], prefix.valid[hi - 1], prefix.total[hi - 1])
                fresh.append(PaneParts(prefix.before(lo), end, least, most))
                totals.append(prefix.end())
            state.totals = totals
            self._merge(state, numbers[lo], fresh)
        due = self._ends(state.numbers, state.closed, watermark)
        out = self._extents(key, state, due) if len(due) else None
        state.closed = watermark if state.closed is None else max(state.closed, watermark)
        # A later extent ends after the watermark: it covers no pane before this one.
        keep = (state.numbers + 1) * self.pane > watermark - self.range
        if not keep.all():
            state.numbers = state.numbers[keep]
            state.parts = [p.select(keep) for p in state.parts]
        return out

    def _merge(self, state: Panes, numbers: np.ndarray, fresh: list[PaneParts]) -> None:
        """Add the batch's panes: its first may go on with the group's last (rows of one
        pane in two batches), the others follow."""
        if not len(state.numbers):
            state.numbers, state.parts = numbers, fresh
            return
        overlap = int(state.numbers[-1] == numbers[0])
        merged = []
        for old, new in zip(state.parts, fresh, strict=True):
            if overlap:
                # The pane goes on: its totals now end with the batch's first pane.
                end = tuple(a.copy() for a in old.end)
                for part in range(3):
                    end[part][-1] = new.end[part][0]
                least, most = old.least.copy(), old.most.copy()
                both_least = agg.combine_extremes(least[-1:], new.least[:1], np.minimum)
                both_most = agg.combine_extremes(most[-1:], new.most[:1], np.maximum)
                least, most = least.astype(both_least.dtype), most.astype(both_most.dtype)
                least[-1], most[-1] = both_least[0], both_most[0]
                old = PaneParts(old.before, end, least, most)  # type: ignore[arg-type]
                new = new.select(np.arange(1, len(numbers)))
            merged.append(
                PaneParts(
                    tuple(
                        np.concatenate([a, b]) for a, b in zip(old.before, new.before, strict=True)
                    ),  # type: ignore[arg-type]
                    tuple(np.concatenate([a, b]) for a, b in zip(old.end, new.end, strict=True)),  # type: ignore[arg-type]
                    _join(old.least, new.least),
                    _join(old.most, new.most),
                )
            )
        state.numbers = np.concatenate([state.numbers, numbers[overlap:]])
        state.parts = merged

    def _extents(self, key: Key, state: Panes, ends: np.ndarray) -> pa.Table:
        """One row per extent ending at ``ends`` that holds a pane."""
        starts = ends - self.range
        # Panes [q*p, (q+1)*p) inside [start, end): start <= q*p and (q+1)*p <= end.
        lo = np.searchsorted(state.numbers * self.pane, starts, "left")
        hi = np.searchsorted((state.numbers + 1) * self.pane, ends, "right")
        keep = hi > lo
        lo, hi, starts, ends = lo[keep], hi[keep], starts[keep], ends[keep]
        columns: dict[str, Any] = {
            name: pa.array([value] * len(ends))
            for name, value in zip(self.spec.group_by, key, strict=True)
        }
        columns["window_start"] = pa.array(starts, pa.int64())
        columns["window_end"] = pa.array(ends, pa.int64())
        for call, parts in zip(self.spec.aggregates, state.parts, strict=True):
            last = hi - 1
            valid = parts.end[1] - parts.before[1] > 0
            found = agg.parts(
                tuple(a[last] for a in parts.end),  # type: ignore[arg-type]
                tuple(a[lo] for a in parts.before),  # type: ignore[arg-type]
                _extreme(parts.least, valid, lo, hi, np.minimum),
                _extreme(parts.most, valid, lo, hi, np.maximum),
            )
            columns[call.alias] = agg.finish(call, found)
        columns[TS] = pa.array(ends, pa.int64())
        return pa.table(columns)

    def idle(self, state: Panes, watermark: int) -> bool:
        """Every extent holding one of the group's panes has been emitted: a later row's
        extents end after ``closed`` and cover none of them."""
        return self.wakeup(state) is None

    def residue(self, state: Panes) -> Any:
        """The running totals an extent's sums are differences of."""
        return state.totals

    def resume(self, state: Panes, residue: Any) -> None:
        state.totals = residue

    def dump(self, key: Key, store: Any) -> Any:
        state: Panes = self.states[key]
        return (state.numbers, state.parts, state.totals, state.closed)

    def load(self, key: Key, data: Any) -> Panes:
        numbers, parts, totals, closed = data
        return Panes(numbers, parts, totals, closed)


def _join(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype != b.dtype:
        kind = object if object in (a.dtype, b.dtype) else np.float64
        return np.concatenate([a.astype(kind), b.astype(kind)])
    return np.concatenate([a, b])


def _extreme(
    values: np.ndarray, valid: np.ndarray, lo: np.ndarray, hi: np.ndarray, fn: Any
) -> np.ndarray:
    """The least or greatest of panes ``[lo, hi)`` that hold a non-NULL value."""
    if values.dtype == object:
        pick = min if fn is np.minimum else max
        return np.array(
            [
                pick((v for v, ok in zip(values[a:b], valid[a:b], strict=True) if ok), default=None)
                for a, b in zip(lo, hi, strict=True)
            ],
            dtype=object,
        )
    return agg.range_extreme(values, valid, lo, hi, fn)
