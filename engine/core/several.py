"""Several data-driven windows in one SELECT (:class:`OverWindows`).

Composed of the single-window operator: one :class:`OverOperator` per window and per
value of that window's partition columns beyond the evaluator's key. Each tuple goes
to its partition's operator of every window; every operator gives exactly one row per
tuple (incremental aggregates, no slide), and the output row is the input row with
every window's aliases. Peers reach each operator together, so RANGE peers read the
values after the last one and ROWS tuples their own, as with one window. No window has
timers (no time slide, no active expiration) nor anything to keep on eviction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine.core.plan import OverWindows
from engine.core.windows.base import Arrival, Operator, Result, Row
from engine.core.windows.over import OverOperator


class SeveralOverOperator(Operator):
    """The windows of one SELECT for one evaluator key; ``makers`` make each window's
    operator (one per partition value)."""

    def __init__(self, window: OverWindows, makers: Sequence[Callable[[], OverOperator]]) -> None:
        self.window = window
        self.makers = makers
        key = set(window.partition_by)
        # Per window, its partition columns the evaluator's key does not cover.
        self.own = [tuple(c for c in w.partition_by if c not in key) for w in window.windows]
        self.parts: list[dict[tuple[Any, ...], OverOperator]] = [{} for _ in window.windows]

    def _operator(self, index: int, part: tuple[Any, ...]) -> OverOperator:
        ops = self.parts[index]
        if part not in ops:
            ops[part] = self.makers[index]()
        return ops[part]

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """One peer group (equal ts): every window's values for each tuple, in order."""
        rows: list[Row] = [dict(row) for _, row in group]
        for index, (w, own) in enumerate(zip(self.window.windows, self.own, strict=True)):
            by_part: dict[tuple[Any, ...], list[int]] = {}
            for pos, (_, row) in enumerate(group):
                by_part.setdefault(tuple(row[c] for c in own), []).append(pos)
            aliases = [c.alias for c in w.aggregates]
            for part, positions in by_part.items():
                results = self._operator(index, part).arrive([group[p] for p in positions])
                for pos, (_, out) in zip(positions, results, strict=True):
                    rows[pos].update((a, out[a]) for a in aliases)
        ts = group[0][0]
        return [(ts, row) for row in rows]

    def settle(self, watermark: int) -> None:
        """Passive expiry and lagged entries of every window's operators."""
        for ops in self.parts:
            for op in ops.values():
                op.settle(watermark)

    def idle(self, watermark: int) -> bool:
        """Every window's operators are idle (none has a slide: nothing survives)."""
        return all(op.idle(watermark) for ops in self.parts for op in ops.values())

    def idle_wakeup(self) -> int | None:
        """When the last of the operators not yet idle turns idle by time alone (None
        if one never does)."""
        latest = None
        for ops in self.parts:
            for op in ops.values():
                wakeup = op.idle_wakeup()
                if wakeup is None:
                    if not op.at_rest():
                        return None
                    continue
                latest = wakeup if latest is None else max(latest, wakeup)
        return latest

    def get_state(self) -> Any:
        """Per window, (partition value, its operator's state) pairs."""
        return [[(part, op.get_state()) for part, op in ops.items()] for ops in self.parts]

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        for index, saved in enumerate(state):
            self.parts[index] = {}
            for part, op_state in saved:
                self._operator(index, part).set_state(op_state)
