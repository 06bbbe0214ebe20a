"""The columnar form of an expression gives exactly what its row closure gives.

Hypothesis draws well-typed expressions (what the checker lets through) over a few
columns of each type, and batches of rows with NULLs, NaN-free floats and ties; every
value `compile_vector` computes for the batch must equal the row closure's value for
that row (`compile_expr`), NULL for NULL. Expressions with no columnar form must say so
(None), never compute something else.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rules.language import ast
from rules.language.compiler import compile_expr
from rules.language.vectors import compile_vector
from tests.examples import examples

P = ast.Pos(1, 1)
COLUMNS = {
    "i": ("INT", pa.int32()),
    "j": ("INT", pa.int64()),
    "x": ("DOUBLE", pa.float64()),
    "y": ("DOUBLE", pa.float64()),
    "s": ("STRING", pa.string()),
    "b": ("BOOLEAN", pa.bool_()),
    "ts": ("TIMESTAMP", pa.int64()),
}
NUMERIC = ("INT", "DOUBLE")


def column(kind: str) -> st.SearchStrategy[ast.Expr]:
    names = [n for n, (k, _) in COLUMNS.items() if k == kind]
    return st.sampled_from(names).map(lambda n: ast.Column(n, None, P))


def literal(kind: str) -> st.SearchStrategy[ast.Expr]:
    values = {
        "INT": st.integers(-5, 5),
        "DOUBLE": st.floats(-5, 5, allow_nan=False).map(lambda v: round(v, 2)),
        "STRING": st.sampled_from(["a", "b", ""]),
        "BOOLEAN": st.booleans(),
    }[kind]
    return st.one_of(
        values.map(lambda v: ast.Literal(v, kind, P)), st.just(ast.Literal(None, "NULL", P))
    )


@cache  # one strategy per kind and depth: Hypothesis validates it once, not per example
def expr(kind: str, depth: int = 2) -> st.SearchStrategy[ast.Expr]:
    leaves = st.one_of(column(kind), literal(kind)) if kind != "TIMESTAMP" else column(kind)
    if depth == 0:
        return leaves
    sub = lambda k: expr(k, depth - 1)  # noqa: E731
    options = [leaves]
    if kind in NUMERIC:
        options.append(
            st.builds(
                lambda op, a, b: ast.Binary(op, a, b, P),
                st.sampled_from(["+", "-", "*"]),
                sub(kind),
                sub(kind),
            )
        )
        options.append(st.builds(lambda a: ast.Unary("-", a, P), sub(kind)))
        options.append(st.builds(lambda a: ast.Call("abs", (a,), False, None, P), sub(kind)))
    if kind == "DOUBLE":
        options.append(st.builds(lambda a, b: ast.Binary("/", a, b, P), sub("DOUBLE"), sub("INT")))
    if kind == "INT":
        options.append(st.builds(lambda a: ast.Call("floor", (a,), False, None, P), sub("DOUBLE")))
        options.append(
            st.builds(
                lambda c, a, b: ast.Case(((c, a),), b, P),
                sub("BOOLEAN"),
                literal("INT"),
                literal("INT"),
            )
        )
    if kind == "TIMESTAMP":
        width = st.sampled_from([1000, 60_000, 86_400_000]).map(
            lambda w: ast.Literal(w, "INTERVAL", P)
        )
        options.append(
            st.builds(
                lambda w, t: ast.Call("time_bucket", (w, t), False, None, P),
                width,
                column("TIMESTAMP"),
            )
        )
    if kind == "BOOLEAN":
        options.append(
            st.builds(
                lambda op, a, b: ast.Binary(op, a, b, P),
                st.sampled_from(["=", "<>", "<", "<=", ">", ">="]),
                sub("DOUBLE"),
                sub("INT"),
            )
        )
        options.append(
            st.builds(lambda a, b: ast.Binary("=", a, b, P), sub("STRING"), sub("STRING"))
        )
        options.append(
            st.builds(
                lambda op, a, b: ast.Binary(op, a, b, P),
                st.sampled_from(["AND", "OR"]),
                sub("BOOLEAN"),
                sub("BOOLEAN"),
            )
        )
        options.append(st.builds(lambda a: ast.Unary("NOT", a, P), sub("BOOLEAN")))
        options.append(st.builds(lambda a, n: ast.IsNull(a, n, P), sub("DOUBLE"), st.booleans()))
        options.append(
            st.builds(
                lambda a, items, n: ast.InList(a, tuple(items), n, P),
                sub("STRING"),
                st.lists(literal("STRING"), min_size=1, max_size=3),
                st.booleans(),
            )
        )
    for name in ("coalesce", "greatest", "least"):
        if kind in NUMERIC:
            options.append(
                st.builds(
                    lambda a, b, n=name: ast.Call(n, (a, b), False, None, P), sub(kind), sub(kind)
                )
            )
    return st.one_of(options)


row_values = {
    "i": st.one_of(st.none(), st.integers(-3, 3)),
    "j": st.one_of(st.none(), st.integers(-(2**40), 2**40)),
    "x": st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, -2.25, 3.0])),
    "y": st.one_of(st.none(), st.floats(-100, 100, allow_nan=False)),
    "s": st.one_of(st.none(), st.sampled_from(["a", "b", "", "é"])),
    "b": st.one_of(st.none(), st.booleans()),
    "ts": st.one_of(st.none(), st.integers(-(10**12), 10**13)),
}
rows_strategy = st.lists(st.fixed_dictionaries(row_values), min_size=1, max_size=12)


def same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0) or (
            math.isinf(a) and a == b
        )
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


@settings(max_examples=examples(400), deadline=None)
@given(
    st.sampled_from(["INT", "DOUBLE", "BOOLEAN", "STRING", "TIMESTAMP"]).flatmap(expr),
    rows_strategy,
)
@example(  # beyond BIGINT: NULL on both paths (Arrow's plain multiply wraps around)
    ast.Binary("*", ast.Column("j", None, P), ast.Column("j", None, P), P),
    [{**dict.fromkeys(COLUMNS), "j": 3_037_000_500}, {**dict.fromkeys(COLUMNS), "j": 2}],
)
@example(  # -(-2**63) overflows BIGINT, not an INT column's 32 bits
    ast.Unary("-", ast.Column("i", None, P), P),
    [{**dict.fromkeys(COLUMNS), "i": -(2**31)}],
)
def test_the_columnar_form_gives_the_row_values(node: ast.Expr, rows: list[dict]) -> None:
    vector = compile_vector(node)
    if vector is None:
        return
    batch = pa.table({n: pa.array([r[n] for r in rows], t) for n, (_, t) in COLUMNS.items()})
    try:
        expected = [compile_expr(node)(row) for row in rows]
    except (OverflowError, ZeroDivisionError):
        return  # the row closure itself cannot compute it
    got = vector(batch).to_pylist()
    assert len(got) == len(rows)
    for want, have, row in zip(expected, got, rows, strict=True):
        assert same(want, have), (want, have, row)


def test_what_has_no_columnar_form_says_so() -> None:
    x = ast.Column("x", None, P)
    assert compile_vector(ast.Binary("%", x, ast.Literal(2, "INT", P), P)) is None
    assert compile_vector(ast.Call("round", (x,), False, None, P)) is None
    assert compile_vector(ast.Call("lower", (ast.Column("s", None, P),), False, None, P)) is None
