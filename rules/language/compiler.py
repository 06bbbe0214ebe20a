"""Compile checked rules into the engine plan (`engine.core.plan`).

Expressions become plain Python closures over a row mapping; nothing is ever passed
to eval/exec. Constructs the language accepts but the plan cannot express yet are
reported as located errors ("the engine cannot run ... yet"), so `rules check`
never passes a rule the engine would refuse.
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.core import pattern_plan, plan
from engine.core.aggregates import IncrementalAggregate
from rules.language import ast
from rules.language.access import Access
from rules.language.ast import Pos
from rules.language.checker import (
    Catalog,
    QueryInfo,
    Relation,
    SelectInfo,
    describe,
    expr_pos,
    plain_columns,
    window_key,
)
from rules.language.errors import RuleError, make_error
from rules.language.integers import bigint_or_null
from rules.language.recognize import match_reads, pattern_variables
from rules.language.tables import TableLoadError, load_table
from rules.language.vectors import compile_vector

Row = Mapping[str, Any]
Fn = Callable[[Row], Any]
Vector = Callable[[pa.Table], Any]

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
        return bigint_or_null(a + b)
    if op == "-":
        return bigint_or_null(a - b)
    if op == "*":
        return bigint_or_null(a * b)
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
    "abs": lambda x: bigint_or_null(abs(x)),
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


RowKeys = Mapping[tuple[str | None, str], str]
"""Where a column reference reads in the row: (qualifier, name) -> row key. A stream's
columns are under their names, a joined table's under ``"<label>.<column>"``
(:class:`engine.core.plan.LookupJoin`); references not listed read their own name."""


def _row_key(column: ast.Column, keys: RowKeys) -> str:
    """The row key a column reference reads (see :data:`RowKeys`)."""
    return keys.get((column.qualifier, column.name), column.name)


def _copies(
    exprs: Sequence[ast.Expr], aggregates: Mapping[ast.Call, str], keys: RowKeys | None
) -> tuple[str, ...] | None:
    """The row key each of `exprs` copies unchanged, if every one is a column reference
    or an aggregate's value (:attr:`engine.core.plan.Project.copies`); else None."""
    copied = []
    for expr in exprs:
        if isinstance(expr, ast.Column):
            copied.append(_row_key(expr, keys or {}))
        elif isinstance(expr, ast.Call) and expr in aggregates:
            copied.append(aggregates[expr])
        else:
            return None
    return tuple(copied)


def compile_expr(
    expr: ast.Expr, aggregates: Mapping[ast.Call, str] | None = None, keys: RowKeys | None = None
) -> Fn:
    """A closure computing `expr` on a row, SQL NULL (None) propagating.

    Aggregate calls listed in `aggregates` read the column their value travels under;
    column references read the row key `keys` gives them (default: their name).
    """
    aggs = aggregates or {}
    row_keys = keys or {}

    def build(node: ast.Expr) -> Fn:
        if isinstance(node, ast.Literal):
            value = node.value
            return lambda row: value
        if isinstance(node, ast.Column):
            # C-level `row.get(name)`: column reads run per tuple and per output.
            return operator.methodcaller("get", _row_key(node, row_keys))
        if isinstance(node, ast.Unary):
            inner = build(node.operand)
            if node.op == "NOT":
                return _strict(operator.not_, [inner])
            return _strict(lambda a: bigint_or_null(-a), [inner])
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
            return operator.methodcaller("get", aggs[node])
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
    """``agg OVER (...)``: every frame form maps onto OverWindow's fields (ROWS / RANGE
    t / UNBOUNDED [RESET EVERY p] / SINCE a / UNTIL b / BETWEEN a AND b, SLIDE, LAG,
    ACTIVE EXPIRATION)."""
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
        reset_every_ms=spec.reset_ms,
        since_ms=spec.lower_ms,
        until_ms=spec.upper_ms,
    )


