"""The plan of row pattern recognition (SQL:2016 ``MATCH_RECOGNIZE``): the row pattern,
the values read from a match, and the pattern window a query of
:mod:`engine.core.plan` may have (run by :mod:`engine.core.patterns`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core.plan import Expr


@dataclass(frozen=True)
class PatternVar:
    """A row pattern variable: one row for which its DEFINE condition holds."""

    name: str


@dataclass(frozen=True)
class PatternSeq:
    """Concatenation: the items one after the other."""

    items: tuple[Pattern, ...]


@dataclass(frozen=True)
class PatternAlt:
    """Alternation: the first option that leads to a match is preferred (SQL:2016)."""

    options: tuple[Pattern, ...]


@dataclass(frozen=True)
class PatternRepeat:
    """A quantifier: ``item`` between ``low`` and ``high`` times (None: unbounded);
    greedy prefers more iterations, reluctant fewer."""

    item: Pattern
    low: int
    high: int | None
    greedy: bool = True


Pattern = PatternVar | PatternSeq | PatternAlt | PatternRepeat
"""A row pattern (the regular expression of ``PATTERN (...)``)."""


@dataclass(frozen=True)
class PatternRef:
    """A value read from a (partial) match, under ``key`` in the row the compiled
    DEFINE and MEASURES expressions read. ``kind`` is ``first`` / ``last`` (the first /
    last row mapped to ``var``), ``count`` / ``sum`` / ``avg`` / ``min`` / ``max`` over
    those rows, or ``match_number``; ``var`` None means every row of the match;
    ``column`` is None for ``count(X.*)`` and ``match_number``."""

    key: str
    kind: str
    var: str | None
    column: str | None = None


class AfterMatch(StrEnum):
    """Where the search resumes after a match (``AFTER MATCH SKIP ...``)."""

    PAST_LAST_ROW = "PAST LAST ROW"
    TO_NEXT_ROW = "TO NEXT ROW"


@dataclass(frozen=True)
class PatternWindow:
    """``FROM s MATCH_RECOGNIZE (PARTITION BY p ORDER BY ts MEASURES ... ONE ROW PER
    MATCH AFTER MATCH SKIP ... PATTERN (...) [WITHIN d] DEFINE ...)`` (SQL:2016 row
    pattern recognition). Per ``partition_by`` value, over its rows in (ts, source, seq)
    order: the match starting at a row is the first in the pattern's preferment order
    whose rows satisfy their variables' ``defines`` (a condition over a row that reads
    the current row's columns and the ``refs`` of the partial match; a variable without
    one is TRUE), with its last row at most ``within_ms`` after its first. A match is
    final once no more preferred way of matching can use a later row; its row (the
    partition columns, the ``measures`` evaluated over the ``refs`` of the whole match,
    and ``timestamp`` = its event time) goes to ``post``. The event time is the instant
    the match became final: the row that decided it (usually its own last row) or its
    WITHIN deadline. Matches that could match no rows are refused by the compiler."""

    pattern: Pattern
    defines: tuple[tuple[str, Expr], ...]
    measures: tuple[tuple[str, Expr], ...]
    refs: tuple[PatternRef, ...]
    timestamp: str
    partition_by: tuple[str, ...] = ()
    within_ms: int | None = None
    after: AfterMatch = AfterMatch.PAST_LAST_ROW
