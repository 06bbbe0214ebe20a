"""A query without a window, computed per column: its rows, once final."""

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