def _over_windows(
    sel: SelectInfo, aggs: tuple[plan.AggCall, ...]
) -> plan.OverWindow | plan.OverWindows:
    """The SELECT's ``agg OVER (...)`` calls: one OverWindow, or one per distinct window
    spec (the aggregates of one spec share its frame, evaluated once)."""
    first = next(u.call.over for u in sel.aggregates if u.call.over is not None)
    specs: dict[tuple[object, ...], tuple[ast.WindowSpec, list[plan.AggCall]]] = {}
    for use, call in zip(sel.aggregates, aggs, strict=True):
        spec = use.call.over or first  # a non-blocking UDA without OVER shares the first
        specs.setdefault(window_key(spec), (spec, []))[1].append(call)
    windows = tuple(_over_window(spec, tuple(calls)) for spec, calls in specs.values())
    if len(windows) == 1:
        return windows[0]
    if sel.select.r2s is not None:
        raise Unsupported(sel.select.pos, f"{sel.select.r2s}(...) of several OVER windows")
    # Each window gives exactly one value per tuple only with incremental aggregates;
    # an ESL-shaped one may emit none or several.
    _require_incremental(sel, "next to other windows")
    return plan.OverWindows(windows)


def _require_incremental(sel: SelectInfo, where: str) -> None:
    """Refuse the SELECT's ESL-shaped Python aggregates (those that cannot retract)."""
    for use in sel.aggregates:
        cls = use.uda.cls if use.uda is not None else None
        if cls is not None and not issubclass(cls, IncrementalAggregate):
            raise Unsupported(use.call.pos, f"the ESL-shaped aggregate '{use.call.name}' {where}")


def _from_window(
    sel: SelectInfo,
    spec: ast.WindowSpec,
    group_by: tuple[str, ...],
    aggs: tuple[plan.AggCall, ...],
    keys: RowKeys,
) -> plan.Window | None:
    """A CQL window in FROM (``S [...]``).

    Without a relation-to-stream operator, ``[RANGE r [SLIDE s]]`` is the WID extent
    window (no SLIDE: a tumble), each extent's result emitted once. Under
    ISTREAM / DSTREAM / RSTREAM the query's result is CQL's relation at every instant
    (CQL §5-6), computed by an OVER window read as a relation (plan.R2S):
    ``[RANGE r]`` tuples in ``[t - r, t]`` (leaving by active expiration at ``t + r``),
    ``[ROWS n]`` the last n tuples, ``[PARTITION BY k ROWS n]`` the last n per k,
    ``[RANGE UNBOUNDED]`` all so far; ``[NOW]`` is the tuples of the instant. Without
    aggregates, see ``_relation_window``.
    """
    r2s = sel.select.r2s
    kind = spec.kind
    if not aggs:
        return _relation_window(sel, spec, keys)
    if r2s in ("ISTREAM", "DSTREAM") and group_by:
        where = expr_pos(sel.select.group_by[0])
        _require_selected(sel, group_by, keys, where, f"{r2s}(...) of a relation grouped by")
    if kind in ("rows", "partition_rows") and r2s is not None:
        # CQL filters (and joins) the window's last n tuples; the engine would apply the
        # WHERE and the joins to the stream before the window.
        if sel.select.where is not None:
            raise Unsupported(
                expr_pos(sel.select.where),
                f"WHERE over the CQL window [{describe(spec)}] with aggregates (CQL filters "
                "the window's last n tuples, not the last n that pass)",
            )
        if len(sel.select.sources) > 1:
            raise Unsupported(
                sel.select.sources[1].name.pos,
                f"a join over the CQL window [{describe(spec)}] with aggregates",
            )
    if kind == "now":
        return plan.ExtentWindow(aggs, range_ms=1, slide_ms=1, group_by=group_by)
    if kind == "range" and (r2s is None or spec.slide_ms is not None):
        if spec.lag_ms is not None:
            raise Unsupported(spec.pos, "a LAG on a FROM window")
        assert spec.range_ms is not None
        return plan.ExtentWindow(
            aggregates=aggs,
            range_ms=spec.range_ms,
            slide_ms=spec.slide_ms or spec.range_ms,  # no SLIDE: a tumble
            group_by=group_by,
        )
    what = f"the CQL window [{describe(spec)}]"
    if spec.lag_ms is not None or spec.slide_rows:
        raise Unsupported(spec.pos, what)
    if r2s is None:
        raise Unsupported(
            spec.pos, f"{what} without ISTREAM, DSTREAM or RSTREAM (its result is a relation)"
        )
    for col in (c for _, _, expr in sel.outputs for c in plain_columns(expr)):
        if col.name in ("window_start", "window_end"):
            raise Unsupported(col.pos, f"{col.name} over {what} (extents need a SLIDE)")
    if kind == "range":
        return plan.OverWindow(
            aggs, plan.FrameUnits.RANGE, spec.range_ms, group_by, active_expiration=True
        )
    if kind in ("unbounded", "since", "until", "band"):
        # A landmark; fixed bounds are a filter on the tuples' time (`_band_filter`), so
        # that a group without tuples in the band has no row.
        return plan.OverWindow(
            aggs, plan.FrameUnits.RANGE, None, group_by, reset_every_ms=spec.reset_ms
        )
    assert spec.rows is not None
    partition = tuple(p.name for p in spec.partition)
    if set(group_by) == set(partition):
        # One group per partition: the partition's OVER window, its last tuple's row.
        return plan.OverWindow(aggs, plan.FrameUnits.ROWS, spec.rows - 1, partition)
    # A group's tuples leave when other groups' tuples arrive: only aggregates that
    # retract can follow that.
    _require_incremental(sel, f"over {what} grouped")
    return plan.RowsGroupWindow(aggs, spec.rows, partition, group_by)


