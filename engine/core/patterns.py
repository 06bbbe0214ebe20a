"""Row pattern recognition (:class:`PatternWindow`, SQL:2016 ``MATCH_RECOGNIZE``).

Two pieces: :class:`Nfa`, the pattern compiled to a Thompson automaton whose splits
list their targets in preferment order (alternation: left first; greedy quantifier:
one more iteration first; reluctant: stopping first), and :class:`PatternOperator`, one
partition's matcher. The matcher keeps the rows from the current start row on; after
each row (and at the WITHIN deadline) it searches the automaton depth first in
preferment order, the way a backtracking regular-expression matcher does: the first
accepting path is the match, unless a more preferred path first needs a row that has
not arrived, in which case the start row waits. So a match is final exactly when no
more preferred way of matching can use a later row, whatever rows come next.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from engine.core.pattern_plan import (
    AfterMatch,
    Pattern,
    PatternAlt,
    PatternRef,
    PatternRepeat,
    PatternSeq,
    PatternVar,
    PatternWindow,
)
from engine.core.windows.base import Arrival, Operator, Result, Row


class Consume(NamedTuple):
    """Map the next row to ``var`` (if its condition holds), then go to ``next``."""

    var: str
    next: int


class Split(NamedTuple):
    """Go on to each target, most preferred first."""

    targets: tuple[int, ...]


class Accept(NamedTuple):
    """The pattern has matched."""


Step = Consume | Split | Accept


@dataclass(frozen=True)
class Nfa:
    """The automaton of a pattern: ``steps`` by state number, entered at ``start``."""

    steps: tuple[Step, ...]
    start: int

    def describe(self) -> list[str]:
        """One line per state, e.g. ``2: A -> 3`` or ``4: try 1, then 5``."""
        lines = []
        for i, step in enumerate(self.steps):
            if isinstance(step, Consume):
                lines.append(f"{i}: a row of {step.var} -> {step.next}")
            elif isinstance(step, Split):
                lines.append(f"{i}: try " + ", then ".join(str(t) for t in step.targets))
            else:
                lines.append(f"{i}: match")
        return lines


def compile_pattern(pattern: Pattern) -> Nfa:
    """The automaton of ``pattern``, built backwards from the accepting state."""
    steps: list[Step] = [Accept()]

    def add(step: Step) -> int:
        steps.append(step)
        return len(steps) - 1

    def build(node: Pattern, after: int) -> int:
        if isinstance(node, PatternVar):
            return add(Consume(node.name, after))
        if isinstance(node, PatternSeq):
            for item in reversed(node.items):
                after = build(item, after)
            return after
        if isinstance(node, PatternAlt):
            return add(Split(tuple(build(o, after) for o in node.options)))
        return repeat(node, after)

    def choice(more: int, stop: int, greedy: bool) -> Split:
        return Split((more, stop) if greedy else (stop, more))

    def repeat(node: PatternRepeat, after: int) -> int:
        entry = after
        if node.high is None:
            loop = add(Split(()))  # its targets need the body, which leads back to it
            steps[loop] = choice(build(node.item, loop), after, node.greedy)
            entry = loop
        else:
            for _ in range(node.high - node.low):  # (X (X ...)?)?, nested
                entry = add(choice(build(node.item, entry), after, node.greedy))
        for _ in range(node.low):
            entry = build(node.item, entry)
        return entry

    start = build(pattern, 0)
    return Nfa(tuple(steps), start)


Mapped = list[tuple[str, Row]]
"""The rows of a (partial) match, oldest first, each with its variable."""


def read_ref(ref: PatternRef, mapped: Mapped, number: int) -> Any:
    """The value of ``ref`` over the rows ``mapped`` (``number``: the match's number)."""
    if ref.kind == "match_number":
        return number
    rows = [row for var, row in mapped if ref.var is None or var == ref.var]
    column = ref.column
    if ref.kind == "count":
        return len(rows) if column is None else sum(r.get(column) is not None for r in rows)
    if column is None or not rows:
        return None
    if ref.kind == "first":
        return rows[0].get(column)
    if ref.kind == "last":
        return rows[-1].get(column)
    values = [r[column] for r in rows if r.get(column) is not None]
    if not values:
        return None
    if ref.kind == "sum":
        return sum(values)
    if ref.kind == "avg":
        return sum(values) / len(values)
    return min(values) if ref.kind == "min" else max(values)


class MatchView(Mapping[str, Any]):
    """What a DEFINE or MEASURES expression reads: a ref's value under its key, and
    otherwise the current row's column (DEFINE: the row being mapped). Values are
    computed when read: a condition reads only a few."""

    def __init__(
        self, refs: Mapping[str, PatternRef], mapped: Mapped, current: Row, number: int
    ) -> None:
        self.refs, self.mapped, self.current, self.number = refs, mapped, current, number

    def get(self, key: str, default: Any = None) -> Any:
        """The value under ``key`` (the compiled expressions' row read)."""
        ref = self.refs.get(key)
        if ref is None:
            return self.current.get(key, default)
        return read_ref(ref, self.mapped, self.number)

    def __getitem__(self, key: str) -> Any:
        return self.get(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.refs)

    def __len__(self) -> int:
        return len(self.refs)


class Found(NamedTuple):
    """The preferred match from the start row: its rows with their variables."""

    mapped: Mapped


WAIT = "wait"
"""A more preferred way of matching needs a row that has not arrived."""
NONE = "none"
"""No match starts at the start row."""


class PatternOperator(Operator):
    """One partition's matcher (see the module docstring): ``arrive`` / ``fire`` return
    the final matches as (event time, row) pairs. Rows leave on decisions only, at
    arrivals and WITHIN deadlines (timers)."""

    def __init__(self, window: PatternWindow) -> None:
        self.window = window
        self.nfa = compile_pattern(window.pattern)
        self.refs = {ref.key: ref for ref in window.refs}
        self.defines = dict(window.defines)
        self.rows: list[Arrival] = []  # from the current start row on, in order
        self.matches = 0  # matches emitted: MATCH_NUMBER

    def arrive(self, group: list[Arrival]) -> list[Result]:
        """Add peers (equal ts) one by one; every row before their instant is in."""
        out: list[Result] = []
        for arrival in group:
            self.rows.append(arrival)
            self._resolve(arrival[0] - 1, arrival[0], out)
        return out

    def next_timer(self) -> int | None:
        """The waiting start row's WITHIN deadline (after it no row can join it)."""
        if self.window.within_ms is None or not self.rows:
            return None
        return self.rows[0][0] + self.window.within_ms

    def fire(self, instant: int) -> list[Result]:
        """At the deadline every row that may join the waiting match is in."""
        out: list[Result] = []
        self._resolve(instant, instant, out)
        return out

    def idle(self, watermark: int) -> bool:
        """No row waits for a decision (the match number survives: ``residue``)."""
        return not self.rows

    def residue(self) -> Any:
        """MATCH_NUMBER goes on counting."""
        return self.matches or None

    def resume(self, residue: Any) -> None:
        """Take back the match count."""
        if residue:
            self.matches = residue

    def _resolve(self, complete_upto: int, instant: int, out: list[Result]) -> None:
        """Decide start rows while possible (every row with ts <= ``complete_upto`` is
        in); a match decided now gets event time ``instant``."""
        within = self.window.within_ms
        rows = self.rows
        while rows:
            deadline = None if within is None else rows[0][0] + within
            usable = rows if deadline is None else [a for a in rows if a[0] <= deadline]
            closed = deadline is not None and deadline <= complete_upto
            verdict = self._search([row for _, row in usable], closed)
            if verdict == WAIT:
                return
            if verdict == NONE:
                del rows[0]
                continue
            assert isinstance(verdict, Found)
            self.matches += 1
            out.append((instant, self._output(verdict.mapped, instant)))
            past = self.window.after is AfterMatch.PAST_LAST_ROW
            del rows[: len(verdict.mapped) if past else 1]

    def _search(self, rows: list[Row], closed: bool) -> Found | str:
        """Depth first over the automaton in preferment order from the start row;
        ``closed``: no further row may join."""
        steps, defines, refs = self.nfa.steps, self.defines, self.refs
        # (state, rows consumed, the mapping as a linked list (var, row, rest)).
        stack: list[tuple[int, int, Any]] = [(self.nfa.start, 0, None)]
        while stack:
            state, pos, path = stack.pop()
            step = steps[state]
            if isinstance(step, Accept):
                return Found(_unlink(path))
            if isinstance(step, Split):
                stack.extend((t, pos, path) for t in reversed(step.targets))
                continue
            if pos == len(rows):
                if closed:
                    continue
                return WAIT
            row = rows[pos]
            condition = defines.get(step.var)
            if condition is not None:
                mapped = [*_unlink(path), (step.var, row)]
                if condition(MatchView(refs, mapped, row, self.matches + 1)) is not True:
                    continue
            stack.append((step.next, pos + 1, (step.var, row, path)))
        return NONE

    def _output(self, mapped: Mapped, instant: int) -> Row:
        """The match's row: partition columns, measures, the event time."""
        first = mapped[0][1]
        row: Row = {c: first.get(c) for c in self.window.partition_by}
        view = MatchView(self.refs, mapped, {}, self.matches)
        row.update((name, measure(view)) for name, measure in self.window.measures)
        row[self.window.timestamp] = instant
        return row

    def get_state(self) -> Any:
        """Plain data: the rows from the start row on and the match counter."""
        return (list(self.rows), self.matches)

    def set_state(self, state: Any) -> None:
        """Restore what ``get_state`` returned."""
        rows, self.matches = state
        self.rows = list(rows)


def _unlink(path: Any) -> Mapped:
    """The linked mapping ``(var, row, rest)`` as a list, oldest first."""
    mapped: Mapped = []
    while path is not None:
        var, row, path = path
        mapped.append((var, row))
    mapped.reverse()
    return mapped
