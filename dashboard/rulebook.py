"""The rule set as the Rules page shows it: each statement's text and explanation, read
by the same loader as `lookout rules check`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.core.plan import ColumnType, Plan
from rules.language import ast
from rules.language.access import DEFAULT_POLICY, RulePolicy
from rules.language.checker import Catalog
from rules.language.errors import RuleError, named_by_file
from rules.language.explain import explain
from rules.language.loader import analyse

KINDS: dict[type, str] = {
    ast.CreateStream: "source stream",
    ast.CreateDerived: "derived stream",
    ast.CreateAlert: "alert",
    ast.CreateAggregate: "aggregate",
    ast.CreateTable: "reference table",
}


@dataclass(frozen=True)
class Watched:
    """What an alert's condition watches, as stored: its input stream's Delta table (the
    source stream's `readings_<name>` or the derived stream's own), that stream's
    event-time column, and the numeric column its WHERE compares with a number (e.g.
    `station_speed`, `ts`, `avg_speed` for `congestion`'s `avg_speed < 15`), and the
    alert's key columns (`Rule.key`), which are columns of that stream too."""

    table: str
    timestamp: str
    column: str
    key: tuple[str, ...]
    condition: str
    """The comparison as written, e.g. `avg_speed < 15`."""


@dataclass(frozen=True)
class Rule:
    """One statement of a rule file: what it defines, where, its text and explanation."""

    name: str
    kind: str
    file: str
    line: int
    text: str
    explanation: str
    severity: str | None
    key: tuple[str, ...] = ()
    """Key columns of its outputs (alerts: what their `key` names); empty when unkeyed
    or when the folder has errors."""
    fires_below: tuple[str, float] | None = None
    """(column, bound) when the alert fires only while `column < bound` (or `<=`)."""
    watched: Watched | None = None
    """Alerts: the input column their condition compares, where the dashboard reads it."""


@dataclass(frozen=True)
class Book:
    """Every statement of the rule folder, and the problems the checker found there."""

    rules: list[Rule]
    errors: list[RuleError]

    def alerts_keyed_by(self, column: str) -> list[str]:
        """Names of the alerts whose key includes `column` (e.g. `station`)."""
        return [r.name for r in self.rules if r.kind == "alert" and column in r.key]

    def alert_problem(self, name: str, column: str) -> str | None:
        """Why `name` is not an alert keyed by `column` here (None when it is)."""
        if self.errors:
            return "the rule folder has errors (see the Rules page), so its alerts are unknown"
        rule = next((r for r in self.rules if r.name == name), None)
        if rule is None:
            return f"there is no rule `{name}` in the rule folder"
        if rule.kind != "alert":
            return f"`{name}` is a {rule.kind}, not an alert"
        if column not in rule.key:
            keyed = ", ".join(rule.key) or "nothing"
            return f"the alert `{name}` is keyed by {keyed}, not by {column}"
        return None


def statement_text(lines: list[str], start: int, end: int) -> str:
    """Lines [start, end) of a file (0-based) with the comments just above the statement,
    without the blank and comment lines that lead into the next one."""
    while start > 0 and lines[start - 1].lstrip().startswith("--"):
        start -= 1
    while end > start and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("--")):
        end -= 1
    return "\n".join(lines[start:end])


def read_book(paths: Sequence[Path], policy: RulePolicy = DEFAULT_POLICY) -> Book:
    """Parse, check and compile the rule files at `paths` (as `lookout rules check`
    does) and explain each statement."""
    paths = [path for path in paths if path.exists()]
    if not paths:
        return Book([], [])
    # Explain what can be explained even if some statements have errors (as the CLI does).
    analysis = analyse(paths, policy)
    keys = output_keys(analysis.plan) if analysis.plan is not None else {}
    rules = _rules(analysis.statements, analysis.texts, analysis.catalog, keys, analysis.plan)
    return Book(rules, named_by_file(analysis.errors))


def output_keys(plan: Plan) -> dict[str, tuple[str, ...]]:
    """For each stream or alert the plan writes, the key columns of the stage producing
    it: an alert's `key` column reads `station=3` when that is `("station",)`."""
    return {
        query.sink.name: stage.key
        for stage in plan.stages()
        for query in (stage.query, *stage.downstream)
    }


def _rules(
    statements: list[ast.Statement],
    texts: dict[str, str],
    catalog: Catalog,
    keys: dict[str, tuple[str, ...]],
    plan: Plan | None,
) -> list[Rule]:
    rules = []
    for i, stmt in enumerate(statements):
        lines = texts[stmt.file].splitlines()
        following = statements[i + 1] if i + 1 < len(statements) else None
        end = following.pos.line - 1 if following and following.file == stmt.file else len(lines)
        name = stmt.name.name
        rules.append(
            Rule(
                name=name,
                kind=KINDS.get(type(stmt), "statement"),
                file=Path(stmt.file).name,
                line=stmt.pos.line,
                text=statement_text(lines, stmt.pos.line - 1, end),
                explanation=explain(catalog, name) or "",
                severity=str(stmt.severity) if isinstance(stmt, ast.CreateAlert) else None,
                key=keys.get(name, ()),
                fires_below=upper_bound(stmt),
                watched=None if plan is None else watched(stmt, plan, keys.get(name, ())),
            )
        )
    return rules


