"""Data-driven windows (``agg OVER (...)``) per column: a frame, an emit policy and
built-in aggregates, composed.

* **Frame** — which rows an output's aggregates cover, and what a key keeps between
  batches (:mod:`engine.core.columnar.frames`).
* **Emit policy** — which rows give an output: :class:`EveryRow`, :class:`RowSlide`
  (the last row of each ``k``-row slot), :class:`TimeSlide` (the last row of each time
  slot ``[j*s, (j+1)*s)``, emitted once the watermark passes the slot: the slot's last
  row so far waits in the key's state, its values already computed).

Which frame and policy serve a window is the planner's choice
(:func:`engine.core.planner.runners.runner_for`). The SQL:2003 window function over the
input in (ts, source, seq) order is the pin, the same one the per-row runner holds;
`tests/engine/test_columnar.py` holds them equal.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from engine.core.columnar import aggregates as agg

# `Run` is also how a key's state pickled before the frames had a module of their own
# finds the class: keep it importable from here.
from engine.core.columnar.frames import Frame, Run, Slice, SliceBuffer, SliceLoader
from engine.core.columnar.stage import ColumnarRunner, Picked
from engine.core.plan import OverWindow, Stage
from engine.core.runners import SLICE_PAGE, TS, HasStore, Key, key_json
from engine.core.state import StateStore, dumps

READ_BACK = 4
"""A frame's start reads stored rows back from the first slices only (the frame let go of
those before): rows of slices ``1 .. READ_BACK - 1`` leave memory at each save."""
PAGE_SLICES = 64
"""Slices whose descriptions (numbers, event times, extremes, sizes) are stored together
in one page once none of them can change: a key's own state then holds the
descriptions of its last few slices, not of all (a 15-minute RANGE frame keeps about
a thousand slices at a batch a second)."""

# ---- emit policies -------------------------------------------------------------------------


class EveryRow:
    """Every row gives an output."""

    def choose(self, state: OverKey, new: Run) -> np.ndarray:
        """The rows of ``new`` that give an output."""
        return np.arange(len(new), dtype=np.int64)

    def hold(
        self,
        state: OverKey,
        times: np.ndarray,
        picked: Picked,
        watermark: int,
        assemble: Callable[[list[Picked]], pa.Table],
    ) -> Picked:
        """The outputs ``picked`` (of rows at ``times``) that leave now; the others wait
        in ``state`` as a table ``assemble`` builds (none by default)."""
        return picked


class RowSlide(EveryRow):
    """``SLIDE k`` rows: the last row of each ``k``-row slot of the key's rows."""

    def __init__(self, rows: int) -> None:
        self.k = rows

    def choose(self, state: OverKey, new: Run) -> np.ndarray:
        position = state.count + np.arange(1, len(new) + 1)
        return np.flatnonzero(position % self.k == 0).astype(np.int64)


