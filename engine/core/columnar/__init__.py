"""The columnar runners: stages computed per column of a batch (Arrow, numpy) instead
of per row, for the window forms whose meaning allows it, with the same results as the
per-row runner (:mod:`engine.core.runners`).

* :mod:`.stage` — what they share: input, keys, the steps after the window, numbering;
* :mod:`.ops` — filters, lookup joins and projections over a batch;
* :mod:`.aggregates` — count, sum, avg, min and max over ranges of rows (parts);
* :mod:`.over` — OVER windows: a frame (ROWS n, RANGE t, UNBOUNDED) and an emit policy
  (every row, a row slide, a time slide), composed;
* :mod:`.extents` — extent windows on panes;
* :class:`StatelessRunner` — a query without a window.

:func:`engine.core.planner.runners.runner_for` chooses between them when a pipeline is built.
"""

from __future__ import annotations

import pyarrow as pa

from engine.core.columnar.stage import ColumnarRunner
from engine.core.runners import TS, Key


class StatelessRunner(ColumnarRunner):
    """A query without a window: its rows, in (ts, source, seq) order, once final."""

    kind = "columnar-stateless"

    def new_state(self, key: Key) -> None:
        return None

    def window(
        self, key: Key, state: None, watermark: int, span: tuple[int, int]
    ) -> pa.Table | None:
        rows = self.rows_in(span)
        if not rows.num_rows:
            return None
        return rows.append_column(TS, rows.column(self.stage.timestamp))