def upper_bound(stmt: ast.Statement) -> tuple[str, float] | None:
    """(column, bound) when `stmt` is an alert whose WHERE is `column < number` (or
    `<=`), alone or ANDed with other conditions; None otherwise."""
    if not isinstance(stmt, ast.CreateAlert) or len(stmt.query.selects) != 1:
        return None
    conditions = [stmt.query.selects[0].where]
    while conditions:
        expr = conditions.pop()
        if not isinstance(expr, ast.Binary):
            continue
        if expr.op == "AND":
            conditions += [expr.left, expr.right]
        elif (
            expr.op in ("<", "<=")
            and isinstance(expr.left, ast.Column)
            and isinstance(expr.right, ast.Literal)
            and expr.right.type in ("INT", "DOUBLE")
            and isinstance(expr.right.value, int | float)
        ):
            return expr.left.name, float(expr.right.value)
    return None


NUMERIC = (ColumnType.INT, ColumnType.BIGINT, ColumnType.DOUBLE)
# Key columns whose text in an alert's key (`engine.alerts.format_key`) is SQL's
# CAST(... AS VARCHAR) of the stored value.
KEY_TYPES = (ColumnType.INT, ColumnType.BIGINT, ColumnType.STRING)
FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def watched(stmt: ast.Statement, plan: Plan, key: tuple[str, ...]) -> Watched | None:
    """What the alert `stmt` watches (see `Watched`): only for an alert that filters one
    stream row by row (one SELECT, no window: its input rows are what it compares) whose
    WHERE has a comparison of one of that stream's numeric columns with a number (the
    first such, of the conditions ANDed), keyed by columns of that stream; None
    otherwise (a windowed alert compares what its window computes, which no table
    holds)."""
    if not isinstance(stmt, ast.CreateAlert) or len(stmt.query.selects) != 1:
        return None
    queries = [q for q in plan.queries if q.sink.name == stmt.name.name]
    if len(queries) != 1 or queries[0].window is not None:
        return None
    query = queries[0]
    stream = plan.streams.get(query.input)
    if stream is None or stream.timestamp is None:
        return None
    types = {c.name: c.type for c in stream.columns}
    if any(types.get(k) not in KEY_TYPES for k in key):
        return None
    select = stmt.query.selects[0]
    names = {select.sources[0].name.name} | (
        {select.sources[0].alias.name} if select.sources[0].alias else set()
    )
    conditions = [select.where]
    while conditions:
        expr = conditions.pop(0)
        if not isinstance(expr, ast.Binary):
            continue
        if expr.op == "AND":
            conditions += [expr.left, expr.right]
            continue
        if expr.op not in FLIPPED:
            continue
        column, bound, op = expr.left, expr.right, expr.op
        if isinstance(bound, ast.Column):
            column, bound, op = bound, column, FLIPPED[op]
        if (
            isinstance(column, ast.Column)
            and (column.qualifier is None or column.qualifier in names)
            and types.get(column.name) in NUMERIC
            and isinstance(bound, ast.Literal)
            and isinstance(bound.value, int | float)
            and not isinstance(bound.value, bool)
        ):
            from engine.tables import readings_table  # 40 ms: not at every page's import

            sources = {s.name for s in plan.sources()}
            table = readings_table(stream.name) if stream.name in sources else stream.name
            condition = f"{column.name} {op} {bound.value}"
            return Watched(table, stream.timestamp, column.name, key, condition)
    return None


def annotate(text: str, errors: list[RuleError]) -> str:
    """The text with line numbers and, under each offending line, a caret at the
    column, then `line:col: message`."""
    by_line: dict[int, list[RuleError]] = {}
    for error in errors:
        by_line.setdefault(error.line, []).append(error)
    lines = text.splitlines() or [""]
    width = len(str(len(lines)))
    out = []
    for number, line in enumerate(lines, start=1):
        out.append(f"{number:>{width}} | {line}")
        for error in by_line.pop(number, []):
            pad = "".join("\t" if ch == "\t" else " " for ch in line[: error.col - 1])
            out.append(f"{'':>{width}} | {pad}^")
            out.append(f"{'':>{width}} | {error.line}:{error.col}: {error.message}")
    for rest in by_line.values():  # errors past the end of the text (end of input)
        out.extend(f"{'':>{width}} | {e.line}:{e.col}: {e.message}" for e in rest)
    return "\n".join(out)
