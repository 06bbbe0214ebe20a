"""Replay's output rows in output order, handed on as soon as they are final.

Output order is event time, then the emitting stage's plan index, the key (in
:func:`~engine.core.sequencer.sort_key`'s order) and the evaluator's own order. A stage
advanced to watermark w emits nothing below w from then on, so a sink's rows below the
lowest watermark its producing stages have advanced to
(:func:`~engine.core.pipeline.stream_watermarks`) are final: no later batch adds a row
before them. :class:`OutputOrder` holds each sink's rows until they are final and then
hands them on in order, so a replay holds about its streams' slack of outputs instead of
every output until the input ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.core.columnar.ops import sort_order
from engine.core.runners import KEY, SEQ, SOURCE, TS, SinkRows, key_of
from engine.core.sequencer import sort_key

STAGE = "_stage"
"""The column :class:`OutputOrder` adds: the plan index of the stage that emitted the row."""

ENGINE_COLUMNS = (TS, SOURCE, SEQ, KEY, STAGE)
"""The columns emitted rows carry besides the sink's own."""

Runs = dict[str, list[pa.Table]]
"""Each sink's rows in output order (without ``_source``), as consecutive runs of tables
of one layout (column names, order and types; a column of NULLs fits any type)."""


class OutputOrder:
    """Emitted rows held per sink until they are final, then handed on in output order;
    ``rows_only``: as the sink's own columns (what an output file keeps), without the
    engine's that order them, which are then not taken into order at all."""

    def __init__(self, rows_only: bool = False) -> None:
        self._held: dict[str, list[pa.Table]] = {}
        self._rows_only = rows_only

    def add(self, emitted: Iterable[SinkRows]) -> None:
        """Hold emitted rows (any order, any batch) without their ``_source``: a derived
        row's source is its stage and key, and a string column per row is most of what
        ordering the rows costs."""
        for item in emitted:
            n = item.table.num_rows
            if n:
                stage = pa.array(np.full(n, item.stage, np.int64))
                table = unsourced(item).table.append_column(STAGE, stage)
                self._held.setdefault(item.sink, []).append(table)

    def finished(self, bounds: Mapping[str, int] | None = None) -> Runs:
        """Each sink's held rows with ts below its bound in ``bounds`` (a sink without
        one keeps its rows; None: every row, at the end), in output order; they are no
        longer held. Sinks in order of their first rows."""
        runs: Runs = {}
        for sink, parts in self._held.items():
            bound = None if bounds is None else bounds.get(sink)
            if bounds is not None and bound is None:
                continue
            done, kept = _below(parts, bound)
            self._held[sink] = kept
            if done:
                runs[sink] = _ordered_runs(done, self._rows_only)
        self._held = {sink: parts for sink, parts in self._held.items() if parts}
        return runs

    @property
    def held_rows(self) -> int:
        """Rows held, not yet final."""
        return sum(p.num_rows for parts in self._held.values() for p in parts)


def row_columns(table: pa.Table) -> pa.Table:
    """An emitted table without the engine's own columns."""
    return table.select([n for n in table.column_names if n not in ENGINE_COLUMNS])


def unsourced(item: SinkRows) -> SinkRows:
    """``item`` without its ``_source`` column, as :class:`OutputOrder` holds it."""
    if SOURCE not in item.table.column_names:
        return item
    return SinkRows(item.stage, item.sink, item.table.drop_columns([SOURCE]))


def _below(parts: list[pa.Table], bound: int | None) -> tuple[list[pa.Table], list[pa.Table]]:
    """``parts`` split into the rows with ts below ``bound`` (None: every row) and the
    rest, a part wholly on one side kept whole."""
    if bound is None:
        return parts, []
    done, kept = [], []
    for part in parts:
        ts = np.asarray(part.column(TS).to_numpy(), np.int64)
        if ts.max() < bound:
            done.append(part)
        elif ts.min() >= bound:
            kept.append(part)
        else:
            below = pa.array(ts < bound)
            done.append(part.filter(below))
            kept.append(part.filter(pc.invert(below)))
    return done, kept


def _ordered_runs(parts: list[pa.Table], rows_only: bool) -> list[pa.Table]:
    """The rows of ``parts`` in output order, as runs of one layout each (``rows_only``:
    of the sink's own columns)."""
    engine = pa.concat_tables(
        [p.select([TS, STAGE, KEY, SEQ]) for p in parts], promote_options="permissive"
    )
    if rows_only:
        parts = [row_columns(p) for p in parts]
    layouts: list[_Layout] = []
    of_part: list[int] = []
    for part in parts:
        number = next((n for n, lay in enumerate(layouts) if lay.fits(part)), len(layouts))
        if number == len(layouts):
            layouts.append(_Layout(part.column_names, list(part.schema.types)))
        layouts[number].add(part)
        of_part.append(number)
    # The key's order is sort_key's: the repr of its values, ranked once per key.
    keys = pc.unique(engine.column(KEY)).to_pylist()
    ranked = sorted(keys, key=lambda k: sort_key(key_of(k)))
    rank = pc.index_in(engine.column(KEY), value_set=pa.array(ranked, pa.string()))
    # Four integer columns: sorted as one integer where their spans fit (sort_order).
    sortable = pa.table(
        [engine.column(TS), engine.column(STAGE), rank, engine.column(SEQ)],
        names=["ts", "stage", "key", "seq"],
    )
    order = np.asarray(sort_order(sortable, sortable.column_names), np.int64)
    wholes = [pa.concat_tables(lay.parts, promote_options="permissive") for lay in layouts]
    if len(wholes) == 1:
        return [wholes[0].take(order)]
    # Each row's layout and its index among that layout's rows, in output order.
    layout = np.concatenate([np.full(p.num_rows, n) for p, n in zip(parts, of_part, strict=True)])
    within = np.empty(len(layout), np.int64)
    for number in range(len(layouts)):
        mine = layout == number
        within[mine] = np.arange(int(mine.sum()))
    layout, within = layout[order], within[order]
    cuts = np.flatnonzero(np.diff(layout)) + 1
    starts, ends = np.r_[0, cuts], np.r_[cuts, len(layout)]
    return [
        wholes[layout[a]].take(pa.array(within[a:b]))
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    ]


class _Layout:
    """Parts with the same column names in the same order and, column by column, one
    type besides NULL."""

    def __init__(self, names: list[str], types: list[pa.DataType]) -> None:
        self.names, self.types = names, types
        self.parts: list[pa.Table] = []

    def fits(self, part: pa.Table) -> bool:
        """Whether ``part`` has this layout."""
        return part.column_names == self.names and all(
            x == y or pa.types.is_null(x) or pa.types.is_null(y)
            for x, y in zip(self.types, part.schema.types, strict=True)
        )

    def add(self, part: pa.Table) -> None:
        """Take ``part`` (which fits); its types name the columns still NULL here."""
        self.parts.append(part)
        self.types = [y if pa.types.is_null(x) else x
                      for x, y in zip(self.types, part.schema.types, strict=True)]  # fmt: skip
