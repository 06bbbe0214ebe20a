"""Rule expressions over whole columns: the columnar twin of `compiler.compile_expr`.

`compile_vector` turns an expression into a function from a batch of rows (an Arrow
table, timestamps as epoch ms) to one Arrow array of its values, computed with Arrow's
kernels instead of once per row. It must give exactly what the row closure gives, NULLs
included (SQL's three-valued logic is Arrow's Kleene logic); where a construct's row
semantics have no exact Arrow counterpart (Python's rounding and string functions, `%`
on floats, branches of different types), it returns None and the engine keeps that
query on the per-row path. The equivalence is property-tested against the row closures
(`tests/rules/test_vectors.py`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rules.language import ast
from rules.language.integers import bigint_or_null

Datum: TypeAlias = pa.Array | pa.ChunkedArray | pa.Scalar
Vector = Callable[[pa.Table], Datum]
"""A compiled expression over a batch; the result may be a scalar (a constant)."""

_COMPARE = {
    "=": pc.equal,
    "<>": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}
_ARITHMETIC = {
    "+": (pc.add_checked, operator.add),
    "-": (pc.subtract_checked, operator.sub),
    "*": (pc.multiply_checked, operator.mul),
}


class _RowOnly(Exception):
    """The expression keeps the per-row path (module docstring)."""


def as_array(value: Datum, length: int) -> pa.Array | pa.ChunkedArray:
    """A compiled expression's result as an array of `length` values."""
    if isinstance(value, pa.Scalar):
        if not value.is_valid and value.type == pa.null():
            return pa.nulls(length)
        return pa.repeat(value, length)
    return value


def compile_vector(
    expr: ast.Expr,
    aggregates: Mapping[ast.Call, str] | None = None,
    keys: Mapping[tuple[str | None, str], str] | None = None,
) -> Callable[[pa.Table], pa.Array | pa.ChunkedArray] | None:
    """The columnar form of `expr` (as `compile_expr` reads columns: `aggregates`'
    values under their aliases, references under the row key `keys` gives), or None
    when it has none."""
    aggs = aggregates or {}
    row_keys = keys or {}
    try:
        build = _builder(aggs, row_keys)(expr)
    except _RowOnly:
        return None

    def run(batch: pa.Table) -> pa.Array | pa.ChunkedArray:
        return as_array(build(batch), batch.num_rows)

    return run


