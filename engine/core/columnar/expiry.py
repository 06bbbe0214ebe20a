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
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pyarrow as pa

from engine.core.columnar.stage import ColumnarRunner
from engine.core.plan import AggCall, OverWindow, Stage
from engine.core.runners import TS, HasStore, Key
from engine.core.windows.contents import BufferView


def newest_only_call(call: AggCall) -> bool:
    """Whether ``call``'s aggregate declares ``newest_only``, its arguments columnar."""
    factory = call.factory
    return (
        factory is not None
        and bool(getattr(factory, "newest_only", False))
        and (not call.args or call.vector_args is not None)
    )


class NewestExpiryRunner(ColumnarRunner):
    """The window of the module docstring; a key keeps its newest tuple (one row)."""

    kind = "columnar-expiry"

    def __init__(self, index: int, stage: Stage, owner: HasStore) -> None:
        super().__init__(index, stage, owner)
        window = stage.query.window
        assert isinstance(window, OverWindow) and window.preceding is not None
        self.reach = window.preceding
        self.call = window.aggregates[0]
        assert self.call.factory is not None
        self.aggregate = self.call.factory()

    def new_state(self, key: Key) -> pa.Table | None:
        return None

    def wakeup(self, state: pa.Table | None) -> int | None:
        if state is None:
            return None
        return int(state.column(self.stage.timestamp)[0].as_py()) + self.reach + 1

    def idle(self, state: pa.Table | None, watermark: int) -> bool:
        """The key's newest tuple has expired (or none came): nothing is kept."""
        return state is None

    def window(
        self, key: Key, state: Any, rows: pa.Table, watermark: int, span: tuple[int, int]
    ) -> pa.Table | None:
        ts_name = self.stage.timestamp
        whole = (
            rows if state is None else pa.concat_tables([state, rows], promote_options="permissive")
        )
        if not whole.num_rows:
            return None
        ts = np.asarray(whole.column(ts_name).to_numpy(zero_copy_only=False), dtype=np.int64)
        ends = ts + self.reach
        # A tuple expires when the next one comes after its end; the newest, once the
        # watermark passes its end.
        expires = np.concatenate([ts[1:] > ends[:-1], [ends[-1] < watermark]])
        last = whole.num_rows - 1
        # A copy, not a slice: a pickled slice carries the whole batch's buffers.
        self.states[key] = None if expires[-1] else whole.take(pa.array([last], pa.int64()))
        at = np.flatnonzero(expires)
        if not len(at):
            return None
        gone = whole.take(pa.array(at, pa.int64()))
        args = self._args(gone)
        taken: list[int] = []
        values: list[Any] = []
        for i, given in enumerate(args):
            for value in self.aggregate.expire(given, BufferView(deque([(0, given)]))):
                taken.append(i)
                values.append(value)
        if not taken:
            return None
        out = gone.take(pa.array(taken, pa.int64()))
        out = out.append_column(self.call.alias, pa.array(values))
        return out.append_column(TS, pa.array(ends[at][taken], pa.int64()))

    def _args(self, rows: pa.Table) -> list[tuple[Any, ...]]:
        if not self.call.args:
            return [()] * rows.num_rows
        assert self.call.vector_args is not None
        columns = [v(rows).to_pylist() for v in self.call.vector_args]
        return list(zip(*columns, strict=True))
