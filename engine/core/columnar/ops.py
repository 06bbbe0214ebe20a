"""Stateless query steps over whole batches: filters, lookup joins and projections on
Arrow tables, each through the columnar forms the compiler gave their expressions.

Every step keeps, for each row it returns, the index of the input row it came from
(``parents``): a lookup join may give one input row several rows, a filter none, and
the numbering of outputs (:mod:`engine.core.columnar.stage`) follows the input rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.core.plan import Filter, LookupJoin, Project, StatelessOp


def vectorised(ops: Sequence[StatelessOp]) -> bool:
    """Whether every step of ``ops`` has its columnar form."""
    for op in ops:
        if isinstance(op, Filter) and op.vector is None:
            return False
        if isinstance(op, Project) and op.vectors is None:
            return False
        if isinstance(op, LookupJoin) and op.vector_keys is None:
            return False
    return True


def apply(ops: Sequence[StatelessOp], table: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """``table`` through ``ops``, and each result row's input row index."""
    parents = np.arange(table.num_rows, dtype=np.int64)
    for op in ops:
        if isinstance(op, Filter):
            assert op.vector is not None
            keep = op.vector(table)
            if pa.types.is_null(keep.type):  # compared with an all-NULL column
                keep = keep.cast(pa.bool_())
            keep = pc.fill_null(keep, False)
            table = table.filter(keep)
            parents = parents[np.asarray(keep.to_numpy(zero_copy_only=False), dtype=bool)]
        elif isinstance(op, Project):
            assert op.vectors is not None
            names = [name for name, _ in op.columns]
            table = pa.table(dict(zip(names, (v(table) for v in op.vectors), strict=True)))
        else:
            table, taken = join(op, table)
            parents = parents[taken]
    return table, parents


def join(op: LookupJoin, table: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """A stream-table join: each input row with each of its matches (in the table's row
    order), or once with NULL columns when ``left`` and none match; NULL keys never
    match. Returns the joined rows and each one's input row."""
    assert op.vector_keys is not None
    values = [v(table) for v in op.vector_keys]
    keys = list(zip(*(_values(v, table.num_rows) for v in values), strict=True))
    index = op._index  # key tuple -> the matching table rows, named "<label>.<column>"
    taken: list[int] = []
    matches: list[dict[str, Any] | None] = []
    for i, key in enumerate(keys):
        found = index.get(key) if None not in key else None
        if found:
            taken += [i] * len(found)
            matches += found
        elif op.left:
            taken.append(i)
            matches.append(None)
    rows = np.array(taken, dtype=np.int64)
    joined = table.take(pa.array(rows, pa.int64()))
    for column in op.columns:
        name = f"{op.label}.{column}"
        values = pa.array([None if m is None else m[name] for m in matches])
        if pa.types.is_null(values.type):  # all NULL here: the type the table's column has
            at = op.columns.index(column)
            values = values.cast(pa.array([row[at] for row in op.rows]).type)
        joined = joined.append_column(name, values)
    return joined, rows


def _values(value: Any, length: int) -> list[Any]:
    if isinstance(value, pa.Scalar):
        return [value.as_py()] * length
    return value.to_pylist()


def segments(table: pa.Table, key: Sequence[str]) -> list[tuple[int, int]]:
    """Where each key's rows are in ``table`` sorted by ``key``: (start, end) pairs. Two
    NULLs are one key, as Python's tuples compare them."""
    n = table.num_rows
    if not n:
        return []
    if not key:
        return [(0, n)]
    change = np.zeros(n - 1, dtype=bool)
    for name in key:
        column = table.column(name)
        if n > 1:
            a, b = column.slice(0, n - 1), column.slice(1)
            differs = pc.not_equal(a, b)
            # NULL beside a value differs, NULL beside NULL does not.
            one_null = pc.xor(pc.is_null(a), pc.is_null(b))
            differs = pc.or_kleene(pc.fill_null(differs, False), one_null)
            change |= np.asarray(differs.to_numpy(zero_copy_only=False), dtype=bool)
    cuts = [0, *(np.flatnonzero(change) + 1).tolist(), n]
    return list(itertools.pairwise(cuts))
