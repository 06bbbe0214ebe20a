"""Where a :class:`~engine.core.pipeline.Pipeline` keeps its state between batches.

The pipeline is pure; a runtime hands it a :class:`StateStore`: Spark's state store
inside the engine (``engine.spark.processor``), a dict in tests and replay. The store
holds bytes under four-part keys, so that a batch writes only what it changed: one entry
per evaluator head, per chunk of a window's tuples, per stream's sequencer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

StateKey = tuple[str, str, str, int]
"""(kind, name, key, number): e.g. ("head", stage, key as JSON, 0), ("chunk", stage, key
as JSON, chunk number), ("sequencer", stream, "", 0)."""


class StateStore(Protocol):
    """A key-value store of bytes (the operations a batch needs, nothing more)."""

    def get(self, key: StateKey) -> bytes | None:
        """The value stored under ``key``, or None."""
        ...

    def put(self, key: StateKey, value: bytes) -> None:
        """Store ``value`` under ``key``."""
        ...

    def delete(self, key: StateKey) -> None:
        """Remove ``key`` (absent: nothing happens)."""
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

    def put(self, key: StateKey, value: bytes) -> None:
        self.entries[key] = value

    def delete(self, key: StateKey) -> None:
        self.entries.pop(key, None)

    def scan(self, kind: str) -> Iterator[tuple[StateKey, bytes]]:
        return iter([(k, v) for k, v in self.entries.items() if k[0] == kind])

    def keys(self, kind: str) -> Iterator[StateKey]:
        return iter([k for k in self.entries if k[0] == kind])
