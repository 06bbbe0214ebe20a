"""Compile checked rules into the engine plan (`engine.core.plan`).

Expressions become plain Python closures over a row mapping; nothing is ever passed
to eval/exec. Constructs the language accepts but the plan cannot express yet are
reported as located errors ("the engine cannot run ... yet"), so `rules check`
never passes a rule the engine would refuse.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from engine.core import plan
from rules.language import ast
from rules.language.ast import Pos
from rules.language.checker import Catalog, QueryInfo, SelectInfo
from rules.language.errors import RuleError, make_error

Row = Mapping[str, Any]
Fn = Callable[[Row], Any]

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_COLUMN_TYPES = {t.value: t for t in plan.ColumnType}


class Unsupported(Exception):
    """A construct the engine plan cannot express (yet)."""

    def __init__(self, pos: Pos, what: str) -> None:
        super().__init__(what)
        self.pos = pos
        self.what = what


# ---- expressions ---------------------------------------------------------------------


def _arith(op: str, a: Any, b: Any) -> Any:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return None  # division by zero is NULL rather than a crash of the job
    if op == "/":
        return a / b
    rem = math.fmod(a, b)  # SQL's %: the sign follows the dividend
    return int(rem) if isinstance(a, int) and isinstance(b, int) else rem


def _strict(fn: Callable[..., Any], args: list[Fn]) -> Fn:
    """A function that is NULL when any argument is NULL."""

    def run(row: Row) -> Any:
        values = [arg(row) for arg in args]
        return None if any(v is None for v in values) else fn(*values)

    return run


def _coalesce(args: list[Fn]) -> Fn:
    def run(row: Row) -> Any:
        for arg in args:
            value = arg(row)
            if value is not None:
                return value
        return None

    return run


_SCALARS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": lambda x, n=0: round(x, int(n)),
    "floor": lambda x: math.floor(x),
    "ceil": lambda x: math.ceil(x),
    "lower": lambda s: str(s).lower(),
    "upper": lambda s: str(s).upper(),
    "concat": lambda *xs: "".join(str(x) for x in xs),
    "greatest": lambda *xs: max(xs),
    "least": lambda *xs: min(xs),
    # The start of the period of length `width` holding `ts`, periods aligned to the
    # epoch (Python's % floors, so instants before 1970 land right too).
    "time_bucket": lambda width, ts: ts - ts % width,
}


def compile_expr(expr: ast.Expr, aggregates: Mapping[ast.Call, str] | None = None) -> Fn:
    """A closure computing `expr` on a row, SQL NULL (None) propagating.

    Aggregate calls listed in `aggregates` read the column their value travels under.
    """
    aggs = aggregates or {}

    def build(node: ast.Expr) -> Fn:
        if isinstance(node, ast.Literal):
            value = node.value
            return lambda row: value
        if isinstance(node, ast.Column):
            name = node.name
            return lambda row: row.get(name)
        if isinstance(node, ast.Unary):
            inner = build(node.operand)
            if node.op == "NOT":
                return _strict(operator.not_, [inner])
            return _strict(operator.neg, [inner])
        if isinstance(node, ast.Binary):
            return binary(node)
        if isinstance(node, ast.IsNull):
            inner, negated = build(node.operand), node.negated
            return lambda row: (inner(row) is None) != negated
        if isinstance(node, ast.InList):
            return in_list(node)
        if isinstance(node, ast.Case):
            return case(node)
        if node in aggs:
            alias = aggs[node]
            return lambda row: row.get(alias)
        if node.over is not None or (node.name not in _SCALARS and node.name != "coalesce"):
            raise Unsupported(node.pos, f"the aggregate '{node.name}' here")
        args = [build(a) for a in node.args]
        if node.name == "coalesce":
            return _coalesce(args)
        return _strict(_SCALARS[node.name], args)

    def binary(node: ast.Binary) -> Fn:
        left, right, op = build(node.left), build(node.right), node.op
        if op == "AND":

            def and_(row: Row) -> bool | None:
                a = left(row)
                if a is False:
                    return False
                b = right(row)
                if b is False:
                    return False
                return None if a is None or b is None else True

            return and_
        if op == "OR":

            def or_(row: Row) -> bool | None:
                a = left(row)
                if a is True:
                    return True
                b = right(row)
                if b is True:
                    return True
                return None if a is None or b is None else False

            return or_
        if op in _COMPARE:
            return _strict(_COMPARE[op], [left, right])
        return _strict(lambda a, b: _arith(op, a, b), [left, right])

    def in_list(node: ast.InList) -> Fn:
        inner, items, negated = build(node.operand), [build(i) for i in node.items], node.negated

        def run(row: Row) -> bool | None:
            value = inner(row)
            if value is None:
                return None
            values = [item(row) for item in items]
            if value in values:
                return not negated
            return None if None in values else negated

        return run

    def case(node: ast.Case) -> Fn:
        whens = [(build(c), build(v)) for c, v in node.whens]
        otherwise = build(node.otherwise) if node.otherwise is not None else None

        def run(row: Row) -> Any:
            for cond, value in whens:
                if cond(row) is True:
                    return value(row)
            return otherwise(row) if otherwise is not None else None

        return run

    return build(expr)


# ---- statements ----------------------------------------------------------------------


def _column_type(typ: str) -> plan.ColumnType:
    # INTERVAL values are int ms; a bare NULL column has no better type than STRING.
    return _COLUMN_TYPES.get(
        typ, plan.ColumnType.BIGINT if typ == "INTERVAL" else plan.ColumnType.STRING
    )


def _over_window(spec: ast.WindowSpec, aggs: tuple[plan.AggCall, ...]) -> plan.OverWindow:
    if spec.kind in ("since", "until", "band"):
        raise Unsupported(spec.pos, f"a fixed-bound {spec.kind.upper()} window")
    if spec.reset_ms is not None:
        raise Unsupported(spec.pos, "a landmark window with RESET EVERY")
    units = plan.FrameUnits.ROWS if spec.kind == "rows" else plan.FrameUnits.RANGE
    return plan.OverWindow(
        aggregates=aggs,
        units=units,
        preceding=spec.rows if spec.kind == "rows" else spec.range_ms,
        partition_by=tuple(p.name for p in spec.partition),
        slide_rows=spec.slide_rows,
        slide_ms=spec.slide_ms,
        active_expiration=spec.active_expiration,
        lag=spec.lag_ms or 0,
    )


def _extent_window(
    sel: SelectInfo, spec: ast.WindowSpec, aggs: tuple[plan.AggCall, ...]
) -> plan.ExtentWindow:
    if spec.kind != "range" or spec.lag_ms is not None:
        what = (
            "a LAG on a FROM window"
            if spec.lag_ms is not None
            else f"the CQL window [{spec.kind.upper().replace('_', ' ')}]"
        )
        raise Unsupported(spec.pos, what)
    if not aggs:
        raise Unsupported(spec.pos, "a FROM window without aggregates (a CQL relation)")
    assert spec.range_ms is not None
    return plan.ExtentWindow(
        aggregates=aggs,
        range_ms=spec.range_ms,
        slide_ms=spec.slide_ms or spec.range_ms,  # no SLIDE: a tumble
        group_by=tuple(k.name for k in sel.select.group_by if isinstance(k, ast.Column)),
    )


def compile_query(info: QueryInfo) -> plan.Query:
    """One CREATE STREAM ... AS / CREATE ALERT statement as a plan Query."""
    stmt = info.statement
    if len(info.selects) > 1:
        raise Unsupported(info.selects[1].select.pos, "UNION ALL")
    sel = info.selects[0]
    select = sel.select
    if select.r2s is not None:
        raise Unsupported(select.pos, f"{select.r2s}(...)")
    if sel.tables:
        raise Unsupported(select.sources[1].name.pos, "a join with a reference table")
    assert sel.stream is not None  # the checker reported a FROM without a stream
    alias_of = {use.call: use.alias for use in sel.aggregates}
    agg_calls = tuple(
        plan.AggCall(
            name=use.call.name,
            args=tuple(compile_expr(a) for a in use.call.args),
            alias=use.alias,
            factory=use.uda.cls if use.uda is not None else None,
        )
        for use in sel.aggregates
    )
    window: plan.OverWindow | plan.ExtentWindow | None = None
    over = next((u.call.over for u in sel.aggregates if u.call.over is not None), None)
    if sel.window is not None:
        window = _extent_window(sel, sel.window, agg_calls)
    elif over is not None:
        window = _over_window(over, agg_calls)
    elif agg_calls:
        # A non-blocking UDA without a window (ESL §3): it sees the whole history of its
        # GROUP BY group, i.e. an unbounded window partitioned by the grouping columns.
        window = plan.OverWindow(
            aggregates=agg_calls,
            units=plan.FrameUnits.ROWS,
            preceding=None,
            partition_by=tuple(k.name for k in select.group_by if isinstance(k, ast.Column)),
        )
    pre: tuple[plan.StatelessOp, ...] = ()
    if select.where is not None:
        pre = (plan.Filter(compile_expr(select.where)),)
    post: list[plan.StatelessOp] = []
    if select.having is not None:
        post.append(plan.Filter(compile_expr(select.having, alias_of)))
    post.append(
        plan.Project(tuple((name, compile_expr(expr, alias_of)) for name, _, expr in sel.outputs))
    )
    kind = plan.SinkKind.ALERT if isinstance(stmt, ast.CreateAlert) else plan.SinkKind.STREAM
    return plan.Query(
        sink=plan.Sink(stmt.name.name, kind),
        input=sel.stream.name,
        pre=pre,
        window=window,
        post=tuple(post),
    )


def compile_catalog(catalog: Catalog, texts: dict[str, str]) -> tuple[plan.Plan, list[RuleError]]:
    """The plan of a checked catalog, and located errors for what it cannot express."""
    streams: dict[str, plan.StreamSchema] = {}
    for rel in catalog.relations.values():
        if rel.kind != "stream":
            continue
        columns = tuple(plan.Column(n, _column_type(t)) for n, t in rel.columns.items())
        streams[rel.name] = plan.StreamSchema(
            rel.name, columns, rel.timestamp, rel.slack_ms, rel.topic
        )
    for info in catalog.queries:
        # Alerts get a schema too (never a source: a query writes them), so that
        # consumers know their column types, e.g. which values are timestamps.
        if isinstance(info.statement, ast.CreateAlert):
            first = info.selects[0]
            columns = tuple(plan.Column(n, _column_type(t)) for n, t, _ in first.outputs)
            name = info.statement.name.name
            streams[name] = plan.StreamSchema(name, columns, first.timestamp)
    queries: list[plan.Query] = []
    errors: list[RuleError] = []
    for info in catalog.queries:
        try:
            queries.append(compile_query(info))
        except Unsupported as exc:
            file = info.statement.file
            errors.append(
                make_error(
                    file, texts.get(file, ""), exc.pos, f"the engine cannot run {exc.what} yet"
                )
            )
    return plan.Plan(streams=streams, queries=tuple(queries)), errors
