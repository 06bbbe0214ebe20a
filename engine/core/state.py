"""Where a :class:`~engine.core.pipeline.Pipeline` keeps its state between batches.

The pipeline is pure; a runtime hands it a :class:`StateStore`: Spark's state store
inside the engine (``engine.spark.step``), a dict in tests and replay. The store
holds bytes under four-part keys, so that a batch writes only what it changed: one entry
per evaluator head, per chunk of a window's tuples, per stream's sequencer.
"""

from __future__ import annotations

import copyreg
import io
import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

_PICKLE = pickle.HIGHEST_PROTOCOL


def _array(dtype: str, shape: tuple[int, ...], data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()


def _reduce_array(array: np.ndarray) -> Any:
    if array.dtype.hasobject:
        return array.__reduce_ex__(_PICKLE)
    return _array, (array.dtype.str, array.shape, array.tobytes())


def _table(data: bytes) -> pa.Table:
    return ipc.open_stream(data).read_all()


def _reduce_table(table: pa.Table) -> Any:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return _table, (sink.getvalue().to_pybytes(),)


_DISPATCH = {**copyreg.dispatch_table, np.ndarray: _reduce_array, pa.Table: _reduce_table}


def dumps(value: Any) -> bytes:
    """``value`` pickled, with numeric numpy arrays as their raw bytes and Arrow tables
    as Arrow IPC streams (``pickle.loads`` reads it back). A window's state is many small
    arrays and tables, which pickle's own way spends 10 us an array and 30 us or more a
    table on: the columnar runners' per-key records took three times as long."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, _PICKLE)
    pickler.dispatch_table = _DISPATCH
    pickler.dump(value)
    return out.getvalue()


StateKey = tuple[str, str, str, int]
"""(kind, name, key, number): e.g. ("head", stage, key as JSON, 0), ("chunk", stage, key
as JSON, chunk number), ("sequencer", stream, "", 0)."""


class StateStore(Protocol):
    """A key-value store of bytes (the operations a batch needs, nothing more)."""

    def get(self, key: StateKey) -> bytes | None:
        """The value stored under ``key``, or None."""
        ...

    def get_many(self, keys: Sequence[StateKey]) -> list[bytes | None]:
        """The values stored under ``keys``, in order (a store reached over a socket
        sends every request before it waits for any answer)."""
        ...

    def put(self, key: StateKey, value: bytes) -> None:
        """Store ``value`` under ``key``."""
        ...

    def delete(self, key: StateKey) -> None:
        """Remove ``key`` (absent: nothing happens)."""
        ...

    def write(self, changes: Sequence[tuple[StateKey, bytes | None]]) -> None:
        """Apply ``changes`` in order: each value stored under its key, or the key
        removed where the value is None (a store reached over a socket sends them all
        before it waits for any answer)."""
        ...

    def scan(self, kind: str) -> Iterable[tuple[StateKey, bytes]]:
        """Every entry whose key is of ``kind``."""
        ...

    def keys(self, kind: str) -> Iterable[StateKey]:
        """Every key of ``kind``, without reading the values."""
        ...


class MemoryStore:
    """A :class:`StateStore` in a dict (tests, and a pipeline that must resume in-process)."""

    def __init__(self) -> None:
        self.entries: dict[StateKey, bytes] = {}

    def get(self, key: StateKey) -> bytes | None:
        return self.entries.get(key)

    def get_many(self, keys: Sequence[StateKey]) -> list[bytes | None]:
        return [self.entries.get(key) for key in keys]

    def put(self, key: StateKey, value: bytes) -> None:
        self.entries[key] = value

    def delete(self, key: StateKey) -> None:
        self.entries.pop(key, None)

    def write(self, changes: Sequence[tuple[StateKey, bytes | None]]) -> None:
        for key, value in changes:
            if value is None:
                self.entries.pop(key, None)
            else:
                self.entries[key] = value

    def scan(self, kind: str) -> Iterator[tuple[StateKey, bytes]]:
        return iter([(k, v) for k, v in self.entries.items() if k[0] == kind])

    def keys(self, kind: str) -> Iterator[StateKey]:
        return iter([k for k in self.entries if k[0] == kind])


JOURNAL = "journal"
"""The kind of a :class:`JournaledStore`'s journal entries in the store beneath it."""


class JournaledStore:
    """A :class:`StateStore` that writes a batch's changes as one journal entry of the
    store beneath it (``inner``), and keeps at most ``fold_after - 1`` entries: each
    commit that reaches ``fold_after`` folds the oldest entry into the individual
    entries it still holds the newest value of, and deletes it.

    A store reached over a socket (Spark's state server) pays a round trip per write:
    hundreds per batch, one per key a batch touched. The journal makes that one write
    per batch, plus one per key whose last change has just left the journal: a key
    changed in every batch stays in the journal and is never written on its own. The
    fold is spread over the batches, one entry each, so no batch pays for many, and
    hands its writes to the store together (:meth:`StateStore.write`). Reads
    see the journal: it is read back when the store is opened (:meth:`open`) and kept
    in memory until folded.
    """

    def __init__(self, inner: StateStore, fold_after: int = 16) -> None:
        self.inner = inner
        self.fold_after = fold_after
        self.latest: dict[StateKey, bytes | None] = {}  # journaled, not yet folded
        self._batch: dict[StateKey, bytes | None] = {}  # this batch's changes
        # The journal's entries in the inner store, oldest first: each with the keys
        # it holds the newest value of (those the fold of that entry writes).
        self._entries: dict[int, set[StateKey]] = {}
        self._owner: dict[StateKey, int] = {}  # the entry holding each key of latest

    @classmethod
    def open(cls, inner: StateStore, fold_after: int = 16) -> JournaledStore:
        """The store over ``inner`` as the last :meth:`commit` left it."""
        store = cls(inner, fold_after)
        for key, data in sorted(inner.scan(JOURNAL), key=lambda entry: entry[0][3]):
            store._journal(key[3], pickle.loads(data))
        return store

    def _journal(self, number: int, changes: dict[StateKey, bytes | None]) -> None:
        """Take journal entry ``number`` (the newest) holding ``changes``."""
        self.latest.update(changes)
        for key in changes:
            previous = self._owner.get(key)
            if previous is not None:
                self._entries[previous].discard(key)
            self._owner[key] = number
        self._entries[number] = set(changes)

    def get(self, key: StateKey) -> bytes | None:
        if key in self.latest:
            return self.latest[key]
        return self.inner.get(key)

    def get_many(self, keys: Sequence[StateKey]) -> list[bytes | None]:
        beneath = [key for key in keys if key not in self.latest]
        found = dict(zip(beneath, self.inner.get_many(beneath), strict=True))
        return [self.latest[key] if key in self.latest else found[key] for key in keys]

    def put(self, key: StateKey, value: bytes) -> None:
        self.latest[key] = self._batch[key] = value

    def delete(self, key: StateKey) -> None:
        self.latest[key] = self._batch[key] = None

    def write(self, changes: Sequence[tuple[StateKey, bytes | None]]) -> None:
        for key, value in changes:
            self.latest[key] = self._batch[key] = value

    def scan(self, kind: str) -> Iterator[tuple[StateKey, bytes]]:
        for key, value in self.inner.scan(kind):
            if key not in self.latest:
                yield key, value
        for key, found in list(self.latest.items()):
            if key[0] == kind and found is not None:
                yield key, found

    def keys(self, kind: str) -> Iterator[StateKey]:
        for key in self.inner.keys(kind):
            if key not in self.latest:
                yield key
        for key, found in list(self.latest.items()):
            if key[0] == kind and found is not None:
                yield key

    def commit(self) -> None:
        """Make this batch's changes durable in ``inner``: one journal entry, and, once
        the journal holds ``fold_after`` entries, the oldest folded."""
        if not self._batch:
            return
        number = next(reversed(self._entries)) + 1 if self._entries else 0
        self.inner.put((JOURNAL, "", "", number), pickle.dumps(self._batch, _PICKLE))
        self._journal(number, self._batch)
        self._batch = {}
        while len(self._entries) >= self.fold_after:
            self._fold_oldest()

    def _fold_oldest(self) -> None:
        """Write the keys the oldest journal entry holds the newest value of into their
        own entries, and delete it."""
        number = next(iter(self._entries))
        changes: list[tuple[StateKey, bytes | None]] = []
        for key in sorted(self._entries.pop(number)):
            changes.append((key, self.latest.pop(key)))
            del self._owner[key]
        changes.append(((JOURNAL, "", "", number), None))
        self.inner.write(changes)
