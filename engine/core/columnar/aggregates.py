"""Built-in aggregates over ranges of rows, per column (count, sum, avg, min, max).

**Sums are differences of running prefixes.** Each key keeps, per aggregate, the running
count of rows, of non-NULL values and their running sum since its first row, added one
row at a time (``np.cumsum`` is a left-to-right loop). The sum over a frame is the
prefix after its last row minus the prefix before its first: it depends on the rows
alone, never on how they were cut into batches or slices, so live and replay give the
same bits (alert ids hash the values). Its rounding is that of one running sum
(relative error about 1e-16 times how far the running sum has grown past the frame's).

**Least and greatest** are exact in any order: over a range of rows (a sparse table),
over stored slices (their own extremes) and the suffix of one slice, combined.

:func:`finish` turns the parts into SQL values: ``count(*)`` counts rows, the others
skip NULLs and are NULL over no value (``count(x)`` is 0), ``avg`` is ``sum / count``;
sums of integers stay integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.core.plan import AggCall

KINDS = ("count", "sum", "avg", "min", "max")
"""The built-ins this module computes (var, stddev, first, last go row by row)."""


def columnar_call(call: AggCall) -> bool:
    """Whether ``call`` is a built-in this module computes, with columnar arguments."""
    return (
        call.factory is None
        and call.name in KINDS
        and len(call.args) <= 1
        and (not call.args or call.vector_args is not None)
    )


@dataclass
class Column:
    """One aggregate's argument over a run of rows: values (NULLs as 0) and validity.
    ``numeric`` values go through numpy; others (strings) are compared in Python.
    ``extremes``: whether the aggregate needs the least (min) and the greatest (max)."""

    values: np.ndarray
    valid: np.ndarray
    numeric: bool
    extremes: tuple[bool, bool] = (True, True)

    @staticmethod
    def of(array: pa.Array | pa.ChunkedArray | None, length: int) -> Column:
        """The argument column of ``length`` rows (None: ``count(*)``, no argument)."""
        if array is None:
            return Column(
                np.zeros(length, dtype=np.int64), np.ones(length, dtype=bool), True, (False, False)
            )
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        kind = array.type
        if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
            values = np.asarray(pc.fill_null(pc.cast(array, pa.int64()), 0).to_numpy())
            return Column(values, valid, True)
        if pa.types.is_floating(kind):
            values = np.asarray(pc.fill_null(pc.cast(array, pa.float64()), 0.0).to_numpy())
            return Column(values, valid, True)
        if kind == pa.null():
            return Column(np.zeros(length, dtype=np.int64), np.zeros(length, dtype=bool), True)
        return Column(np.asarray(array.to_pylist(), dtype=object), valid, False)

    def take(self, start: int, end: int) -> Column:
        """The rows ``[start, end)``."""
        return Column(self.values[start:end], self.valid[start:end], self.numeric, self.extremes)


@dataclass
class Prefix:
    """Running totals after each row of a run (arrays of the run's length), and the
    totals before its first row (``start``): rows, non-NULL values, and their sum."""

    rows: np.ndarray
    valid: np.ndarray
    total: np.ndarray
    start: tuple[int, int, Any]

    @staticmethod
    def after(column: Column, start: tuple[int, int, Any]) -> Prefix:
        """The running totals of ``column``'s rows, continuing from ``start``."""
        rows0, valid0, total0 = start
        n = len(column.valid)
        rows = rows0 + np.arange(1, n + 1, dtype=np.int64)
        valid = np.cumsum(np.concatenate([[valid0], column.valid.astype(np.int64)]))[1:]
        if column.numeric:
            values = column.values
            if isinstance(total0, float) and values.dtype != np.float64:
                values = values.astype(np.float64)
            if isinstance(total0, int) and values.dtype == np.float64:
                total0 = float(total0)
            # One left-to-right running sum, continued from the last one (module doc).
            total = np.cumsum(np.concatenate([np.array([total0], dtype=values.dtype), values]))[1:]
        else:
            total = np.zeros(n, dtype=np.int64)
        return Prefix(rows, valid, total, start)

    def end(self) -> tuple[int, int, Any]:
        """The totals after the run's last row."""
        if not len(self.rows):
            return self.start
        total = self.total[-1].item() if len(self.total) else self.start[2]
        return int(self.rows[-1]), int(self.valid[-1]), total

    def before(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The totals before row ``index`` of the run, per index (0: ``start``)."""
        start_total = np.array([self.start[2]], dtype=self.total.dtype if len(self.total) else None)
        start_total = start_total.astype(self.total.dtype)
        if not len(self.rows):  # every index is 0
            count = len(index)
            return (
                np.full(count, self.start[0], dtype=np.int64),
                np.full(count, self.start[1], dtype=np.int64),
                np.repeat(start_total, count),
            )
        # Row i's totals are those after row i - 1; before row 0, ``start``'s.
        first = index == 0
        after = np.where(first, 0, index - 1)
        rows, valid, total = self.rows[after], self.valid[after], self.total[after]
        if first.any():
            rows[first], valid[first], total[first] = self.start[0], self.start[1], start_total
        return rows, valid, total


START: tuple[int, int, Any] = (0, 0, 0)
"""A key's totals before its first row."""


@dataclass
class Parts:
    """One aggregate over some frames, per output: rows, non-NULL values, their sum,
    least and greatest (the last three meaningless where ``valid`` is 0)."""

    rows: np.ndarray
    valid: np.ndarray
    total: np.ndarray
    least: np.ndarray
    most: np.ndarray

    def take(self, start: int, end: int | None) -> Parts:
        """The outputs ``[start, end)``."""
        return Parts(*(a[start:end] for a in self._arrays()))

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return (self.rows, self.valid, self.total, self.least, self.most)

    @staticmethod
    def concat(many: list[Parts]) -> Parts:
        """The outputs of several, one after another."""
        if len(many) == 1:
            return many[0]
        columns = zip(*(p._arrays() for p in many), strict=True)
        return Parts(*(np.concatenate(arrays) for arrays in columns))


def parts(
    ends: tuple[np.ndarray, np.ndarray, np.ndarray],
    starts: tuple[np.ndarray, np.ndarray, np.ndarray],
    least: np.ndarray,
    most: np.ndarray,
) -> Parts:
    """Parts from the running totals at each frame's end and before its start."""
    return Parts(ends[0] - starts[0], ends[1] - starts[1], ends[2] - starts[2], least, most)


def extremes(column: Column, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least and greatest non-NULL value of each range ``[lo, hi)`` of ``column``
    (placeholders when its aggregate needs neither)."""
    least, most = column.extremes
    if not column.numeric and (least or most):
        return _object_extremes(column.values, column.valid, lo, hi)
    return (
        range_extreme(column.values, column.valid, lo, hi, np.minimum)
        if least and column.numeric
        else identities(len(lo), column, np.minimum),
        range_extreme(column.values, column.valid, lo, hi, np.maximum)
        if most and column.numeric
        else identities(len(lo), column, np.maximum),
    )


def range_extreme(
    values: np.ndarray, valid: np.ndarray, lo: np.ndarray, hi: np.ndarray, fn: Any
) -> np.ndarray:
    """The least (``np.minimum``) or greatest value over each range, NULLs skipped (a
    range with none gives the fold's identity)."""
    fill = _identity(values.dtype, fn)
    if not len(lo):
        return np.zeros(0, dtype=values.dtype)
    masked = np.where(valid, values, fill)
    if len(lo) <= 32 or not len(masked):
        reduce = fn.reduce
        return np.array(
            [reduce(masked[a:b]) if b > a else fill for a, b in zip(lo, hi, strict=True)],
            dtype=values.dtype,
        )
    # A sparse table: level k holds the extreme of each run of 2**k values from there,
    # up to the longest range asked for (a short frame needs few levels).
    levels = [masked]
    size = 1
    longest = min(len(masked), int((hi - lo).max()))
    while size * 2 <= longest:
        prev = levels[-1]
        levels.append(fn(prev[:-size], prev[size:]))
        size *= 2
    length = np.maximum(hi - lo, 1)
    k = np.floor(np.log2(length)).astype(np.int64)
    out = np.full(len(lo), fill, dtype=values.dtype)
    for level in range(len(levels)):  # the levels asked for, without sorting k
        at = k == level
        if not at.any():
            continue
        table = levels[level]
        span = 1 << int(level)
        left = lo[at]
        right = np.maximum(hi[at] - span, left)
        out[at] = fn(table[left], table[right])
    return np.where(hi > lo, out, fill)


def combine_extremes(a: np.ndarray, b: np.ndarray, fn: Any) -> np.ndarray:
    """Two sets of extremes, per output (a missing one is the fold's identity, or None
    for Python values)."""
    if a.dtype == object or b.dtype == object:
        pick = min if fn is np.minimum else max
        return np.array(
            [x if y is None else y if x is None else pick(x, y) for x, y in zip(a, b, strict=True)],
            dtype=object,
        )
    if a.dtype != b.dtype:
        a, b = a.astype(np.float64), b.astype(np.float64)
    return fn(a, b)


def identities(count: int, like: Column, fn: Any) -> np.ndarray:
    """``count`` missing extremes of ``like``'s kind."""
    if not like.numeric:
        return np.full(count, None, dtype=object)
    return np.full(count, _identity(like.values.dtype, fn), dtype=like.values.dtype)


def _identity(dtype: np.dtype, fn: Any) -> Any:
    if dtype == np.float64:
        return np.inf if fn is np.minimum else -np.inf
    info = np.iinfo(dtype)
    return info.max if fn is np.minimum else info.min


def _object_extremes(
    values: np.ndarray, valid: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    least = np.empty(len(lo), dtype=object)
    most = np.empty(len(lo), dtype=object)
    for k, (a, b) in enumerate(zip(lo, hi, strict=True)):
        found = [v for v, ok in zip(values[a:b], valid[a:b], strict=True) if ok]
        least[k] = min(found) if found else None
        most[k] = max(found) if found else None
    return least, most


def finish(call: AggCall, found: Parts) -> pa.Array:
    """The SQL values of ``call`` from its parts, one per output."""
    kind = call.name
    if kind == "count":
        return pa.array(found.rows if not call.args else found.valid, pa.int64())
    none = found.valid == 0
    if kind == "avg":
        with np.errstate(divide="ignore", invalid="ignore"):
            values = found.total / np.maximum(found.valid, 1)
        return pa.array(np.asarray(values, dtype=np.float64), pa.float64(), mask=none)
    chosen = {"sum": found.total, "min": found.least, "max": found.most}[kind]
    if chosen.dtype == object:
        return pa.array([None if n else v for v, n in zip(chosen, none, strict=True)])
    return pa.array(chosen, mask=none)
