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
    match. Returns the joined rows and each one's input row.

    Each distinct key of the batch is looked up once (the plan's dict, so keys match as
    Python values do), and the rows are expanded from the distinct keys' matches."""
    assert op.vector_keys is not None
    n = table.num_rows
    # Each row's key as a number: its columns' dictionary codes in mixed radix.
    code = np.zeros(n, dtype=np.int64)
    dictionaries: list[list[Any]] = []
    for vector in op.vector_keys:
        values, codes = _codes(vector(table), n)
        code = code * (len(values) + 1) + codes
        dictionaries.append(values)
    distinct, inverse = distinct_codes(code)
    # The matches of each distinct key, one after another (``first``: where its begin).
    matched: list[dict[str, Any] | None] = []
    first = np.zeros(len(distinct), dtype=np.int64)
    count = np.zeros(len(distinct), dtype=np.int64)
    for u, number in enumerate(distinct.tolist()):
        key = []
        for values in reversed(dictionaries):
            number, at = divmod(number, len(values) + 1)
            key.append(values[at] if at < len(values) else None)
        key.reverse()
        found = op._index.get(tuple(key)) if None not in key else None
        first[u] = len(matched)
        if found:
            matched += found
        elif op.left:
            matched.append(None)
        count[u] = len(matched) - first[u]
    if bool((count == 1).all()):
        # Each row once, in order (a lookup of a unique key): the rows as they are.
        rows, which, joined = np.arange(n, dtype=np.int64), first[inverse], table
    else:
        per_row = count[inverse]
        rows = np.repeat(np.arange(n, dtype=np.int64), per_row)
        # Output row j, the k-th of its input row, takes that row's key's k-th match.
        began = np.cumsum(per_row) - per_row
        which = np.repeat(first[inverse], per_row) + (
            np.arange(len(rows)) - np.repeat(began, per_row)
        )
        joined = table.take(pa.array(rows, pa.int64()))
    taken = pa.array(which, pa.int64())
    for column in op.columns:
        name = f"{op.label}.{column}"
        values = pa.array([None if m is None else m[name] for m in matched])
        if pa.types.is_null(values.type):  # all NULL here: the type the table's column has
            at = op.columns.index(column)
            values = values.cast(pa.array([row[at] for row in op.rows]).type)
        joined = joined.append_column(name, values.take(taken))
    return joined, rows


