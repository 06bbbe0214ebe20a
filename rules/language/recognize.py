"""What MATCH_RECOGNIZE's DEFINE and MEASURES expressions read from a match.

A pattern variable qualifies a column (``A.speed``: the last row mapped to A),
``FIRST(A.speed)`` / ``LAST(A.speed)`` navigate, ``count(A.*)``, ``sum``, ``avg``,
``min``, ``max`` aggregate over A's rows (no variable: every row of the match), and
``MATCH_NUMBER()`` numbers the matches of a partition. :func:`match_reads` finds those
reads in an expression: as :class:`engine.core.pattern_plan.PatternRef` s under the row keys
the compiled expression reads them by, and, for the checker, the expression with each
read replaced by something of its type.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.pattern_plan import PatternRef
from rules.language import ast
from rules.language.errors import RuleFileError

NAVIGATION = ("first", "last")
AGGREGATES = ("count", "sum", "avg", "min", "max")


@dataclass
class MatchReads:
    """An expression's reads of a match: ``typed`` (for the checker), ``columns`` (the
    row key of each column reference that reads the match, by (qualifier, name)),
    ``calls`` (the row key of each navigation or aggregate call), ``refs`` (each key's
    read) and ``errors``."""

    typed: ast.Expr
    columns: dict[tuple[str | None, str], str] = field(default_factory=dict)
    calls: dict[ast.Call, str] = field(default_factory=dict)
    refs: dict[str, PatternRef] = field(default_factory=dict)
    errors: list[RuleFileError] = field(default_factory=list)


def match_reads(expr: ast.Expr, variables: set[str], final: bool) -> MatchReads:
    """The reads of ``expr`` (a DEFINE condition, or with ``final`` a measure, where an
    unqualified column is the match's last row's) over the pattern's ``variables``."""
    found = MatchReads(expr)

    def ref(kind: str, var: str | None, column: str | None) -> str:
        key = f"{kind}({var or '*'}.{column or '*'})"
        found.refs[key] = PatternRef(key, kind, var, column)
        return key

    def variable(col: ast.Column) -> str | None:
        if col.qualifier is not None and col.qualifier not in variables:
            found.errors.append(
                RuleFileError(
                    col.pos,
                    f"unknown pattern variable '{col.qualifier}'; the pattern has "
                    f"{', '.join(sorted(variables))}",
                )
            )
        return col.qualifier

    def column(col: ast.Column) -> ast.Expr:
        var = variable(col)
        if var is not None or final:
            found.columns[(col.qualifier, col.name)] = ref("last", var, col.name)
        return ast.Column(col.name, None, col.pos)

    def call(node: ast.Call) -> ast.Expr:
        name = node.name
        if name == "match_number" and not node.args and not node.star:
            found.calls[node] = ref("match_number", None, None)
            return ast.Literal(0, "BIGINT", node.pos)
        if name not in NAVIGATION + AGGREGATES or node.over is not None:
            return ast.Call(
                name, tuple(build(a) for a in node.args), node.star, node.over, node.pos
            )
        if node.star and not node.args:  # count(*): the match's rows
            found.calls[node] = ref("count", None, None)
            return ast.Literal(0, "BIGINT", node.pos)
        arg = node.args[0] if len(node.args) == 1 else None
        if not isinstance(arg, ast.Column):
            found.errors.append(
                RuleFileError(
                    node.pos,
                    f"{name.upper()} here takes one column, qualified by a pattern variable "
                    f"or not: e.g. {name.upper()}(A.speed)",
                )
            )
            return ast.Literal(None, "NULL", node.pos)
        var = variable(arg)
        if node.star:  # count(A.*)
            found.calls[node] = ref("count", var, None)
            return ast.Literal(0, "BIGINT", node.pos)
        found.calls[node] = ref(name, var, arg.name)
        if name == "count":
            return ast.Literal(0, "BIGINT", node.pos)
        if name == "avg":
            return ast.Literal(0.0, "DOUBLE", node.pos)
        return ast.Column(arg.name, None, arg.pos)

    def build(node: ast.Expr) -> ast.Expr:
        if isinstance(node, ast.Column):
            return column(node)
        if isinstance(node, ast.Call):
            return call(node)
        if isinstance(node, ast.Unary):
            return ast.Unary(node.op, build(node.operand), node.pos)
        if isinstance(node, ast.Binary):
            return ast.Binary(node.op, build(node.left), build(node.right), node.pos)
        if isinstance(node, ast.IsNull):
            return ast.IsNull(build(node.operand), node.negated, node.pos)
        if isinstance(node, ast.InList):
            items = tuple(build(i) for i in node.items)
            return ast.InList(build(node.operand), items, node.negated, node.pos)
        if isinstance(node, ast.Case):
            whens = tuple((build(c), build(v)) for c, v in node.whens)
            other = build(node.otherwise) if node.otherwise is not None else None
            return ast.Case(whens, other, node.pos)
        return node

    found.typed = build(expr)
    return found


def pattern_variables(node: ast.PatternNode) -> list[ast.PatternVar]:
    """Every variable occurrence of a pattern, left to right."""
    if isinstance(node, ast.PatternVar):
        return [node]
    if isinstance(node, ast.PatternRepeat):
        return pattern_variables(node.item)
    parts = node.items if isinstance(node, ast.PatternSeq) else node.options
    return [v for part in parts for v in pattern_variables(part)]


def matches_empty(node: ast.PatternNode) -> bool:
    """Whether the pattern can match no rows at all."""
    if isinstance(node, ast.PatternVar):
        return False
    if isinstance(node, ast.PatternRepeat):
        return node.low == 0 or matches_empty(node.item)
    if isinstance(node, ast.PatternSeq):
        return all(matches_empty(i) for i in node.items)
    return any(matches_empty(o) for o in node.options)


def pattern_size(node: ast.PatternNode) -> float:
    """The automaton's states the pattern needs (bounded quantifiers are unrolled);
    infinity for an unbounded pattern's length is not counted here."""
    if isinstance(node, ast.PatternVar):
        return 1
    if isinstance(node, ast.PatternRepeat):
        copies = node.high if node.high is not None else node.low + 1
        return copies * (pattern_size(node.item) + 1)
    parts = node.items if isinstance(node, ast.PatternSeq) else node.options
    return sum(pattern_size(p) for p in parts) + 1


def unbounded(node: ast.PatternNode) -> bool:
    """Whether a match of the pattern may have any number of rows."""
    if isinstance(node, ast.PatternVar):
        return False
    if isinstance(node, ast.PatternRepeat):
        return node.high is None or unbounded(node.item)
    parts = node.items if isinstance(node, ast.PatternSeq) else node.options
    return any(unbounded(p) for p in parts)
