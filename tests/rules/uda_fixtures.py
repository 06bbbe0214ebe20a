"""Python aggregates for the checker's tests: some deliberately incomplete."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.core.aggregates import InWindow, WindowAggregate


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