class TimeSlide(EveryRow):
    """``SLIDE s`` of time: the last row of each slot ``[j*s, (j+1)*s)``."""

    def __init__(self, slide_ms: int) -> None:
        self.s = slide_ms

    def choose(self, state: OverKey, new: Run) -> np.ndarray:
        if not len(new):
            return np.zeros(0, dtype=np.int64)
        slot = new.ts // self.s
        return np.flatnonzero(np.concatenate([slot[1:] != slot[:-1], [True]])).astype(np.int64)

    def hold(
        self,
        state: OverKey,
        times: np.ndarray,
        picked: Picked,
        watermark: int,
        assemble: Callable[[list[Picked]], pa.Table],
    ) -> Picked:
        """The last slot's row waits while its slot is open."""
        closes = (times // self.s + 1) * self.s - 1
        if closes[-1] < watermark:
            return picked
        last = len(times) - 1
        index, parts = picked.index, picked.values
        state.waiting = assemble([Picked(index[last:], [p.take(last, None) for p in parts])])
        state.closes = int(closes[-1])
        return Picked(index[:last], [p.take(0, last) for p in parts], picked.before)


# ---- the runner --------------------------------------------------------------------------


@dataclass
class OverKey:
    """A key's state: rows seen, what its frame keeps, and (time slides) the slot's last
    row so far with its values, waiting for the slot to close."""

    count: int = 0
    kept: Any = None
    waiting: pa.Table | None = None
    closes: int | None = None
    totals: list[tuple[int, int, Any]] = field(default_factory=list)
    """Each aggregate's running totals after the key's rows so far (aggregates.Prefix)."""


class OverRunner(ColumnarRunner):
    """An OVER window stage per column (module docstring): the frame ``frame`` makes
    (given how to read a stored slice back) and the emit policy ``emit``."""

    kind = "columnar-over"

    def __init__(
        self,
        index: int,
        stage: Stage,
        owner: HasStore,
        frame: Callable[[SliceLoader], Frame],
        emit: EveryRow,
    ) -> None:
        super().__init__(index, stage, owner)
        window = stage.query.window
        assert isinstance(window, OverWindow)
        self.window_spec = window
        self.calls = window.aggregates
        self.frame = frame(self._load_slice)
        self.emit = emit
        self._loading: Key = ()

    def new_state(self, key: Key) -> OverKey:
        return OverKey(kept=self.frame.fresh(), totals=[agg.START] * len(self.calls))

    def wakeup(self, state: OverKey) -> int | None:
        return None if state.closes is None else state.closes + 1

    def window(
        self, key: Key, state: OverKey, watermark: int, span: tuple[int, int]
    ) -> Picked | pa.Table | None:
        self._loading = key
        new = self._run(span, state.totals)
        emit = self.emit.choose(state, new)
        before = None
        if state.waiting is not None:
            assert state.closes is not None
            if len(new) and new.ts[0] <= state.closes:
                state.waiting = state.closes = None  # a later row of its slot replaces it
            elif state.closes < watermark:
                before = state.waiting  # its slot is over
                state.waiting = state.closes = None
        picked = None
        if len(emit):
            parts = self.frame.parts(state.kept, new, emit)
            picked = self.emit.hold(
                state,
                new.ts[emit],
                Picked(emit + span[0], parts, before),
                watermark,
                lambda held: self.assemble(self._final, held),
            )
        state.count += len(new)
        state.totals = [p.end() for p in new.prefixes]
        state.kept = self.frame.keep(state.kept, new, watermark)
        return picked if picked is not None else before

    def assemble(self, final: pa.Table, picked: list[Picked]) -> pa.Table:
        """The picked rows of ``final``, each aggregate's value and ``_ts``: one take and
        one column per aggregate for all keys."""
        index = np.concatenate([p.index for p in picked])
        values = final.take(pa.array(index, pa.int64()))
        for i, call in enumerate(self.calls):
            parts = agg.Parts.concat([p.values[i] for p in picked])
            values = values.append_column(call.alias, agg.finish(call, parts))
        return values.append_column(TS, values.column(self.stage.timestamp))

    def begin(self, final: pa.Table) -> None:
        """Each aggregate's argument over all the batch's rows, computed once."""
        n = final.num_rows
        self._final = final
        self._ts = np.asarray(
            final.column(self.stage.timestamp).to_numpy(zero_copy_only=False), dtype=np.int64
        )
        self._columns = []
        for call in self.calls:
            column = agg.Column.of(call.vector_args[0](final) if call.args else None, n)  # type: ignore[index]
            column.extremes = (call.name == "min", call.name == "max")
            self._columns.append(column)

    def _run(self, span: tuple[int, int], totals: list[tuple[int, int, Any]]) -> Run:
        """The key's rows ``span`` of the batch, their running totals from ``totals``."""
        start, end = span
        if start == end:
            ts = np.zeros(0, dtype=np.int64)
            columns = [
                agg.Column(
                    np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), True, (False, False)
                )
                for _ in self.calls
            ]
        else:
            ts = self._ts[start:end]
            columns = [c.take(start, end) for c in self._columns]
        prefixes = [agg.Prefix.after(c, t) for c, t in zip(columns, totals, strict=True)]
        return Run(ts, columns, prefixes)

    # -- a RANGE frame's slices in the store -------------------------------------------
    def _load_slice(self, number: int) -> Run:
        store = self.owner.store
        assert store is not None, "a slice left memory without a store"
        data = store.get(("slice", self.stage.name, key_json(self._loading), number))
        if data is None:
            raise KeyError(f"slice {number} of {self.stage.name} {self._loading} missing")
        return pickle.loads(data)

    def dump(self, key: Key, store: StateStore) -> Any:
        state: OverKey = self.states[key]
        kept = state.kept
        if isinstance(kept, SliceBuffer):
            text = key_json(key)
            for number in kept.dropped:
                store.delete(("slice", self.stage.name, text, number))
            kept.dropped = []
            # The slices not yet stored are the newest: no walk over a long frame's all.
            new = 0
            for piece in reversed(kept.slices):
                if piece.stored:
                    break
                store.put(("slice", self.stage.name, text, piece.number), dumps(piece.run))
                piece.stored, new = True, new + 1
            # Only the front slice is read again soon (a frame's start moves forward), and
            # the last one, which the next rows may join. Rows in memory elsewhere are the
            # new slices' and those a frame's start read back, next to the front.
            for piece in (*kept.slices[1:READ_BACK], *kept.slices[-new - 1 : -1]):
                piece.run = None
            kept = self._page(text, kept, store)
        return (state.count, kept, state.waiting, state.closes, state.totals)

    def _page(self, text: str, kept: SliceBuffer, store: StateStore) -> tuple:
        """Store the pages of slice descriptions that can no longer change, delete those
        whose slices are all gone; the key's state keeps the rest (``PAGE_SLICES``).

        Slice numbers run on without gaps and a slice may change only while it is the
        last (a ROWS frame's filling slice): page ``p`` (slices ``[p*P, (p+1)*P)``) is
        final once slice ``(p+1)*P`` exists."""
        first = kept.slices[0].number if kept.slices else kept.next_number
        low, final = first // PAGE_SLICES, max(kept.next_number - 1, 0) // PAGE_SLICES
        for page in range(kept.paged[0], min(low, kept.paged[1])):
            store.delete((SLICE_PAGE, self.stage.name, text, page))
        for page in range(max(kept.paged[1], low), final):
            lo, hi = page * PAGE_SLICES - first, (page + 1) * PAGE_SLICES - first
            pieces = kept.slices[max(lo, 0) : max(hi, 0)]
            store.put((SLICE_PAGE, self.stage.name, text, page), dumps(_described(pieces)))
        kept.paged = (low, max(final, low))
        rest = kept.slices[max(kept.paged[1] * PAGE_SLICES - first, 0) :]
        return ("paged", first, kept.paged, _described(rest), kept.next_number)

    def load(self, key: Key, data: Any) -> OverKey:
        count, kept, waiting, closes, totals = data
        if isinstance(kept, tuple) and kept and kept[0] == "paged":
            _, first, paged, rest, next_number = kept
            store = self.owner.store
            assert store is not None, "paged slices without a store"
            described = []
            for page in range(*paged):
                found = store.get((SLICE_PAGE, self.stage.name, key_json(key), page))
                if found is None:
                    raise KeyError(f"slice page {page} of {self.stage.name} {key} missing")
                described += pickle.loads(found)
            pieces = [Slice(n, f, last, x, None, True, size)
                      for n, f, last, x, size in [*described, *rest] if n >= first]  # fmt: skip
            kept = SliceBuffer(pieces, next_number, paged=paged)
        elif isinstance(kept, tuple) and kept and kept[0] == "slices":  # before pages
            _, slices, next_number = kept
            kept = SliceBuffer(
                [Slice(n, f, last, x, None, True, size) for n, f, last, x, size in slices],
                next_number,
            )
        return OverKey(count, kept, waiting, closes, totals)

    # -- eviction (the hooks `ColumnarRunner` calls) ---------------------------------------
    def idle(self, state: OverKey, watermark: int) -> bool:
        """A frame nothing of whose can reach a later row's (RANGE: its rows have all
        left), no slot's row waiting. ROWS and UNBOUNDED frames never are: a later row's
        frame holds their rows."""
        return self.frame.empty(state.kept) and state.waiting is None

    def idle_wakeup(self, state: OverKey) -> int | None:
        """The watermark at which time alone empties the frame."""
        return self.frame.idle_wakeup(state.kept)

    def residue(self, state: OverKey) -> Any:
        """The row count (a row slide's place) and the running totals: an output's sums
        are differences of them, so a returning key goes on from the same ones."""
        return (state.count, state.totals)

    def resume(self, state: OverKey, residue: Any) -> None:
        state.count, state.totals = residue

    def forget(self, key: Key, state: OverKey) -> list[tuple[str, str, str, int]]:
        """The stored slices the frame let go of, not yet deleted."""
        kept = state.kept
        if not isinstance(kept, SliceBuffer):
            return []
        numbers = [*kept.dropped, *(p.number for p in kept.slices if p.stored)]
        text = key_json(key)
        pages = [(SLICE_PAGE, self.stage.name, text, page) for page in range(*kept.paged)]
        return [("slice", self.stage.name, text, n) for n in numbers] + pages


def _described(pieces: list[Slice]) -> list[tuple]:
    """What a page or a key's state keeps of each slice (its rows are stored apart)."""
    return [(p.number, p.first, p.last, p.extremes, p.size) for p in pieces]
