"""Relation-to-stream (CQL's ISTREAM / DSTREAM / RSTREAM): the pieces that turn the
changes of a relation R into a stream.

:func:`istream`, :func:`dstream` and :func:`rstream` give the rows an instant streams,
from the rows entering R then and those leaving it (bag differences); the planner picks
one for a query. :class:`RelationChanges` and its variants are the evaluator's step for
a windowed query whose window emits R's rows, each time at its own instants.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from engine.core.plan import RowOps
from engine.core.windows.base import Result, Row

StreamRows = Callable[[list[list[Row]], list[list[Row]], Callable[[], list[Row]]], list[Row]]
"""``(entered, left, whole) -> rows``: what an instant streams, from the rows of what
entered R and of what left it (one list each), and ``whole()``, R after the instant."""


def bag_minus(rows: list[Row], other: list[Row]) -> list[Row]:
    """``rows`` minus ``other`` as bags (one copy of ``other`` cancels one of ``rows``),
    the survivors in their order. Linear when the values hash (a relation of many
    groups is diffed at every change), else by comparison."""
    if not other or not rows:
        return rows
    try:
        counts = Counter(tuple(row.items()) for row in other)
        kept = []
        for row in rows:
            key = tuple(row.items())
            if counts[key]:
                counts[key] -= 1
            else:
                kept.append(row)
        return kept
    except TypeError:  # an unhashable value (a Python aggregate's list, say)
        remaining = list(other)
        kept = []
        for row in rows:
            if row in remaining:
                remaining.remove(row)
            else:
                kept.append(row)
        return kept


def _flat(parts: list[list[Row]]) -> list[Row]:
    return [row for rows in parts for row in rows]


def istream(
    entered: list[list[Row]], left: list[list[Row]], whole: Callable[[], list[Row]]
) -> list[Row]:
    """ISTREAM: R(τ) - R(τ-1), the rows entering and not leaving."""
    return bag_minus(_flat(entered), _flat(left))


def dstream(
    entered: list[list[Row]], left: list[list[Row]], whole: Callable[[], list[Row]]
) -> list[Row]:
    """DSTREAM: R(τ-1) - R(τ), the rows leaving and not entering."""
    return bag_minus(_flat(left), _flat(entered))


def rstream(
    entered: list[list[Row]], left: list[list[Row]], whole: Callable[[], list[Row]]
) -> list[Row]:
    """RSTREAM: all of R(τ)."""
    return whole()


class RelationChanges:
    """The relation-to-stream step of a query whose window emits R's rows (an extent
    window's per extent end, an OVER window's where it emits): R changes at the instant
    of the window's results, to the rows ``post`` makes of them. A change is held until
    its instant is final (several changes can hit one instant) and counts once."""

    def __init__(self, stream: StreamRows, post: RowOps) -> None:
        self.stream, self.post = stream, post
        self.relation: list[Row] = []  # R as last committed
        self.change: tuple[int, list[Row]] | None = None  # R from an instant on, held

    def arrived(self, results: list[Result]) -> list[Result]:
        """The window's results on arrivals; the rows streamed by changes now final."""
        return self._note(results[0][0], results) if results else []

    def fired(self, instant: int, results: list[Result]) -> list[Result]:
        """The window's results at a timer (by default like arrivals')."""
        return self.arrived(results)

    def below(self, watermark: int) -> list[Result]:
        """The rows streamed by a held change whose instant lies below ``watermark``."""
        if self.change is not None and self.change[0] < watermark:
            return self.commit()
        return []

    def _note(self, ts: int, results: list[Result]) -> list[Result]:
        """R's rows from instant ``ts`` on; an earlier held change is final now."""
        done = self.commit() if self.change is not None and self.change[0] < ts else []
        self.change = (ts, [r for _, row in results for r in self.post(row)])
        return done

    def commit(self) -> list[Result]:
        """Stream the held change at its instant (against the committed R)."""
        assert self.change is not None
        ts, rows = self.change
        old, self.relation, self.change = self.relation, rows, None
        return [(ts, row) for row in self.stream([rows], [old], lambda: rows)]


class ChangesAfterTimers(RelationChanges):
    """A timer's results (an expiry's) hold R from the instant after it, possibly
    empty: ``[RANGE r]`` as an OVER window with ACTIVE EXPIRATION."""

    def fired(self, instant: int, results: list[Result]) -> list[Result]:
        return self._note(instant + 1, results)


class ChangesAtExtentEnds(ChangesAfterTimers):
    """Each extent end changes R once, final at once."""

    def fired(self, instant: int, results: list[Result]) -> list[Result]:
        return super().fired(instant, results) + self.commit()
