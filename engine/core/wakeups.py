"""When each key of a stage (or of an alert's incidents) must run again without new
input: :class:`WakeupSchedule`."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

_SLACK = 64
"""Stale heap entries tolerated beyond the live wakeups before the heap is rebuilt."""


class WakeupSchedule(Generic[K]):
    """Each key's next wakeup (the watermark at which time alone may change it), the due
    ones popped in order of time, ties by the key's text (``text``: how the key is
    stored and emitted), so that every run wakes keys in the same order.

    A heap of (time, text, key) entries: rescheduling a key pushes a new entry and
    leaves the old one, skipped when popped. A key rescheduled at every reading (an RFID
    tag's 30-minute timeout) would otherwise leave an entry per reading until its old
    time came; once stale entries pass a quarter of the live ones the heap keeps the
    live ones only (each entry holds the key and its text: 200 bytes an RFID tag)."""

    def __init__(self, text: Callable[[K], str]) -> None:
        self._text = text
        self._heap: list[tuple[int, str, K]] = []
        self._at: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._at)

    def get(self, key: K) -> int | None:
        """The key's wakeup (None: none)."""
        return self._at.get(key)

    @property
    def times(self) -> Mapping[K, int]:
        """Every scheduled key's wakeup (a view: not to be changed)."""
        return self._at

    def set(self, key: K, wakeup: int | None, text: str | None = None) -> None:
        """Wake the key at ``wakeup`` (None: never, unless set again); ``text`` is the
        key's text if the caller has it at hand."""
        if wakeup is None:
            self._at.pop(key, None)
        elif self._at.get(key) != wakeup:
            self._at[key] = wakeup
            heapq.heappush(self._heap, (wakeup, self._text(key) if text is None else text, key))
            if len(self._heap) > len(self._at) + len(self._at) // 4 + _SLACK:
                self._keep_live()

    def discard(self, key: K) -> None:
        """Wake the key no more."""
        self._at.pop(key, None)

    def load(self, scheduled: Iterable[tuple[K, str, int | None]]) -> None:
        """Set many keys' wakeups at once (key, text, wakeup): a restore's, with one
        heapify rather than a push each."""
        at, heap = self._at, self._heap
        for key, text, wakeup in scheduled:
            if wakeup is not None and at.get(key) != wakeup:
                at[key] = wakeup
                heap.append((wakeup, text, key))
        heapq.heapify(heap)

    def due(self, watermark: int) -> list[K]:
        """The keys whose wakeup is at or below ``watermark``, in order, unscheduled."""
        heap, at = self._heap, self._at
        found = []
        while heap and heap[0][0] <= watermark:
            wakeup, _, key = heapq.heappop(heap)
            if at.get(key) == wakeup:
                del at[key]
                found.append(key)
        return found

    def _keep_live(self) -> None:
        """Drop the stale entries (each key's live one stays, with its text)."""
        at = self._at
        self._heap = [e for e in self._heap if at.get(e[2]) == e[0]]
        heapq.heapify(self._heap)