def distinct_codes(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``code``'s distinct values (non-negative integers), sorted, and each row's index
    among them: counted where the codes are few (dictionary codes), else sorted."""
    if len(code) and int(code.max()) < 4 * len(code) + 1024:
        present = np.bincount(code) > 0
        return np.flatnonzero(present), (np.cumsum(present) - 1)[code]
    distinct, inverse = np.unique(code, return_inverse=True)
    return distinct, inverse.reshape(-1)


def _codes(value: Any, length: int) -> tuple[list[Any], np.ndarray]:
    """A key column's distinct values (Python values) and each row's index among them
    (``len(values)``: NULL)."""
    if isinstance(value, pa.Scalar):
        return [value.as_py()], np.zeros(length, dtype=np.int64)
    if isinstance(value, pa.ChunkedArray):
        value = value.combine_chunks()
    encoded = pc.dictionary_encode(value)
    values = encoded.dictionary.to_pylist()
    codes = pc.fill_null(encoded.indices, len(values))
    return values, np.asarray(codes.to_numpy(zero_copy_only=False), dtype=np.int64)


def shared_pylist(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """``column.to_pylist()`` with each distinct value one Python object, shared by the
    rows that hold it (a copy per row costs memory where the rows are kept)."""
    values, codes = _codes(column, len(column))
    values.append(None)  # code len(values): NULL
    return [values[c] for c in codes.tolist()]


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


def keyed_segments(
    table: pa.Table, key: Sequence[str]
) -> list[tuple[tuple[Any, ...], tuple[int, int]]]:
    """Each key of ``table`` sorted by ``key``: its values (a tuple) and its rows'
    (start, end), as :func:`segments` finds them."""
    spans = segments(table, key)
    firsts = pa.array([start for start, _ in spans], pa.int64())
    # Every key's values at once: a value at a time costs more than the key's rows.
    values = [table.column(k).take(firsts).to_pylist() for k in key]
    named = zip(*values, strict=True) if values else [()] * len(spans)
    return [(tuple(found), span) for span, found in zip(spans, named, strict=True)]


def sort_order(table: pa.Table, names: Sequence[str]) -> pa.Array:
    """The row order of ``table`` sorted by ``names`` ascending, NULLs last, ties kept in
    their order: what ``table.sort_by`` gives. Columns of integers and strings are sorted
    as integer ranks (a string column's distinct values are sorted once, then its rows
    by their values' ranks); a table with another column type among ``names`` goes
    through Arrow's sort. Rows already in order by the last names (a stage's tie order
    of rows the pipeline released in it) are sorted by the names before those alone."""
    ranks = []
    for name in names:
        rank = _ranks(table.column(name))
        if rank is None:
            return pc.sort_indices(table, [(n, "ascending") for n in names])
        ranks.append(rank)
    leading = ranks[: _ordered_from(ranks)]
    if not leading:
        return pa.array(np.arange(table.num_rows, dtype=np.int64))
    # One integer key when the columns' spans fit (stable_argsort then sorts it the
    # fastest way its span allows).
    composite = _composite(leading, table.num_rows)
    if composite is None:
        return pa.array(np.lexsort(leading[::-1]).astype(np.int64))
    return pa.array(stable_argsort(composite))


def key_ranks(table: pa.Table, names: Sequence[str]) -> np.ndarray | None:
    """One integer per row (from 0) that orders the rows by ``names`` as
    :func:`sort_order` does, equal for equal keys; None for a column type that is not
    ranked or keys too many to number in 62 bits."""
    ranks = [_ranks(table.column(name)) for name in names]
    if any(rank is None for rank in ranks):
        return None
    return _composite([r for r in ranks if r is not None], table.num_rows)


def _composite(ranks: Sequence[np.ndarray], rows: int) -> np.ndarray | None:
    """The columns' ranks as one integer, each offset from its least (None: their spans
    do not fit 62 bits)."""
    composite, width = np.zeros(rows, dtype=np.int64), 1
    for rank in ranks:
        least = int(rank.min())
        span = int(rank.max()) - least + 1
        width *= span
        if width >= 1 << 62:
            return None
        composite = composite * span + (rank - least)
    return composite


def stable_argsort(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` of integers, the fastest way their span
    allows: a span of 16 bits or fewer as 8 or 16 bits (numpy's stable sort of those is
    a radix sort); a wider one, where it fits, with each value's place as its last digit,
    which makes every value distinct, so that numpy's quicksort (about four times as fast
    as its stable sort of 64-bit integers) gives the stable order."""
    n = len(values)
    if n < 2:
        return np.arange(n, dtype=np.int64)
    least = int(values.min())
    span = int(values.max()) - least
    if span < 1 << 16:
        narrow = np.uint8 if span < 1 << 8 else np.uint16
        return np.argsort((values - least).astype(narrow), kind="stable")
    if span < (1 << 62) // n:
        places = np.arange(n, dtype=np.int64)
        return np.argsort((values.astype(np.int64) - least) * n + places)
    return np.argsort(values, kind="stable")


def _ordered_from(ranks: Sequence[np.ndarray]) -> int:
    """The fewest leading columns of ``ranks`` whose stable sort orders the rows: the
    start of the longest run of last columns the rows are already in order by."""
    n = len(ranks[0]) if ranks else 0
    if n < 2:
        return 0
    start = len(ranks)
    ordered = np.ones(n - 1, dtype=bool)  # row i <= row i + 1 by ranks[j:]
    for j in range(len(ranks) - 1, -1, -1):
        step = np.diff(ranks[j])
        ordered = (step > 0) | ((step == 0) & ordered)
        if ordered.all():
            start = j
    return start


def _ranks(column: pa.ChunkedArray | pa.Array) -> np.ndarray | None:
    """Integers that order ``column``'s rows as Arrow's ascending sort does (NULLs last,
    equal values equal), or None for a type this does not rank."""
    kind = column.type
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    signed = pa.types.is_signed_integer(kind) or pa.types.is_timestamp(kind)
    if signed and column.null_count == 0:
        return np.asarray(column.cast(pa.int64()).to_numpy(), dtype=np.int64)
    if not (pa.types.is_integer(kind) or pa.types.is_string(kind)):
        return None
    encoded = pc.dictionary_encode(column)
    values = encoded.dictionary
    rank_of = np.empty(len(values) + 1, dtype=np.int64)
    rank_of[np.asarray(pc.sort_indices(values).to_numpy(), dtype=np.int64)] = np.arange(len(values))
    rank_of[-1] = len(values)  # NULL: after every value
    codes = pc.fill_null(encoded.indices, len(values))
    return rank_of[np.asarray(codes.to_numpy(zero_copy_only=False), dtype=np.int64)]
