"""Aggregates: the ESL window-aggregate protocol, the incremental (Flink-shaped) kind, and
the built-ins.

Two kinds, one root class :class:`WindowAggregate` (what the rule compiler checks a
``CREATE AGGREGATE ... LANGUAGE PYTHON AS 'module:Class'`` against):

* **ESL-shaped** (subclass :class:`WindowAggregate` directly): the window calls
  ``initialize`` for the first tuple and ``iterate`` for each later one, ``expire`` for
  each tuple leaving the window, each returning the values it emits (ESL's
  ``INSERT INTO RETURN``; an empty iterable emits nothing). The aggregate sees its own
  window buffer, an :class:`InWindow`: the argument tuples still in the window, oldest
  first. A new tuple is added *after* ``initialize``/``iterate`` returns; an expiring
  tuple is still ``oldest()`` while ``expire`` runs and is removed right after (ESL §4,
  example 12). Tuples removed with ``InWindow.delete`` never expire (ESL example 13).
* **Incremental** (subclass :class:`IncrementalAggregate`): ``accumulate`` /
  ``retract`` / ``get_value`` like Flink's ``AggregateFunction`` and River's
  ``update``/``revert``. The window reads ``get_value()`` once the frame is complete
  (so RANGE peers share one value), and, with active expiration, after each retract.
  Retraction is always FIFO (the oldest accumulated tuple leaves first), which lets
  min/max use a monotonic deque: O(1) amortised per tuple. An incremental aggregate with
  ``algebraic = True`` also has ``merge`` (ESL ``ALGEBRAIC``, Flink's ``merge``): the
  window may then keep one partial per pane instead of the tuples (ESL §5.1).

An aggregate's state must be plain picklable data reachable from ``vars(self)`` (or
override ``get_state``/``set_state``): snapshots store it, never the class or callables.

:data:`BUILTINS` maps the SQL names count, sum, avg, min, max, var, stddev, first, last
to their classes. SQL NULL (``None``) arguments are ignored, except by first/last which
return the first/last row's value, NULL or not (SQL ``RESPECT NULLS``). ``var`` and
``stddev`` are the sample statistics (``var_samp``/``stddev_samp``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar, Protocol


class InWindow(Protocol):
    """An aggregate's view of its window buffer (ESL ``inwindow``): argument tuples."""

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        """The argument tuples in the window, oldest first."""
        ...

    def __len__(self) -> int:
        """How many tuples the window holds."""
        ...

    def oldest(self) -> tuple[Any, ...] | None:
        """The oldest argument tuple, or None when the window is empty."""
        ...

    def delete(self, predicate: Callable[[tuple[Any, ...]], bool]) -> int:
        """Remove the tuples where ``predicate`` holds (they will not expire); return how
        many were removed."""
        ...