def plan_pattern(node: ast.PatternNode) -> pattern_plan.Pattern:
    """The pattern as the plan's plain data (positions dropped)."""
    if isinstance(node, ast.PatternVar):
        return pattern_plan.PatternVar(node.name)
    if isinstance(node, ast.PatternSeq):
        return pattern_plan.PatternSeq(tuple(plan_pattern(i) for i in node.items))
    if isinstance(node, ast.PatternAlt):
        return pattern_plan.PatternAlt(tuple(plan_pattern(o) for o in node.options))
    return pattern_plan.PatternRepeat(plan_pattern(node.item), node.low, node.high, node.greedy)


def _pattern_window(match: ast.MatchRecognize, timestamp: str) -> pattern_plan.PatternWindow:
    """MATCH_RECOGNIZE: DEFINE conditions and measures read the match through the
    refs :func:`rules.language.recognize.match_reads` finds in them."""
    variables = {v.name for v in pattern_variables(match.pattern)}
    refs: dict[str, pattern_plan.PatternRef] = {}

    def compiled(expr: ast.Expr, final: bool) -> Fn:
        reads = match_reads(expr, variables, final)
        refs.update(reads.refs)
        return compile_expr(expr, reads.calls, reads.columns)

    defines = tuple((var.name, compiled(cond, False)) for var, cond in match.defines)
    measures = tuple((name.name, compiled(expr, True)) for expr, name in match.measures)
    return pattern_plan.PatternWindow(
        pattern=plan_pattern(match.pattern),
        defines=defines,
        measures=measures,
        refs=tuple(refs.values()),
        timestamp=timestamp,
        partition_by=tuple(p.name for p in match.partition),
        within_ms=match.within_ms,
        after=pattern_plan.AfterMatch(match.skip),
    )


def _band_filter(spec: ast.WindowSpec, ts: str | None) -> list[plan.Filter]:
    """``[SINCE a]`` / ``[UNTIL b]`` / ``[BETWEEN a AND b]`` with aggregates: only the
    tuples with ``a <= ts <= b`` are ever in the window (membership is per tuple)."""
    if spec.kind not in ("since", "until", "band"):
        return []
    assert ts is not None  # the checker requires a timestamp for time-based windows
    lower = spec.lower_ms if spec.lower_ms is not None else -plan.END_OF_TIME
    upper = spec.upper_ms if spec.upper_ms is not None else plan.END_OF_TIME

    def inside(batch: pa.Table) -> pa.Array:
        times = batch.column(ts)
        return pc.and_kleene(pc.greater_equal(times, lower), pc.less_equal(times, upper))

    return [plan.Filter(lambda row: lower <= row[ts] <= upper, inside)]


