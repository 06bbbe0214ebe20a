"""Python aggregates for the tests: some deliberately incomplete (the checker's), one
the library's kept on the per-row runner."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.core.aggregates import IncrementalAggregate, InWindow, WindowAggregate
from rules.udas import MissedDoor


class NoIterate(WindowAggregate):
    """Lacks the iterate state."""

    def expire(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """Never reached: the checker rejects the class."""
        return ()


class NoExpire(WindowAggregate):
    """Has iterate but no expire: unusable with ACTIVE EXPIRATION."""

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """Emit nothing."""
        return ()


class NotAnAggregate:
    """Does not subclass WindowAggregate."""


class NoMerge(IncrementalAggregate):
    """Incremental, but without merge: cannot be ALGEBRAIC."""

    def __init__(self) -> None:
        self.total = 0.0

    def accumulate(self, x: Any) -> None:
        """Add a value."""
        self.total += x

    def retract(self, x: Any) -> None:
        """Take a value out."""
        self.total -= x

    def get_value(self) -> Any:
        """The sum."""
        return self.total


class MergingSum(NoMerge):
    """A sum whose partials merge: may be declared ALGEBRAIC."""

    def merge(self, other: IncrementalAggregate) -> None:
        """Absorb a partial over later tuples."""
        assert isinstance(other, MergingSum)
        self.total += other.total


class PerRowMissedDoor(MissedDoor):
    """``missed_door`` not declared ``newest_only``: the per-row runner's window of an
    aggregate that deletes tuples and keeps repeats (the library's runs per column)."""

    newest_only = False