def _builder(  # one case per node kind
    aggs: Mapping[ast.Call, str], keys: Mapping[tuple[str | None, str], str]
) -> Callable[[ast.Expr], Vector]:
    def column(name: str) -> Vector:
        def read(batch: pa.Table) -> Datum:
            if name in batch.column_names:
                return batch.column(name)
            return pa.scalar(None)  # row.get(name): None

        return read

    def build(node: ast.Expr) -> Vector:
        if isinstance(node, ast.Literal):
            if not (node.value is None or isinstance(node.value, int | float | str | bool)):
                raise _RowOnly
            try:
                value = pa.scalar(node.value)
            except (OverflowError, pa.ArrowInvalid):
                raise _RowOnly from None  # an integer beyond 64 bits: Python's own
            return lambda batch: value
        if isinstance(node, ast.Column):
            return column(keys.get((node.qualifier, node.name), node.name))
        if isinstance(node, ast.Unary):
            inner = build(node.operand)
            fn = pc.invert if node.op == "NOT" else _exact(pc.negate_checked, operator.neg)
            return lambda batch: _strict(fn, inner(batch))
        if isinstance(node, ast.Binary):
            return binary(node)
        if isinstance(node, ast.IsNull):
            inner = build(node.operand)
            fn = pc.is_valid if node.negated else pc.is_null
            return lambda batch: _is(fn, inner(batch), batch.num_rows)
        if isinstance(node, ast.InList):
            return in_list(node)
        if isinstance(node, ast.Case):
            return case(node)
        if node in aggs:
            return column(aggs[node])
        if node.over is not None:
            raise _RowOnly
        return call(node)

    def binary(node: ast.Binary) -> Vector:
        left, right, op = build(node.left), build(node.right), node.op
        if op == "AND":
            return lambda batch: pc.and_kleene(*_typed(left(batch), right(batch), pa.bool_()))
        if op == "OR":
            return lambda batch: pc.or_kleene(*_typed(left(batch), right(batch), pa.bool_()))
        if op in _COMPARE:
            compare = _COMPARE[op]
            return lambda batch: _strict(compare, left(batch), right(batch))
        if op in _ARITHMETIC:
            arithmetic = _exact(*_ARITHMETIC[op])
            return lambda batch: _strict(arithmetic, left(batch), right(batch))
        if op == "/":

            def divide(batch: pa.Table) -> Datum:
                a, b = left(batch), right(batch)
                a, b = pc.cast(a, pa.float64()), pc.cast(b, pa.float64())
                # Division by zero is NULL, as per row.
                zero = pc.fill_null(pc.equal(b, 0.0), False)
                return pc.if_else(zero, pa.scalar(None, pa.float64()), pc.divide(a, b))

            return divide
        raise _RowOnly  # % : Python's fmod on floats has no exact Arrow twin

    def in_list(node: ast.InList) -> Vector:
        inner = build(node.operand)
        items = [build(i) for i in node.items]
        negated = node.negated

        def run(batch: pa.Table) -> Datum:
            n = batch.num_rows
            value = as_array(inner(batch), n)
            hit = np.zeros(n, dtype=bool)
            item_null = np.zeros(n, dtype=bool)
            for item in items:
                candidate = as_array(item(batch), n)
                if value.type != pa.null() and candidate.type != pa.null():
                    hit |= _mask(pc.equal(value, candidate))
                item_null |= _mask(pc.is_null(candidate))
            result = np.where(hit, not negated, negated)
            null = _mask(pc.is_null(value)) | (~hit & item_null)
            return pa.array(result, pa.bool_(), mask=null)

        return run

    def case(node: ast.Case) -> Vector:
        kinds = {
            type(v.value)
            for _, v in node.whens
            if isinstance(v, ast.Literal) and v.value is not None
        }
        if isinstance(node.otherwise, ast.Literal) and node.otherwise.value is not None:
            kinds.add(type(node.otherwise.value))
        if len(kinds) > 1:
            raise _RowOnly  # per row, each branch keeps its own Python type
        conditions = [build(c) for c, _ in node.whens]
        values = [build(v) for _, v in node.whens]
        otherwise = build(node.otherwise) if node.otherwise is not None else None

        def run(batch: pa.Table) -> Datum:
            n = batch.num_rows
            conds = [_true(c(batch), n) for c in conditions]
            outs = [as_array(v(batch), n) for v in values]
            if otherwise is not None:
                outs.append(as_array(otherwise(batch), n))
            if all(o.type == pa.null() for o in outs):
                return pa.scalar(None)
            outs = _unified(outs)
            struct = pa.StructArray.from_arrays(conds, [f"c{i}" for i in range(len(conds))])
            return pc.case_when(struct, *outs)

        return run

    def call(node: ast.Call) -> Vector:
        args = [build(a) for a in node.args]
        name = node.name
        if name == "coalesce":

            def first_valid(batch: pa.Table) -> Datum:
                n = batch.num_rows
                given = [as_array(a(batch), n) for a in args]
                typed = [v for v in given if v.type != pa.null()]
                return pc.coalesce(*_unified(typed)) if typed else pa.scalar(None)

            return first_valid
        if name == "abs":
            absolute = _exact(pc.abs_checked, abs)
            return lambda batch: absolute(args[0](batch))
        if name in ("greatest", "least"):
            fn = pc.max_element_wise if name == "greatest" else pc.min_element_wise

            def extreme(batch: pa.Table) -> Datum:
                n = batch.num_rows
                given = [as_array(a(batch), n) for a in args]
                if any(v.type == pa.null() for v in given):
                    return pa.scalar(None)  # strict: a NULL argument makes it NULL
                return fn(*_unified(given), skip_nulls=False)

            return extreme
        if name in ("floor", "ceil"):
            fn = pc.floor if name == "floor" else pc.ceil

            def rounded(batch: pa.Table) -> Datum:
                value = args[0](batch)
                if value.type == pa.null() or pa.types.is_integer(value.type):
                    return value  # math.floor(int) is the int
                return pc.cast(fn(value), pa.int64())  # math.floor gives an int

            return rounded
        if name == "time_bucket":

            def bucket(batch: pa.Table) -> Datum:
                width, ts = args[0](batch), args[1](batch)
                return _floor_bucket(as_array(ts, batch.num_rows), width)

            return bucket
        raise _RowOnly

    return build