def _relation_window(
    sel: SelectInfo, spec: ast.WindowSpec, keys: RowKeys
) -> plan.RelationWindow | None:
    """A CQL window in FROM without aggregates: a relation of the stream's tuples, turned
    into a stream by ISTREAM / DSTREAM / RSTREAM (plan.RelationWindow). None where the
    result is the stream itself: ``S [NOW]`` without an operator (as before), RSTREAM of
    ``[NOW]``, and ISTREAM of a time-based window that tuples enter at their own time
    when the rows carry that time (rows entering at τ then differ from every row leaving,
    so R(τ) - R(τ-1) is the tuples of instant τ: CQL's footnote 4, generalised) or that
    nothing leaves (``[RANGE UNBOUNDED]``)."""
    r2s = sel.select.r2s
    kind = spec.kind
    what = f"the CQL window [{describe(spec)}]"
    if r2s is None:
        if kind == "now":
            return None
        raise Unsupported(
            spec.pos,
            f"{what} without ISTREAM, DSTREAM or RSTREAM (its result is a relation of tuples)",
        )
    for col in (c for _, _, expr in sel.outputs for c in plain_columns(expr)):
        if col.name in ("window_start", "window_end") and (None, col.name) not in keys:
            raise Unsupported(col.pos, f"{col.name} over {what} of tuples (no aggregates)")
    if spec.slide_rows:
        raise Unsupported(spec.pos, f"{what} with a row SLIDE")
    if spec.lag_ms is not None and spec.slide_ms is not None:
        raise Unsupported(spec.pos, f"{what} with both SLIDE and LAG")
    units = plan.FrameUnits.RANGE
    if kind in ("rows", "partition_rows"):
        window = plan.RelationWindow(
            plan.FrameUnits.ROWS, rows=spec.rows, partition_by=tuple(p.name for p in spec.partition)
        )
    elif kind == "now":
        window = plan.RelationWindow(units, range_ms=0)
    elif kind == "range":
        window = plan.RelationWindow(
            units, range_ms=spec.range_ms, slide_ms=spec.slide_ms, lag_ms=spec.lag_ms or 0
        )
    elif kind == "unbounded":
        window = plan.RelationWindow(units, reset_every_ms=spec.reset_ms)
    else:  # since, until, band: landmarks with fixed bounds
        window = plan.RelationWindow(units, since_ms=spec.lower_ms, until_ms=spec.upper_ms)
    time_based = window.units is units
    bounded = window.since_ms is not None or window.until_ms is not None
    never_leaves = time_based and window.range_ms is None and not window.reset_every_ms
    if r2s == "DSTREAM" and never_leaves:
        raise Unsupported(sel.select.pos, f"DSTREAM(...) over {what} (no tuple ever leaves it)")
    if r2s != "RSTREAM" and window.partition_by:
        _require_selected(sel, window.partition_by, keys, spec.pos, f"{r2s}(...) of {what} per")
    if r2s == "RSTREAM" and kind == "now":
        return None
    if r2s == "ISTREAM" and time_based and not bounded:
        at_own_time = window.slide_ms is None and not window.lag_ms
        if never_leaves or (at_own_time and _carries_timestamp(sel, keys)):
            return None
    return window


def _selected(sel: SelectInfo, keys: RowKeys) -> set[str]:
    """The row keys the SELECT list carries unchanged (plain column references)."""
    return {
        keys.get((expr.qualifier, expr.name), expr.name)
        for _, _, expr in sel.outputs
        if isinstance(expr, ast.Column)
    }


def _carries_timestamp(sel: SelectInfo, keys: RowKeys) -> bool:
    assert sel.stream is not None
    return sel.stream.timestamp in _selected(sel, keys)


def _require_selected(
    sel: SelectInfo, columns: tuple[str, ...], keys: RowKeys, pos: Pos, what: str
) -> None:
    """ISTREAM / DSTREAM over a relation kept per group or partition (one evaluator per
    key) equal CQL's over the whole relation only if rows of two keys never cancel: the
    SELECT list must carry the key columns."""
    missing = [c for c in columns if c not in _selected(sel, keys)]
    if missing:
        raise Unsupported(
            pos,
            f"{what} {', '.join(columns)} without selecting {', '.join(missing)} (the "
            "relation is kept per key, so equal rows of two keys would not cancel)",
        )


def _r2s(select: ast.Select, window: plan.Window | None) -> plan.R2S | None:
    """ISTREAM / DSTREAM / RSTREAM over the query's relation (see plan.R2S)."""
    if select.r2s is None:
        return None
    if window is None and select.r2s == "DSTREAM":
        raise Unsupported(select.pos, "DSTREAM(...) without a window (nothing ever leaves)")
    return plan.R2S(select.r2s)


