"""When each key of a stage (or of an alert's incidents) must run again without new
input: :class:`WakeupSchedule`."""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

BUCKET_BITS = 10
"""Wakeups ``2**BUCKET_BITS`` ms apart or less may share a bucket (about a second)."""
_SLACK = 64
"""Stale places tolerated beyond the live wakeups before the buckets are rebuilt."""


class WakeupSchedule(Generic[K]):
    """Each key's next wakeup (the watermark at which time alone may change it), the due
    ones handed out in no particular order: every caller orders them itself.

    Keys wait in buckets of wakeup time (``2**bucket_bits`` ms each: a list of keys),
    the buckets' numbers in a heap. Rescheduling a key adds it to its new bucket and
    leaves it in the old one, where it is skipped (its wakeup is elsewhere); once such
    stale places pass a quarter of the live wakeups, the buckets are rebuilt from the
    live ones. A key so costs its wakeup and a place in a list: an RFID stage holds
    hundreds of thousands of keys, and a heap entry per key with the key's text was
    140 bytes each."""

    def __init__(self, bucket_bits: int = BUCKET_BITS) -> None:
        self._bits = bucket_bits
        self._at: dict[K, int] = {}
        self._buckets: dict[int, list[K]] = {}
        self._heap: list[int] = []  # the buckets' numbers
        self._places = 0  # keys in the buckets, stale ones too

    def __len__(self) -> int:
        return len(self._at)

    def get(self, key: K) -> int | None:
        """The key's wakeup (None: none)."""
        return self._at.get(key)

    @property
    def times(self) -> Mapping[K, int]:
        """Every scheduled key's wakeup (a view: not to be changed)."""
        return self._at

    def set(self, key: K, wakeup: int | None) -> None:
        """Wake the key at ``wakeup`` (None: never, unless set again)."""
        if wakeup is None:
            self._at.pop(key, None)
        elif self._at.get(key) != wakeup:
            self._at[key] = wakeup
            self._place(key, wakeup)
            if self._places > len(self._at) + len(self._at) // 4 + _SLACK:
                self._rebuild()

    def discard(self, key: K) -> None:
        """Wake the key no more."""
        self._at.pop(key, None)

    def load(self, scheduled: Iterable[tuple[K, int | None]]) -> None:
        """Set many keys' wakeups at once (key, wakeup; None: none set): a restore's."""
        for key, wakeup in scheduled:
            if wakeup is not None:
                self.set(key, wakeup)

    def due(self, watermark: int) -> list[K]:
        """The keys whose wakeup is at or below ``watermark``, unscheduled."""
        heap, buckets, at, bits = self._heap, self._buckets, self._at, self._bits
        found: list[K] = []
        while heap and heap[0] << bits <= watermark:
            number = heap[0]
            placed = buckets.pop(number)
            waiting: list[K] = []
            for key in placed:
                wakeup = at.get(key)
                if wakeup is None or wakeup >> bits != number:
                    continue  # stale: woken already, unscheduled or moved
                if wakeup <= watermark:
                    del at[key]
                    found.append(key)
                else:
                    waiting.append(key)
            if waiting:  # the bucket is due in part: the rest wait in it
                waiting = list(dict.fromkeys(waiting))
                buckets[number] = waiting
                self._places -= len(placed) - len(waiting)
                break
            self._places -= len(placed)
            heapq.heappop(heap)
        return found

    def _place(self, key: K, wakeup: int) -> None:
        number = wakeup >> self._bits
        bucket = self._buckets.get(number)
        if bucket is None:
            self._buckets[number] = [key]
            heapq.heappush(self._heap, number)
        else:
            bucket.append(key)
        self._places += 1

    def _rebuild(self) -> None:
        """Drop the stale places: each key's live one stays."""
        self._buckets, self._heap, self._places = {}, [], 0
        for key, wakeup in self._at.items():
            self._place(key, wakeup)