def _true(value: Datum, length: int) -> pa.Array:
    """Where a condition is true (NULL, and a NULL constant, are not)."""
    array = _combined(as_array(value, length))
    if array.type == pa.null():
        return pa.array(np.zeros(length, dtype=bool))
    return pc.fill_null(array, False)


def _mask(value: Datum) -> np.ndarray:
    """A boolean array's true values as numpy (NULL is false)."""
    return np.asarray(_true(value, len(value)).to_numpy(zero_copy_only=False))


def _combined(value: Datum) -> pa.Array:
    return value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value


def _is(fn: Callable[..., Datum], value: Datum, length: int) -> Datum:
    return fn(as_array(value, length))


def _strict(fn: Callable[..., Datum], *values: Datum) -> Datum:
    """`fn` of values, NULL where any is NULL; a NULL constant (Arrow's null type, which
    Arrow's kernels take for no type) makes the whole result NULL, as per row."""
    if any(v.type == pa.null() for v in values):
        return pa.scalar(None)
    return fn(*values)


def _exact(kernel: Callable[..., Datum], per_value: Callable[..., Any]) -> Callable[..., Datum]:
    """`kernel`, a checked integer kernel, with the row form's overflow: where a result
    is beyond BIGINT's 64 bits it is NULL. Arrow's checked kernels fail the whole batch
    instead, so a batch that overflows anywhere is computed value by value (rare: the
    fast path stays a kernel)."""

    def run(*values: Datum) -> Datum:
        values = tuple(_wide(v) for v in values)
        try:
            return kernel(*values)
        except pa.ArrowInvalid:
            arrays = [len(v) for v in values if not isinstance(v, pa.Scalar)]
            if not arrays:  # constants only
                return pa.scalar(bigint_or_null(per_value(*(v.as_py() for v in values))))
            length = max(arrays)
            rows = zip(*(as_array(v, length).to_pylist() for v in values), strict=True)
            exact = [None if None in row else bigint_or_null(per_value(*row)) for row in rows]
            return pa.array(exact, pa.int64())

    return run


def _typed(a: Datum, b: Datum, type_: pa.DataType) -> tuple[Datum, Datum]:
    """NULL constants as `type_` (Kleene logic needs booleans on both sides)."""
    return (
        pc.cast(a, type_) if a.type == pa.null() else a,
        pc.cast(b, type_) if b.type == pa.null() else b,
    )


def _unified(values: list[pa.Array | pa.ChunkedArray]) -> list[pa.Array | pa.ChunkedArray]:
    """Values one kernel takes together: NULL constants typed like the others, integers
    as int64, integers beside floats as float64 (an array holds one type)."""
    typed = [v.type for v in values if v.type != pa.null()]
    if not typed:
        return values
    if all(pa.types.is_integer(t) for t in typed):
        target = pa.int64()
    elif all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in typed):
        target = pa.float64()
    else:
        target = typed[0]
    return [pc.cast(v, target) for v in values]


def _wide(value: Datum) -> Datum:
    """Integers as int64 (Python's ints do not wrap at 32 bits)."""
    if pa.types.is_integer(value.type) and value.type != pa.int64():
        return pc.cast(value, pa.int64())
    return value


def _floor_bucket(ts: pa.Array | pa.ChunkedArray, width: Datum) -> pa.Array:
    """`ts - ts % width` with Python's floor modulo (instants before 1970 land right)."""
    values = _combined(pc.cast(ts, pa.int64()))
    nulls = np.asarray(values.is_null().to_numpy(zero_copy_only=False))
    raw = values.fill_null(0).to_numpy()
    if isinstance(width, pa.Scalar):
        if not width.is_valid:
            return pa.nulls(len(values), pa.int64())
        step: Any = int(width.as_py())
    else:
        step_array = _combined(pc.cast(width, pa.int64()))
        nulls = nulls | np.asarray(step_array.is_null().to_numpy(zero_copy_only=False))
        step = step_array.fill_null(1).to_numpy()
    return pa.array(raw - np.mod(raw, step), pa.int64(), mask=nulls)