def _row_keys(sel: SelectInfo) -> dict[tuple[str | None, str], str]:
    """The row key of every column reference of a SELECT's scope (see `RowKeys`)."""
    assert sel.stream is not None
    stream = sel.stream
    keys: dict[tuple[str | None, str], str] = {}
    for src in sel.select.sources:
        if src.name.name == stream.name:
            keys.update({(src.label, c): c for c in stream.columns})
            keys.update({(None, c): c for c in stream.columns})
    tables = iter(sel.tables)
    for src in sel.select.sources:
        if src.name.name != stream.name:
            for c in next(tables).columns:
                keys[(src.label, c)] = f"{src.label}.{c}"
                # Unqualified: the checker reported names of several sources as
                # ambiguous, so the stream's entry is never overwritten in use.
                keys.setdefault((None, c), f"{src.label}.{c}")
    return keys


def _conjuncts(expr: ast.Expr) -> list[ast.Expr]:
    if isinstance(expr, ast.Binary) and expr.op == "AND":
        return _conjuncts(expr.left) + _conjuncts(expr.right)
    return [expr]


def _lookup_join(
    src: ast.SourceRef,
    on: ast.Expr | None,
    left: bool,
    table: Relation,
    rows: tuple[tuple[Any, ...], ...],
    keys: RowKeys,
    joined: set[str],
) -> plan.LookupJoin:
    """`JOIN table ON a = table.x AND ...` as a lookup join. `joined` holds the labels
    whose columns are in the row by now (the stream's and the earlier tables')."""
    if on is None:
        raise Unsupported(src.name.pos, "a join without ON (list the key equalities)")
    label = src.label

    def owner(col: ast.Column) -> str:
        key = keys.get((col.qualifier, col.name), col.name)
        return key.partition(".")[0] if "." in key else ""

    pairs: list[tuple[Fn, str]] = []
    vectors: list[Vector | None] = []
    for cond in _conjuncts(on):
        if not isinstance(cond, ast.Binary) or cond.op != "=":
            raise Unsupported(
                expr_pos(cond), f"this ON condition (only equalities with '{label}' columns)"
            )
        sides = (cond.left, cond.right)
        mine = [s for s in sides if isinstance(s, ast.Column) and owner(s) == label]
        if len(mine) != 1:
            raise Unsupported(
                expr_pos(cond), f"this ON condition (one side must be a column of '{label}')"
            )
        other = sides[1] if mine[0] is sides[0] else sides[0]
        for col in plain_columns(other):
            if owner(col) and owner(col) not in joined:
                raise Unsupported(
                    col.pos, f"a join key read from '{owner(col)}', joined after '{label}'"
                )
        pairs.append((compile_expr(other, keys=keys), mine[0].name))
        vectors.append(compile_vector(other, keys=keys))
    return plan.LookupJoin(
        table.name, label, tuple(table.columns), rows, tuple(pairs), left, _all(vectors)
    )


def _filter(
    condition: ast.Expr, aggregates: Mapping[ast.Call, str] | None, keys: RowKeys
) -> plan.Filter:
    """WHERE or HAVING: the row predicate and its columnar form."""
    return plan.Filter(
        compile_expr(condition, aggregates, keys), compile_vector(condition, aggregates, keys)
    )


def _all(vectors: Sequence[Vector | None]) -> tuple[Vector, ...] | None:
    """Every expression's columnar form, or None if one has none."""
    found = [v for v in vectors if v is not None]
    return tuple(found) if len(found) == len(vectors) else None


def _stream_key(col: ast.Expr, keys: RowKeys) -> str:
    """A grouping key: a stream column (the runtime partitions the input by it)."""
    assert isinstance(col, ast.Column)  # the checker reported other GROUP BY keys
    key = keys.get((col.qualifier, col.name), col.name)
    if "." in key:  # a joined table's column (stream columns are plain identifiers)
        raise Unsupported(col.pos, "grouping by a reference table's column")
    return key


def compile_query(
    info: QueryInfo, tables: Mapping[str, tuple[tuple[Any, ...], ...]]
) -> list[plan.Query]:
    """One CREATE STREAM ... AS / CREATE ALERT statement as plan Queries, one per UNION
    ALL branch (all writing the statement's sink under the first branch's column
    names); `tables` are the loaded rows of the reference tables."""
    names = [name for name, _, _ in info.selects[0].outputs]
    return [_compile_select(info, i, names, tables) for i in range(len(info.selects))]


