"""A source stream's readings between acceptance and the watermark passing them.

The sequencer accepts a reading as soon as it arrives (it lands in the readings table
at once), but the rules may only see it once the stream's watermark has passed its event
time: until then an earlier reading may still come. :class:`HeldRows` keeps those rows
once per stream, for every stage reading the stream, and stores them in immutable
chunks, one per batch: a batch writes the rows it added and deletes the chunks the
watermark has passed entirely. Whether a row has been released is a function of its
event time and the watermark alone (``ts < watermark``), so a restore takes every
stored chunk's rows at or above the saved watermark and is exact.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.core.columnar.ops import sort_order
from engine.core.state import StateKey, StateStore

KIND = "held"
_PICKLE = pickle.HIGHEST_PROTOCOL


class HeldRows:
    """The held rows of source stream ``stream`` (event times in column ``ts``)."""

    def __init__(self, stream: str, ts: str) -> None:
        self.stream = stream
        self.ts = ts
        self._held: list[_Part] = []  # in memory: every held row
        self.chunks: dict[int, int] = {}  # stored chunk number -> its latest event time
        self._next = 0

    @property
    def rows(self) -> list[pa.Table]:
        """Every held row, in tables."""
        return [part.table for part in self._held]

    def add(self, rows: pa.Table) -> None:
        """Hold ``rows`` (accepted readings, none below the watermark)."""
        if rows.num_rows:
            self._held.append(_Part.of(rows, self.ts, saved=False))

    def release(self, watermark: int) -> Released | None:
        """The held rows the watermark has passed (None: none); they are held no more."""
        passed, self._held = _split(self._held, watermark, self.ts)
        if not passed:
            return None
        rows = pa.concat_tables(passed)
        return Released(rows, np.asarray(sort_order(rows, [self.ts, "source", "seq"])))

    def save(self, store: StateStore, watermark: int) -> None:
        """Store the rows added since the last save as a chunk, and delete the chunks
        whose rows the watermark has all passed."""
        added = [part for part in self._held if not part.saved]
        if added:
            rows = _concat([part.table for part in added])
            number = self._next
            self._next += 1
            store.put(self._key(number), pickle.dumps(rows, _PICKLE))
            self.chunks[number] = max(part.latest for part in added)
            self._held = [p if p.saved else replace(p, saved=True) for p in self._held]
        for number, latest in list(self.chunks.items()):
            if latest < watermark:
                store.delete(self._key(number))
                del self.chunks[number]

    def restore(self, saved: Iterable[tuple[StateKey, bytes]], watermark: int) -> None:
        """Take up the stored chunks: the rows at or above ``watermark`` (the saved one)."""
        for key, data in sorted(saved, key=lambda entry: entry[0][3]):
            rows: pa.Table = pickle.loads(data)
            self.chunks[key[3]] = int(pc.max(rows.column(self.ts)).as_py())
            self._next = max(self._next, key[3] + 1)
            rows = rows.filter(pc.greater_equal(rows.column(self.ts), watermark))
            if rows.num_rows:
                self._held.append(_Part.of(rows, self.ts, saved=True))

    def _key(self, number: int) -> StateKey:
        return (KIND, self.stream, "", number)


@dataclass(frozen=True)
class Released:
    """Rows the watermark has passed, as they were held, with their tie order (event
    time, ``source``, ``seq``: every stage's order among equal keys). Each stage reads
    them in an order of its own; the rows are copied once per order asked for."""

    rows: pa.Table
    tie: np.ndarray

    def in_tie_order(self) -> pa.Table:
        """The rows in tie order."""
        return self.rows.take(self.tie)

    def arranged(self, key: Sequence[str]) -> pa.Table:
        """The rows sorted by ``key``, ties in tie order, without their ids (``source``,
        ``seq``: no rule can select them): what a runner of that
        :attr:`~engine.core.runners.StageRunner.arrangement` takes."""
        order = self.tie
        if key:
            keys = self.rows.select(list(key)).take(order)
            order = order[np.asarray(sort_order(keys, list(key)))]
        return self.rows.drop_columns(["source", "seq"]).take(order)


@dataclass(frozen=True)
class _Part:
    """Held rows added together, with their least and latest event times (a release
    looks into the rows of a part only when the watermark falls between the two), and
    whether they are in a stored chunk yet."""

    table: pa.Table
    least: int
    latest: int
    saved: bool

    @staticmethod
    def of(table: pa.Table, ts: str, saved: bool) -> _Part:
        bounds = pc.min_max(table.column(ts))
        return _Part(table, bounds["min"].as_py(), bounds["max"].as_py(), saved)


def _split(parts: list[_Part], watermark: int, ts: str) -> tuple[list[pa.Table], list[_Part]]:
    """The rows of ``parts`` below ``watermark``, and the parts of the others."""
    passed, kept = [], []
    for part in parts:
        if part.latest < watermark:
            passed.append(part.table)
        elif part.least >= watermark:
            kept.append(part)
        else:
            below = pc.less(part.table.column(ts), watermark)
            passed.append(part.table.filter(below))
            kept.append(_Part.of(part.table.filter(pc.invert(below)), ts, part.saved))
    return passed, kept


def _concat(tables: list[pa.Table]) -> pa.Table:
    # One chunk per column: a stored chunk is read back, restored and released whole.
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables).combine_chunks()
