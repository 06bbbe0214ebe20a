"""Active expiration per column, for aggregates that keep only the newest tuple.

``agg(...) OVER (PARTITION BY k RANGE t PRECEDING ACTIVE EXPIRATION)`` where ``agg``
declares :attr:`~engine.core.aggregates.WindowAggregate.newest_only` (a silence or
timeout detector): arrivals emit nothing, and only a tuple that no tuple of its key
follows at or before ``ts + t`` emits when it expires (at instant ``ts + t``, after the
tuples of that instant), values of its own arguments. Per key that is a comparison of
each event time with the next one; the key's newest tuple waits in its state until
the next tuple or the watermark decides. ``expire`` runs in Python for those tuples
only (a silence is rare), each alone in its window, and each of its values is an
output row: the expiring tuple's columns and the value, with event time ``ts + t``.

A key's state is its newest tuple as plain values: a Python tuple of the row's columns
in the order of the batch it came from, and the number of that batch's schema among
the runner's *layouts* (the distinct schemas its kept tuples came from: one, unless a
column's type changes between batches, as a per-row stage's all-NULL column does; saved
once per stage, with its pending rows). A one-row Arrow table would hold about 8 KB of
heap for an RFID reading's 77 bytes. A batch stays columnar: its event times compared
in numpy, its rows' arguments computed over the whole batch once one of them expires,
its keys' last rows turned into tuples with one take. A kept tuple becomes an Arrow
row again only when it expires: its arguments from the call's row expressions (the
per-row runner's), and the advance's expiring kept tuples built into one table per
layout, with their batch's column types, put in order with the batch's expiring rows.
A state saved as a one-row table is read as a tuple, its schema a layout.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pyarrow as pa

from engine.core.columnar import ops
from engine.core.columnar.stage import ColumnarRunner, Picked
from engine.core.plan import AggCall, OverWindow, Stage
from engine.core.runners import TS, HasStore, Key, SinkRows
from engine.core.windows.contents import BufferView

Kept = tuple[Any, ...]
"""A key's newest tuple: its columns' values in its layout's order, then the layout's
number."""

KEPT = -1
"""The index of a kept tuple's output row in a :class:`Picked` (not a row of the batch)."""


def newest_only_call(call: AggCall) -> bool:
    """Whether ``call``'s aggregate declares ``newest_only``, its arguments columnar."""
    factory = call.factory
    return (
        factory is not None
        and bool(getattr(factory, "newest_only", False))
        and (not call.args or call.vector_args is not None)
    )