def _compile_select(
    info: QueryInfo,
    branch: int,
    names: list[str],
    tables: Mapping[str, tuple[tuple[Any, ...], ...]],
) -> plan.Query:
    """SELECT block `branch` of a statement; its columns are called `names`."""
    stmt = info.statement
    sel = info.selects[branch]
    select = sel.select
    assert sel.stream is not None  # the checker reported a FROM without a stream
    if select.sources[0].name.name != sel.stream.name:
        raise Unsupported(
            select.sources[0].name.pos, "a table before the stream in FROM (name the stream first)"
        )
    keys = _row_keys(sel)
    alias_of = {use.call: use.alias for use in sel.aggregates}
    agg_calls = tuple(
        plan.AggCall(
            name=use.call.name,
            args=tuple(compile_expr(a, keys=keys) for a in use.call.args),
            alias=use.alias,
            factory=use.uda.cls if use.uda is not None else None,
            algebraic=use.uda is not None and use.uda.algebraic,
            vector_args=_all([compile_vector(a, keys=keys) for a in use.call.args]),
        )
        for use in sel.aggregates
    )
    group_by = tuple(_stream_key(k, keys) for k in select.group_by)
    if sel.window is not None and group_by and not agg_calls:
        # GROUP BY without aggregates over a window (SELECT DISTINCT): a group's row is in
        # the relation while the group has tuples, i.e. while a hidden count(*) runs.
        agg_calls = (plan.AggCall("count", (), "__group_rows"),)
    window: plan.Window | None = None
    over = next((u.call.over for u in sel.aggregates if u.call.over is not None), None)
    if sel.match is not None:
        window = _pattern_window(sel.match, sel.stream.timestamp or "ts")
    elif sel.window is not None:
        window = _from_window(sel, sel.window, group_by, agg_calls, keys)
    elif over is not None:
        window = _over_windows(sel, agg_calls)
    elif agg_calls:
        # A non-blocking UDA without a window (ESL §3): it sees the whole history of its
        # GROUP BY group, i.e. an unbounded window partitioned by the grouping columns.
        window = plan.OverWindow(
            aggregates=agg_calls,
            units=plan.FrameUnits.ROWS,
            preceding=None,
            partition_by=group_by,
        )
    pre: list[plan.StatelessOp] = list(_joins(sel, tables, keys))
    if isinstance(window, plan.OverWindow) and sel.window is not None:
        pre.extend(_band_filter(sel.window, sel.stream.timestamp))
    if select.where is not None:
        pre.append(_filter(select.where, None, keys))
    post: list[plan.StatelessOp] = []
    if isinstance(window, pattern_plan.PatternWindow) or (
        isinstance(window, plan.RelationWindow) and window.units is plan.FrameUnits.ROWS
    ):
        # CQL joins and filters the window's tuples: the last n of the stream, not the
        # last n that match. A WHERE over MATCH_RECOGNIZE filters its matches.
        # CQL joins and filters the window's tuples: the last n of the stream, not the
        # last n that match.
        post, pre = pre, []
    if select.having is not None:
        post.append(_filter(select.having, alias_of, keys))
    # A later UNION ALL branch's columns take the first branch's names, by position.
    exprs = [expr for _, _, expr in sel.outputs]
    post.append(
        plan.Project(
            tuple(
                (name, compile_expr(expr, alias_of, keys))
                for name, expr in zip(names, exprs, strict=True)
            ),
            _copies(exprs, alias_of, keys),
            _all([compile_vector(expr, alias_of, keys) for expr in exprs]),
        )
    )
    kind = plan.SinkKind.ALERT if isinstance(stmt, ast.CreateAlert) else plan.SinkKind.STREAM
    return plan.Query(
        sink=plan.Sink(stmt.name.name, kind),
        input=sel.stream.name,
        pre=tuple(pre),
        window=window,
        post=tuple(post),
        r2s=_r2s(select, window),
        branch=branch,
        definition=_definition(sel, names),
    )


