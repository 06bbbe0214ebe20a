"""What every window operator is: the protocol the keyed evaluator drives, its defaults,
and the no-window operator.

An operator sees one partition's tuples in (ts, source, seq) order. The evaluator calls
``arrive`` with each group of tuples sharing one timestamp (SQL peers) and ``fire`` with
each timer instant; at one instant arrivals come first, then timers, so a timer at ``x``
runs "after every tuple with timestamp ``x``". Both return ``(event_ts, row)`` pairs for
the query's ``post`` ops. ``next_timer`` is the next instant at which ``fire`` may emit
(slot close, active expiration, extent end); silent work needs no timer:
``settle(watermark)``, called on arrival and at the end of each advance, runs it (passive
expiry, lagged tuples entering) in the same order relative to the arrivals, and lets
idle partitions drop state no future tuple can need.

**Eviction.** ``idle(watermark)`` says whether the operator, advanced to ``watermark``,
now gives every later tuple what a new operator would, once given back its
``residue()`` (what must survive: a row slide's count, a pattern's match number) with
``resume``; ``idle_wakeup()`` is the lowest watermark at which time alone can make it
idle (None: only its timers or nothing can). The evaluator's key is then evicted
(docs/engine.md, *Eviction*).
"""

from __future__ import annotations

import itertools
from typing import Any

from engine.core.plan import AggCall

Row = dict[str, Any]
Arrival = tuple[int, Row]
"""A tuple handed to an operator: (ts, row)."""
Result = tuple[int, Row]
"""An operator's output: (event ts, row for the post ops)."""
Emissions = list[list[Any]]
"""What one tuple made each aggregate call emit (or, read, its value), call by call."""


class Operator:
    """The protocol (module docstring), with the defaults of an operator that has no
    timers, nothing silent to do, and nothing to keep when its key is evicted."""

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Process one peer group (equal ts); return the outputs."""
        raise NotImplementedError

    def next_timer(self) -> int | None:
        """None: no timer work."""
        return None

    def fire(self, instant: int) -> list[Result]:
        """Nothing to fire."""
        return []

    def settle(self, watermark: int) -> None:
        """Nothing silent."""

    def idle(self, watermark: int) -> bool:
        """Whether the operator gives every later tuple what a new one would."""
        raise NotImplementedError

    def idle_wakeup(self) -> int | None:
        """None: only timers or arrivals change the operator."""
        return None

    def residue(self) -> Any:
        """Nothing survives eviction."""
        return None

    def resume(self, residue: Any) -> None:
        """Nothing to take back."""

    def get_state(self) -> Any:
        """The state as plain data."""
        raise NotImplementedError

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        raise NotImplementedError

    def restore_state(self, state: Any, version: int) -> None:
        """Restore a state saved in snapshot format ``version`` (the evaluator's): every
        operator but one kept its format since the oldest version still read."""
        self.set_state(state)


class StatelessOperator(Operator):
    """No window: every tuple passes through at its own event time."""

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Pass the group through."""
        return group

    def idle(self, watermark: int) -> bool:
        """Always: nothing is kept."""
        return True

    def get_state(self) -> Any:
        """No state."""
        return None

    def set_state(self, state: Any) -> None:
        """No state."""


def combine(ts: int, row: Row, calls: tuple[AggCall, ...], emitted: Emissions) -> list[Result]:
    """One output row per combination of the calls' emitted values (usually one)."""
    if len(emitted) == 1:
        return [(ts, {**row, calls[0].alias: v}) for v in emitted[0]]
    return [
        (ts, {**row, **{c.alias: v for c, v in zip(calls, values, strict=True)}})
        for values in itertools.product(*emitted)
    ]
