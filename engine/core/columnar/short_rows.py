"""``count``, ``min`` and ``max`` over a short ``ROWS n PRECEDING`` frame, every row an
output: computed for all keys of a batch at once.

:class:`~engine.core.columnar.over.OverRunner` computes a key's frames with a few dozen
array operations per key, whatever its rows: with a row per vehicle and a key per lane,
a batch's keys have a hundred rows each and those operations were most of the stage's
time. Here a key's turn only notes where its rows are and keeps its last ``n``; the
frames are computed in :meth:`ShortRowsRunner.assemble`, over every key's kept rows and
new rows laid end to end: a frame is the ``n + 1`` positions ending at its row, cut at
its key's first position, so ``n + 1`` shifted array operations per aggregate serve the
whole batch. Counts and extremes are exact in any order; sums and averages stay with
``OverRunner`` (their bits come from each key's running sum).

The key's state is :class:`~engine.core.columnar.over.OverKey`, its ``kept`` a
:class:`~engine.core.columnar.frames.Run` of the last ``n`` rows (the running totals
are not kept: nothing here reads them), so a state ``OverRunner`` saved for the same
window resumes here.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engine.core.columnar import aggregates as agg
from engine.core.columnar.frames import RowsFrame, Run
from engine.core.columnar.over import EveryRow, OverKey, OverRunner
from engine.core.columnar.stage import Picked
from engine.core.plan import AggCall, Stage
from engine.core.runners import TS, HasStore, Key

SHORT_ROWS_BELOW = 16
"""Frames of fewer rows than this (``n + 1``) are computed by shifts."""

KINDS = ("count", "min", "max")


def short_rows_calls(calls: tuple[AggCall, ...]) -> bool:
    """Whether every call is one :class:`ShortRowsRunner` computes."""
    return all(agg.columnar_call(c) and c.name in KINDS for c in calls)


class ShortRowsRunner(OverRunner):
    """``ROWS n PRECEDING`` (``n + 1`` below :data:`SHORT_ROWS_BELOW`), every row an
    output, counts and extremes only (module docstring)."""

    def __init__(self, index: int, stage: Stage, owner: HasStore, preceding: int) -> None:
        # The frame's rows are kept and read here; `RowsFrame` says what a key keeps.
        super().__init__(index, stage, owner, lambda load: RowsFrame(preceding), EveryRow())
        self.n = preceding

    def window(
        self, key: Key, state: OverKey, watermark: int, span: tuple[int, int]
    ) -> Picked | None:
        start, end = span
        if end == start:
            return None  # (no wakeup is ever asked for)
        kept: Run | None = state.kept
        state.count += end - start
        state.kept = self._last_rows(kept, start, end)
        return Picked(np.arange(start, end, dtype=np.int64), kept)

    def _last_rows(self, kept: Run | None, start: int, end: int) -> Run | None:
        """The last ``n`` of the kept rows and the batch's rows ``[start, end)``."""
        n = self.n
        if not n:
            return None
        lo = max(end - n, start)
        ts = self._ts[lo:end]
        columns = [c.take(lo, end) for c in self._columns]
        missing = n - (end - lo)
        if kept is not None and missing > 0 and len(kept):
            ts = np.concatenate([kept.ts[-missing:], ts])
            columns = [
                agg.Column(
                    _join(old.values[-missing:], new.values),
                    np.concatenate([old.valid[-missing:], new.valid]),
                    old.numeric and new.numeric,
                    new.extremes,
                )
                for old, new in zip(kept.columns, columns, strict=True)
            ]
        return Run(ts, columns, [])

    def assemble(self, final: pa.Table, picked: list[Picked]) -> pa.Table:
        """Every picked row's frames at once (module docstring), as ``OverRunner``
        builds its table."""
        index = np.concatenate([p.index for p in picked])
        kept_sizes = np.array([len(p.values) if p.values is not None else 0 for p in picked])
        new_sizes = np.array([len(p.index) for p in picked])
        sizes = kept_sizes + new_sizes
        offsets = np.cumsum(sizes) - sizes  # each key's first position
        first = np.repeat(offsets, sizes)
        # The new rows' positions: after their key's kept rows.
        is_new = np.ones(int(sizes.sum()), dtype=bool)
        is_new[np.repeat(offsets, kept_sizes) + _ranges(kept_sizes)] = False
        at = np.flatnonzero(is_new)
        lo = np.maximum(first[at], at - self.n)
        values = final.take(pa.array(index, pa.int64()))
        for i, call in enumerate(self.calls):
            column = self._columns[i]
            pieces, valid = [], []
            for p in picked:
                if p.values is not None and len(p.values):
                    pieces.append(p.values.columns[i].values)
                    valid.append(p.values.columns[i].valid)
                pieces.append(column.values[p.index[0] : p.index[-1] + 1])
                valid.append(column.valid[p.index[0] : p.index[-1] + 1])
            joined = _join(*pieces)
            laid = agg.Column(joined, np.concatenate(valid), joined.dtype != object)
            parts = self._parts(laid, lo, at, call.name)
            values = values.append_column(call.alias, agg.finish(call, parts))
        return values.append_column(TS, values.column(self.stage.timestamp))

    def _parts(self, laid: agg.Column, lo: np.ndarray, at: np.ndarray, kind: str) -> agg.Parts:
        """Rows and non-NULL values of each frame ``[lo, at]``, and its least (``kind``
        min) or greatest (max) value: a count reads neither."""
        rows = at - lo + 1
        before = np.concatenate([[0], np.cumsum(laid.valid, dtype=np.int64)])
        valid = before[at + 1] - before[lo]
        unused = np.zeros(len(at))
        if kind == "count":
            return agg.Parts(rows, valid, unused, unused, unused)
        if not laid.numeric:
            least, most = agg.extremes(laid, lo, at + 1)
            return agg.Parts(rows, valid, unused, least, most)
        pick = np.minimum if kind == "min" else np.maximum
        extreme = np.full(len(at), agg._identity(laid.values.dtype, pick), laid.values.dtype)
        for back in range(self.n + 1):
            position = at - back
            inside = position >= lo
            ok = inside & laid.valid[np.where(inside, position, at)]
            extreme = np.where(ok, pick(extreme, laid.values[np.where(ok, position, at)]), extreme)
        if kind == "min":
            return agg.Parts(rows, valid, unused, extreme, unused)
        return agg.Parts(rows, valid, unused, unused, extreme)


def _join(*arrays: np.ndarray) -> np.ndarray:
    """Arrays end to end; mixed kinds (a state saved with another type) as objects."""
    if len({a.dtype for a in arrays}) > 1 and any(a.dtype == object for a in arrays):
        return np.concatenate([a.astype(object) for a in arrays])
    return np.concatenate(arrays)


def _ranges(sizes: np.ndarray) -> np.ndarray:
    """0, 1, ..., size - 1 for each size, end to end."""
    total = int(sizes.sum())
    return np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