def _joins(
    sel: SelectInfo, tables: Mapping[str, tuple[tuple[Any, ...], ...]], keys: RowKeys
) -> list[plan.LookupJoin]:
    """The SELECT block's joins with reference tables, in FROM order."""
    select = sel.select
    joins = []
    joined = {select.sources[0].label}
    tables_used = iter(sel.tables)
    for src, on, left in zip(select.sources[1:], select.joins[1:], select.left[1:], strict=True):
        table = next(tables_used)
        joins.append(_lookup_join(src, on, left, table, tables.get(table.name, ()), keys, joined))
        joined.add(src.label)
    return joins


def compile_incidents(
    info: QueryInfo, first: plan.Query, tables: Mapping[str, tuple[tuple[Any, ...], ...]]
) -> plan.Incidents:
    """How the alert of `info` (compiled: `first`, its first branch) forms incidents:
    observing its input rows (all of them by default; with RESOLVE WHEN those the joins
    and the condition keep) unless it resolves after a quiet interval."""
    stmt = info.statement
    assert isinstance(stmt, ast.CreateAlert)
    clauses = stmt.incidents
    observe: str | None = None
    clear: tuple[plan.StatelessOp, ...] = ()
    if clauses.resolve_after_ms is None:
        observe = first.input
        if clauses.resolve_when is not None:
            sel = info.selects[0]
            keys = _row_keys(sel)
            clear = (*_joins(sel, tables, keys), _filter(clauses.resolve_when, None, keys))
    digest = repr((first.definition, ast.without_positions(clauses)))
    return plan.Incidents(
        alert=stmt.name.name,
        observe=observe,
        clear=clear,
        quiet_ms=clauses.resolve_after_ms,
        pending_ms=clauses.pending_ms,
        keep_firing_ms=clauses.keep_firing_ms,
        definition=hashlib.sha256(digest.encode()).hexdigest()[:16],
    )


def _definition(sel: SelectInfo, names: list[str]) -> str:
    """A digest of what a query's saved state was built by: its SELECT block and output
    names, its input stream's columns, and the declarations of the UDAs it calls. Moving
    or re-commenting the rule keeps it; editing any of those changes it."""
    assert sel.stream is not None
    # By name: names are unique, so sorting never compares the declarations.
    udas = sorted(
        {
            use.call.name: ast.without_positions(use.uda.statement)
            for use in sel.aggregates
            if use.uda is not None
        }.items()
    )
    parts = (
        ast.without_positions(sel.select),
        names,
        sorted(sel.stream.columns.items()),
        sel.stream.timestamp,
        udas,
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def compile_catalog(
    catalog: Catalog, texts: dict[str, str], access: Access
) -> tuple[plan.Plan, list[RuleError]]:
    """The plan of a checked catalog, and located errors for what it cannot express
    (and for reference tables it cannot read, or may not: `access`)."""
    streams: dict[str, plan.StreamSchema] = {}
    for rel in catalog.relations.values():
        if rel.kind != "stream":
            continue
        columns = tuple(plan.Column(n, _column_type(t)) for n, t in rel.columns.items())
        streams[rel.name] = plan.StreamSchema(
            rel.name, columns, rel.timestamp, rel.slack_ms, rel.topic, rel.source_idle_ms
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
    tables: dict[str, tuple[tuple[Any, ...], ...]] = {}
    for rel in catalog.relations.values():
        if rel.kind == "table":
            stmt = rel.statement
            assert isinstance(stmt, ast.CreateTable)
            try:
                tables[rel.name] = load_table(stmt, rel.columns, access)
            except TableLoadError as exc:
                text, where = texts.get(stmt.file, ""), stmt.path_pos or stmt.pos
                message = f"cannot load table '{rel.name}': {exc}"
                errors.append(make_error(stmt.file, text, where, message))
    incidents: list[plan.Incidents] = []
    for info in catalog.queries:
        try:
            compiled = compile_query(info, tables)
            queries.extend(compiled)
            if isinstance(info.statement, ast.CreateAlert):
                incidents.append(compile_incidents(info, compiled[0], tables))
        except Unsupported as exc:
            file = info.statement.file
            errors.append(
                make_error(
                    file, texts.get(file, ""), exc.pos, f"the engine cannot run {exc.what} yet"
                )
            )
    compiled_plan = plan.Plan(streams, tuple(queries), tuple(incidents))
    return compiled_plan, errors
