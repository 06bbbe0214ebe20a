"""A window's tuple buffer stored in fixed chunks, so that a batch reads and writes the
part of the window it touches instead of the whole window.

The runtime keeps each (stage, key) evaluator in a state store between batches. A
RANGE frame holds every tuple of its range (a 15-minute average at 5,000 readings/s holds
4.5 million), yet a batch only appends at the back and expires from the front. So the
buffer is stored as chunks of ``CHUNK_ENTRIES`` entries: chunk ``c`` holds the entries
whose uid (the buffer's entry[0]: 1, 2, 3, ... in buffer order) lies in
``(c * CHUNK_ENTRIES, (c + 1) * CHUNK_ENTRIES]``. A save writes the chunks holding new
entries and deletes the chunks every entry of which has left; a restore reads the front
chunk (the window's next expiry) and the partly filled last chunk (new entries extend
it), and an advance reads further front chunks only when its watermark may expire them.

What the middle of the window holds is never read by a RANGE frame over incremental
aggregates: its running aggregates summarise the tuples, and tuples leave in timestamp
order (entry[1], non-decreasing along the buffer), each when the watermark passes its
ts plus the frame's reach. So an advance to watermark ``w`` can only expire entries with
``ts < w - reach``; :meth:`ChunkedBuffer.prepare` loads front chunks until one holds an
entry at or above that bound, which keeps the in-memory front the window's true front.
"""

from __future__ import annotations

import itertools
import math
import pickle
from collections import deque
from collections.abc import Callable
from typing import Any

CHUNK_ENTRIES = 256
"""Entries per stored chunk: a save rewrites at most one partly filled chunk per key."""

ChunkReader = Callable[[int], bytes]
"""Reads a stored chunk's bytes by its number."""

Entry = tuple[Any, ...]
"""A buffer entry: (uid, ts, ...)."""

_TAG = "chunks"


class ChunkedBuffer:
    """Where one window buffer's entries live between batches, and what a save changes.

    ``newest`` maps each stored chunk (ascending) to its newest ts; ``saved_uid`` is the
    highest uid stored; ``unloaded`` lists the stored chunks not in memory (the middle of
    the window). After :meth:`save`, ``writes`` and ``deletes`` are what to apply to the
    store.
    """

    def __init__(self, reach: int, read: ChunkReader | None = None) -> None:
        self.reach = reach  # an advance to w expires only entries with ts < w - reach
        self.read = read
        self.newest: dict[int, int] = {}
        self.saved_uid = 0
        self.unloaded: list[int] = []
        self.writes: dict[int, bytes] = {}
        self.deletes: list[int] = []

    @staticmethod
    def is_stored(state: Any) -> bool:
        """Whether a snapshot's buffer field is a chunk index (else the entries)."""
        return isinstance(state, tuple) and len(state) == 4 and state[0] == _TAG

    def _chunk(self, number: int) -> list[Entry]:
        if self.read is None:
            raise ValueError("a buffer stored in chunks needs a chunk reader to restore")
        return pickle.loads(self.read(number))

    def restore(self, state: tuple[str, dict[int, int], int, int]) -> deque[Entry]:
        """The in-memory buffer for a stored index: the front chunk from the front entry
        on, and the last chunk if partly filled; the chunks between stay unloaded."""
        _, self.newest, self.saved_uid, front_uid = state
        stored = sorted(self.newest)
        if not stored:
            return deque()
        first = stored[0]
        entries = [e for e in self._chunk(first) if e[0] >= front_uid]
        tail = self.saved_uid // CHUNK_ENTRIES if self.saved_uid % CHUNK_ENTRIES else None
        self.unloaded = [c for c in stored if c != first and c != tail]
        if tail is not None and tail != first:
            entries += self._chunk(tail)
        return deque(entries)

    def prepare(self, buffer: deque[Entry], watermark: int) -> deque[Entry]:
        """``buffer`` with the unloaded front chunks an advance to ``watermark`` may
        expire, and the one after them (so the true front survives the advance)."""
        if not self.unloaded:
            return buffer
        bound = watermark - self.reach
        take = 0
        for number in self.unloaded:
            if self.newest.get(number - 1, -math.inf) >= bound:
                break  # the chunk before it keeps an entry: the front stays there
            take += 1
        if not take:
            return buffer
        return self._load(buffer, take)

    def fill(self, buffer: deque[Entry]) -> deque[Entry]:
        """``buffer`` with every unloaded chunk in place (for a whole-state snapshot)."""
        return self._load(buffer, len(self.unloaded)) if self.unloaded else buffer

    def _load(self, buffer: deque[Entry], count: int) -> deque[Entry]:
        """Insert the first ``count`` unloaded chunks where they belong in ``buffer``."""
        numbers, self.unloaded = self.unloaded[:count], self.unloaded[count:]
        below = numbers[0] * CHUNK_ENTRIES  # every uid in memory up to here is before them
        front = list(itertools.takewhile(lambda e: e[0] <= below, buffer))
        loaded = [e for n in numbers for e in self._chunk(n)]
        return deque(front + loaded + list(itertools.islice(buffer, len(front), None)))

    def cleared(self) -> None:
        """The window was emptied (a reset): nothing stored is read again."""
        self.unloaded = []

    def save(self, buffer: deque[Entry]) -> tuple[str, dict[int, int], int, int]:
        """The index to keep in the snapshot; sets ``writes`` (the chunks holding entries
        newer than the last save, whole) and ``deletes`` (the chunks wholly expired)."""
        self.writes, self.deletes = {}, []
        if not buffer:
            self.deletes = sorted(self.newest)
            self.newest, self.unloaded = {}, []
            return (_TAG, {}, self.saved_uid, self.saved_uid + 1)
        first = (buffer[0][0] - 1) // CHUNK_ENTRIES
        self.deletes = [c for c in self.newest if c < first]
        for c in self.deletes:
            del self.newest[c]
        self.unloaded = [c for c in self.unloaded if c >= first]
        # Entries above `since` are in memory: new ones, and the partly filled last
        # chunk's older ones (restore loaded it).
        since = max(self.saved_uid // CHUNK_ENTRIES, first) * CHUNK_ENTRIES
        dirty: dict[int, list[Entry]] = {}
        for entry in reversed(buffer):
            if entry[0] <= since:
                break
            dirty.setdefault((entry[0] - 1) // CHUNK_ENTRIES, []).append(entry)
        for number, entries in dirty.items():
            entries.reverse()
            self.writes[number] = pickle.dumps(entries, protocol=pickle.HIGHEST_PROTOCOL)
            self.newest[number] = entries[-1][1]
        self.newest = dict(sorted(self.newest.items()))
        self.saved_uid = max(self.saved_uid, buffer[-1][0])
        return (_TAG, dict(self.newest), self.saved_uid, buffer[0][0])