class WindowAggregate:
    """Root of all aggregates; subclass it directly for an ESL-shaped UDA.

    Override ``iterate`` (and ``initialize`` if the first tuple is special), ``expire``
    if the aggregate maintains state on expiry or emits under ACTIVE EXPIRATION, and
    ``terminate`` for values to emit after each tuple's ``iterate`` (ESL's fallback for a
    UDA without a window version).
    """

    newest_only: ClassVar[bool] = False
    """Declared by an aggregate whose values under ``RANGE t PRECEDING ACTIVE
    EXPIRATION`` come from the newest tuple of its key alone: ``initialize``,
    ``iterate`` and ``terminate`` emit nothing; ``expire`` emits nothing for a tuple
    that another tuple of its key follows within ``t`` (at or before its ``ts + t``),
    and for any other tuple values that depend on that tuple's arguments alone (not on
    the aggregate's state nor on the rest of ``inwindow``). ``Silence`` deletes the
    older tuples at each arrival; ``MissedDoor`` keeps repeats but never alarms while
    one follows. The engine may then run it per column
    (:mod:`engine.core.columnar.expiry`): each key keeps its newest tuple only, and
    ``expire`` is called only for a tuple no other of its key follows within ``t``,
    alone in its window."""

    def initialize(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """First tuple of the window's life; defaults to ``iterate``."""
        return self.iterate(args, inwindow)

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """A tuple arrives (``inwindow`` does not hold it yet); return values to emit."""
        raise NotImplementedError

    def expire(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """A tuple leaves (it is still ``inwindow.oldest()``); return values to emit."""
        return ()

    def terminate(self, inwindow: InWindow) -> Iterable[Any]:
        """Called after each ``initialize``/``iterate``; return values to emit."""
        return ()

    def get_state(self) -> Any:
        """Plain picklable data from which ``set_state`` rebuilds this aggregate."""
        return dict(vars(self))

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned (on a fresh instance)."""
        vars(self).update(state)

    def at_rest(self, fresh: WindowAggregate) -> bool:
        """Whether this aggregate, its window empty, now gives what ``fresh`` (a new
        instance) would for any later tuples: by default, when their states are equal.
        An idle key is evicted only when every aggregate of its window is at rest
        (docs/engine.md, *Eviction*)."""
        try:
            return bool(self.get_state() == fresh.get_state())
        except Exception:  # a state that does not compare (arrays): never at rest
            return False


class IncrementalAggregate(WindowAggregate):
    """A delta-maintained aggregate: accumulate on arrival, retract (FIFO) on expiry.

    Its ESL methods are derived, so it also works wherever an ESL aggregate does:
    ``iterate`` accumulates and emits the value, ``expire`` retracts and emits it.
    Set ``algebraic = True`` and implement ``merge`` to allow the pane optimisation.
    """

    algebraic: ClassVar[bool] = False

    def accumulate(self, *args: Any) -> None:
        """Add one tuple's arguments."""
        raise NotImplementedError

    def retract(self, *args: Any) -> None:
        """Remove the oldest accumulated tuple, whose arguments are ``args``."""
        raise NotImplementedError

    def get_value(self) -> Any:
        """The aggregate over the tuples accumulated and not retracted (None if empty)."""
        raise NotImplementedError

    def merge(self, other: IncrementalAggregate) -> None:
        """Absorb ``other``, a partial over later tuples (algebraic aggregates only). A
        merged aggregate is only read, never retracted."""
        raise NotImplementedError

    # Optional, for algebraic aggregates: ``merged_value(later)`` returns the value of
    # this partial merged with ``later`` without building the merge or changing either
    # (a sliding window reads it once per slide). Without it the window merges copies.
    merged_value: Callable[[IncrementalAggregate], Any] | None = None

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """ESL view: accumulate and emit the new value."""
        self.accumulate(*args)
        return (self.get_value(),)

    def expire(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """ESL view: retract and emit the new value."""
        self.retract(*args)
        return (self.get_value(),)


class Count(IncrementalAggregate):
    """``count(*)`` (no argument) or ``count(x)`` (non-NULL x)."""

    def __init__(self) -> None:
        self.n = 0

    def accumulate(self, *args: Any) -> None:
        if not args or args[0] is not None:
            self.n += 1

    def retract(self, *args: Any) -> None:
        if not args or args[0] is not None:
            self.n -= 1

    def get_value(self) -> int:
        return self.n

    algebraic = True

    def merge(self, other: IncrementalAggregate) -> None:
        assert isinstance(other, Count)
        self.n += other.n

    def merged_value(self, later: IncrementalAggregate) -> int:
        assert isinstance(later, Count)
        return self.n + later.n


class Sum(IncrementalAggregate):
    """``sum(x)``; NULL over no non-NULL value."""

    def __init__(self) -> None:
        self.n = 0
        self.total: Any = 0

    def accumulate(self, x: Any) -> None:
        if x is not None:
            self.n += 1
            self.total += x

    def retract(self, x: Any) -> None:
        if x is not None:
            self.n -= 1
            # Reset on empty so float round-off does not outlive the values behind it.
            self.total = self.total - x if self.n else 0

    algebraic = True

    def merge(self, other: IncrementalAggregate) -> None:
        assert isinstance(other, Sum)
        if other.n:
            self.total = self.total + other.total if self.n else other.total
            self.n += other.n

    def get_value(self) -> Any:
        return self.total if self.n else None

    def merged_value(self, later: IncrementalAggregate) -> Any:
        assert isinstance(later, Sum)
        if not (self.n and later.n):
            return (self if self.n else later).get_value()
        return self.total + later.total


class Avg(Sum):
    """``avg(x)`` as sum / count."""

    def get_value(self) -> float | None:
        return self.total / self.n if self.n else None

    def merged_value(self, later: IncrementalAggregate) -> float | None:
        assert isinstance(later, Avg)
        if not (self.n and later.n):
            return (self if self.n else later).get_value()
        return (self.total + later.total) / (self.n + later.n)


class Var(IncrementalAggregate):
    """``var(x)``: sample variance by Welford's update and its revert."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0

    def accumulate(self, x: Any) -> None:
        if x is None:
            return
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    def retract(self, x: Any) -> None:
        if x is None:
            return
        self.n -= 1
        if not self.n:
            self.mean = self.m2 = 0.0
            return
        delta = x - self.mean
        self.mean -= delta / self.n
        self.m2 -= delta * (x - self.mean)

    def get_value(self) -> float | None:
        # Round-off can push m2 a hair below zero after retractions.
        return max(self.m2, 0.0) / (self.n - 1) if self.n > 1 else None

    algebraic = True

    def merge(self, other: IncrementalAggregate) -> None:
        # Chan et al.'s pairwise combination of (n, mean, m2).
        assert isinstance(other, Var)
        n = self.n + other.n
        if not other.n:
            return
        delta = other.mean - self.mean
        self.mean += delta * other.n / n
        self.m2 += other.m2 + delta * delta * self.n * other.n / n
        self.n = n


class Stddev(Var):
    """``stddev(x)``: sample standard deviation."""

    def get_value(self) -> float | None:
        var = super().get_value()
        return None if var is None else math.sqrt(var)


class Max(IncrementalAggregate):
    """``max(x)`` over a monotonic deque of (arrival index, value) candidates."""

    def __init__(self) -> None:
        self.arrived = 0
        self.retracted = 0
        self.candidates: deque[tuple[int, Any]] = deque()

    def _dominates(self, new: Any, old: Any) -> bool:
        return new >= old

    def accumulate(self, x: Any) -> None:
        if x is None:
            return
        # An older value the new one dominates can never be the answer again.
        while self.candidates and self._dominates(x, self.candidates[-1][1]):
            self.candidates.pop()
        self.candidates.append((self.arrived, x))
        self.arrived += 1

    def retract(self, x: Any) -> None:
        if x is None:
            return
        if self.candidates and self.candidates[0][0] == self.retracted:
            self.candidates.popleft()
        self.retracted += 1

    def get_value(self) -> Any:
        return self.candidates[0][1] if self.candidates else None

    def at_rest(self, fresh: WindowAggregate) -> bool:
        # Arrival indexes only count relative to each other: nothing left, nothing owed.
        return not self.candidates and self.arrived == self.retracted

    algebraic = True

    def merge(self, other: IncrementalAggregate) -> None:
        # The other partial's extreme is all that can matter to a read-only result.
        assert isinstance(other, Max)
        value = other.get_value()
        if value is not None:
            self.accumulate(value)

    def merged_value(self, later: IncrementalAggregate) -> Any:
        mine, theirs = self.get_value(), later.get_value()
        if theirs is None or mine is None:
            return mine if theirs is None else theirs
        return theirs if self._dominates(theirs, mine) else mine


class Min(Max):
    """``min(x)``: :class:`Max` with the order reversed."""

    def _dominates(self, new: Any, old: Any) -> bool:
        return new <= old


class First(IncrementalAggregate):
    """``first(x)``: the oldest row's value in the window (NULL included)."""

    def __init__(self) -> None:
        self.values: deque[Any] = deque()

    def accumulate(self, x: Any) -> None:
        self.values.append(x)

    def retract(self, x: Any) -> None:
        self.values.popleft()

    def get_value(self) -> Any:
        return self.values[0] if self.values else None


class Last(First):
    """``last(x)``: the newest row's value in the window (NULL included)."""

    def get_value(self) -> Any:
        return self.values[-1] if self.values else None


BUILTINS: dict[str, type[IncrementalAggregate]] = {
    "count": Count,
    "sum": Sum,
    "avg": Avg,
    "min": Min,
    "max": Max,
    "var": Var,
    "stddev": Stddev,
    "first": First,
    "last": Last,
}
"""Built-in aggregates by lower-case SQL name."""


def make_aggregate(name: str, factory: Callable[[], WindowAggregate] | None) -> WindowAggregate:
    """A fresh aggregate for an ``AggCall``: the UDA factory if given, else the built-in."""
    if factory is not None:
        return factory()
    try:
        return BUILTINS[name.lower()]()
    except KeyError:
        raise ValueError(f"unknown aggregate {name!r}") from None