def _values(column: pa.ChunkedArray) -> list[Any]:
    """A column's values as Python objects, a string column's repeated values one object
    each: a kept tuple per key holds them (a door, a tag type, a source), and
    a copy per key would cost more than the key's own values."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return ops.shared_pylist(column)
    return column.to_pylist()


class NewestExpiryRunner(ColumnarRunner):
    """The window of the module docstring; a key keeps its newest tuple (plain values)."""

    kind = "columnar-expiry"

    def __init__(self, index: int, stage: Stage, owner: HasStore) -> None:
        super().__init__(index, stage, owner)
        window = stage.query.window
        assert isinstance(window, OverWindow) and window.preceding is not None
        self.reach = window.preceding
        self.call = window.aggregates[0]
        assert self.call.factory is not None
        self.aggregate = self.call.factory()
        self.layouts: tuple[pa.Schema, ...] = ()
        self._layout_of: dict[pa.Schema, int] = {}
        self._ts_at: list[int] = []  # each layout's timestamp column
        # The advance's batch (begin): its event times, its keys' last rows as kept
        # tuples (by position) and, once a row of it expires, every row's arguments.
        self._final: pa.Table | None = None
        self._ts = np.zeros(0, dtype=np.int64)
        self._last: dict[int, Kept] = {}
        self._batch_args: list[tuple[Any, ...]] | None = None

    def new_state(self, key: Key) -> Kept | None:
        return None

    def wakeup(self, state: Kept | None) -> int | None:
        return None if state is None else self._end(state) + 1

    def _end(self, kept: Kept) -> int:
        """The instant a kept tuple expires at unless its key's next tuple comes first."""
        return int(kept[self._ts_at[kept[-1]]]) + self.reach

    def idle(self, state: Kept | None, watermark: int) -> bool:
        """The key's newest tuple has expired (or none came): nothing is kept."""
        return state is None

    def advance(self, watermark: int) -> list[SinkRows]:
        try:
            return super().advance(watermark)
        finally:  # the batch is not kept past its advance
            self._final, self._last, self._batch_args = None, {}, None
            self._ts = np.zeros(0, dtype=np.int64)

    def begin(self, final: pa.Table) -> None:
        self._final = final
        ts = final.column(self.stage.timestamp).to_numpy(zero_copy_only=False)
        self._ts = np.asarray(ts, dtype=np.int64)
        lasts = [end - 1 for _, end in ops.segments(final, self.stage.key)]
        layout = self._layout(final.schema)
        columns = final.take(pa.array(lasts, pa.int64())).columns
        kept = zip(*(_values(c) for c in columns), [layout] * len(lasts), strict=True)
        self._last = dict(zip(lasts, kept, strict=True))

    def window(
        self, key: Key, state: Kept | None, watermark: int, span: tuple[int, int]
    ) -> Picked | None:
        start, end = span
        kept_end = None if state is None else self._end(state)
        # The kept tuple expires when the key's next tuple comes after its end, or, with
        # none in the batch, once the watermark passes its end.
        next_ts = self._ts[start] if end > start else watermark
        expired = kept_end is not None and kept_end < next_ts
        at = np.zeros(0, dtype=np.int64)
        ends = at
        if end > start:
            ts = self._ts[start:end]
            ends = ts + self.reach
            # A tuple expires when the next one comes after its end; the newest, once the
            # watermark passes its end.
            expires = np.concatenate([ts[1:] > ends[:-1], [ends[-1] < watermark]])
            self.states[key] = None if expires[-1] else self._last[end - 1]
            at = np.flatnonzero(expires)
        elif expired:
            self.states[key] = None
        if not expired and not len(at):
            return None
        index: list[int] = []
        values: list[Any] = []
        times: list[int] = []
        gone: list[Kept] = []
        if expired:
            assert state is not None and kept_end is not None
            for value in self._expire(self._kept_args(state)):
                index.append(KEPT)
                values.append(value)
                times.append(kept_end)
                gone.append(state)
        if len(at):
            batch_args = self._args()
            for i, end_ts in zip(at.tolist(), ends[at].tolist(), strict=True):
                for value in self._expire(batch_args[start + i]):
                    index.append(start + i)
                    values.append(value)
                    times.append(end_ts)
        if not index:
            return None
        return Picked(np.array(index, dtype=np.int64), (values, times, gone))

    def assemble(self, final: pa.Table, picked: list[Picked]) -> pa.Table:
        """The expiring rows of every key: the batch's taken at once, the kept tuples
        built into one table per layout, in the order the keys gave them."""
        index = np.concatenate([p.index for p in picked])
        values = [v for p in picked for v in p.values[0]]
        times = [t for p in picked for t in p.values[1]]
        gone: list[Kept] = [k for p in picked for k in p.values[2]]
        from_batch = np.flatnonzero(index != KEPT)
        if not gone:
            rows = final.take(pa.array(index, pa.int64()))
        else:
            layouts = np.array([k[-1] for k in gone], dtype=np.int64)
            grouped = np.argsort(layouts, kind="stable")
            parts = [
                self._table(int(n), [gone[i] for i in grouped[layouts[grouped] == n]])
                for n in np.unique(layouts)
            ]
            if len(from_batch):
                parts.append(final.take(pa.array(index[from_batch], pa.int64())))
            # Each output row's position in the parts: the kept ones by layout, then the
            # batch's.
            position = np.empty(len(index), dtype=np.int64)
            position[np.flatnonzero(index == KEPT)[grouped]] = np.arange(len(gone))
            position[from_batch] = len(gone) + np.arange(len(from_batch))
            rows = pa.concat_tables(parts, promote_options="permissive")
            rows = rows.take(pa.array(position, pa.int64()))
        rows = rows.append_column(self.call.alias, pa.array(values))
        return rows.append_column(TS, pa.array(times, pa.int64()))

    def _expire(self, given: tuple[Any, ...]) -> list[Any]:
        """The aggregate's values for a tuple expiring alone in its window."""
        return list(self.aggregate.expire(given, BufferView(deque([(0, given)]))))

    def _args(self) -> list[tuple[Any, ...]]:
        """The aggregate's arguments for every row of the advance's batch (computed once
        a row of it expires)."""
        if self._batch_args is None:
            assert self._final is not None
            n = self._final.num_rows
            if not self.call.args:
                self._batch_args = [()] * n
            else:
                assert self.call.vector_args is not None
                columns = [v(self._final).to_pylist() for v in self.call.vector_args]
                self._batch_args = list(zip(*columns, strict=True))
        return self._batch_args

    def _kept_args(self, kept: Kept) -> tuple[Any, ...]:
        """The aggregate's arguments for a kept tuple: the call's row expressions over it
        (the per-row runner's)."""
        row = dict(zip(self.layouts[kept[-1]].names, kept[:-1], strict=True))
        return tuple(arg(row) for arg in self.call.args)

    # -- layouts --------------------------------------------------------------------------
    def _layout(self, schema: pa.Schema) -> int:
        """The number of ``schema`` among the layouts (added if new)."""
        number = self._layout_of.get(schema)
        if number is None:
            number = self._layout_of[schema] = len(self.layouts)
            self.layouts = (*self.layouts, schema)  # a new object: saved at the next save
            self._ts_at.append(schema.get_field_index(self.stage.timestamp))
        return number

    def _table(self, layout: int, kept: list[Kept]) -> pa.Table:
        """Kept tuples of ``layout`` as rows of its schema."""
        schema = self.layouts[layout]
        columns = [pa.array([k[i] for k in kept], type=f.type) for i, f in enumerate(schema)]
        return pa.Table.from_arrays(columns, schema=schema)

    def shared(self) -> tuple[pa.Schema, ...] | None:
        return self.layouts or None

    def load_shared(self, data: Any) -> None:
        for schema in data:
            self._layout(schema)

    def load(self, key: Key, data: Any) -> Kept | None:
        if isinstance(data, pa.Table):  # saved as a one-row table
            values = [c[0].as_py() for c in data.columns]
            return (*values, self._layout(data.schema))
        return data
