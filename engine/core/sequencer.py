"""What happens to an arriving reading: dedupe, then slack (one implementation).

The live engine and ``lookout replay`` judge every arriving reading of a source stream
with a :class:`StreamSequencer` (through :class:`engine.core.pipeline.Pipeline`), so
replay removes duplicates and sets late readings aside exactly like the live pipeline.

* :class:`SlackClock` is the one implementation of the slack rule: per stream, a
  reading's watermark is the max event time of the readings (and heartbeats) that
  arrived before it, minus the slack; a reading at or above it is on time, one below it
  is late.
* :class:`StreamSequencer` adds identity in front of it. A reading's id is
  ``(source, epoch, seq)``: ``epoch`` names one run of its source (a boot, a restart of
  a gateway or simulator; empty when the source does not say), so a source that starts
  its ``seq`` again under a new epoch sends new readings. A repeated id is a
  :attr:`Verdict.DUPLICATE` when it carries the same content as the reading first seen
  with it (a QoS 1 redelivery: dropped and counted), and a :attr:`Verdict.CONFLICT`
  when its content differs or the first one is too far back to compare: never
  dropped, the runtime stores it with the reason.

Memory stays bounded however long a stream runs: the ids seen are kept per
``(source, epoch)`` as ranges of seqs (a source counting up is one range), forgotten
``horizon_ms`` of event time behind the watermark, and the content of the latest
``recent_ids`` readings is kept to tell a redelivery from a conflict.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import orjson

from engine.core.plan import END_OF_TIME

#: How far behind a stream's watermark (in event time) a repeated id is still recognised.
DEDUPE_HORIZON_MS = 60 * 60_000
#: How many of the latest readings' contents are kept to tell redeliveries from conflicts.
RECENT_IDS = 200_000

Ident = tuple[str, str, int]
"""A reading's identity: (source, epoch, seq)."""


def content_hash(values: Iterable[Any]) -> int:
    """A 64-bit digest of a reading's values (its declared columns, in order): equal
    readings give equal digests in every process (unlike ``hash``)."""
    digest = hashlib.blake2b(orjson.dumps(list(values)), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass
class SlackClock:
    """One stream's watermark under ``SLACK slack_ms``."""

    slack_ms: int
    max_ts: int | None = None

    @property
    def watermark(self) -> int:
        """Max event time seen so far minus the slack (-END_OF_TIME before any reading)."""
        return -END_OF_TIME if self.max_ts is None else self.max_ts - self.slack_ms

    def admit(self, ts: int) -> bool:
        """Judge the next arriving reading: True if on time (``ts >= watermark``), False if
        late. Either way it has arrived, so it counts toward later readings' watermark."""
        on_time = ts >= self.watermark
        if self.max_ts is None or ts > self.max_ts:
            self.max_ts = ts
        return on_time


class Verdict(Enum):
    """What happens to one arriving reading."""

    ON_TIME = "on_time"
    LATE = "late"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


@dataclass
class _Ranges:
    """One (source, epoch)'s seen seqs: sorted disjoint ``[lo, hi]`` ranges, each with
    the newest event time among its readings (what the horizon forgets by)."""

    lo: list[int] = field(default_factory=list)
    hi: list[int] = field(default_factory=list)
    newest: list[int] = field(default_factory=list)

    def __contains__(self, seq: int) -> bool:
        i = bisect.bisect_right(self.lo, seq) - 1
        return i >= 0 and seq <= self.hi[i]

    def add(self, seq: int, ts: int) -> None:
        """Record ``seq`` (not yet present), merging it with the ranges it touches."""
        lo, hi, newest = self.lo, self.hi, self.newest
        if lo and hi[-1] + 1 == seq:  # the usual case: the next seq of a counting source
            hi[-1] = seq
            newest[-1] = max(newest[-1], ts)
            return
        i = bisect.bisect_right(lo, seq)  # ranges before i start at or below seq
        joins_left = i > 0 and hi[i - 1] + 1 == seq
        joins_right = i < len(lo) and lo[i] - 1 == seq
        if joins_left and joins_right:
            hi[i - 1] = hi[i]
            newest[i - 1] = max(newest[i - 1], newest[i], ts)
            del lo[i], hi[i], newest[i]
        elif joins_left:
            hi[i - 1] = seq
            newest[i - 1] = max(newest[i - 1], ts)
        elif joins_right:
            lo[i] = seq
            newest[i] = max(newest[i], ts)
        else:
            lo.insert(i, seq)
            hi.insert(i, seq)
            newest.insert(i, ts)

    def forget_before(self, limit: int) -> None:
        """Drop the ranges whose newest event time is below ``limit``."""
        keep = [i for i, ts in enumerate(self.newest) if ts >= limit]
        if len(keep) != len(self.lo):
            self.lo = [self.lo[i] for i in keep]
            self.hi = [self.hi[i] for i in keep]
            self.newest = [self.newest[i] for i in keep]


@dataclass
class StreamSequencer:
    """One stream's arrival-order state: its slack clock and the ids seen."""

    slack_ms: int
    horizon_ms: int = DEDUPE_HORIZON_MS
    recent_ids: int = RECENT_IDS
    clock: SlackClock = field(init=False)
    _seen: dict[tuple[str, str], _Ranges] = field(default_factory=dict, init=False)
    # The latest readings' contents (id -> (content digest, ts)), in segments of arrival
    # order (one per `seal`), which a runtime stores once each and forgets whole.
    _recent: dict[Ident, tuple[int, int]] = field(default_factory=dict, init=False)
    _segments: deque[tuple[int, list[Ident]]] = field(default_factory=deque, init=False)
    _open: list[Ident] = field(default_factory=list, init=False)
    _next_segment: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.clock = SlackClock(self.slack_ms)

    def seen(self, source: str, seq: int, epoch: str = "") -> bool:
        """Whether the id was seen (within the horizon)."""
        ranges = self._seen.get((source, epoch))
        return ranges is not None and seq in ranges

    def original(self, source: str, seq: int, epoch: str = "") -> tuple[int, int] | None:
        """(content digest, ts) of the reading first seen with this id, if still kept."""
        return self._recent.get((source, epoch, seq))

    def remember(
        self, source: str, seq: int, ts: int, epoch: str = "", content: int | None = None
    ) -> None:
        """Record an id as seen, with its content digest when given."""
        ranges = self._seen.get((source, epoch))
        if ranges is None:
            ranges = self._seen[(source, epoch)] = _Ranges()
        ranges.add(seq, ts)
        if content is not None:
            ident = (source, epoch, seq)
            self._recent[ident] = (content, ts)
            self._open.append(ident)

    def admit(
        self, source: str, seq: int, ts: int, epoch: str = "", content: int | None = None
    ) -> Verdict:
        """Judge the next arriving reading of this stream. ``content`` is its
        :func:`content_hash`; without one a repeated id is taken for a redelivery."""
        # A repeated id still moves the clock (a no-op when its original did already), so
        # a batch re-run after a restart judges every later reading as the first run did.
        on_time = self.clock.admit(ts)
        if self.seen(source, seq, epoch):
            if content is None:
                return Verdict.DUPLICATE
            first = self.original(source, seq, epoch)
            return (
                Verdict.DUPLICATE
                if first is not None and first[0] == content
                else (Verdict.CONFLICT)
            )
        self.remember(source, seq, ts, epoch, content)
        return Verdict.ON_TIME if on_time else Verdict.LATE

    def heartbeat(self, ts: int) -> None:
        """A heartbeat moves event time like a reading does."""
        self.clock.admit(ts)

    def forget_old(self) -> None:
        """Forget ids far enough behind the watermark that no redelivery can still come."""
        limit = self.clock.watermark - self.horizon_ms
        for key in list(self._seen):
            ranges = self._seen[key]
            ranges.forget_before(limit)
            if not ranges.lo:
                del self._seen[key]

    def sources(self) -> int:
        """How many (source, epoch) pairs are remembered."""
        return len(self._seen)

    def seal(self) -> tuple[tuple[int, list[tuple[Any, ...]]] | None, list[int]]:
        """Close the segment of contents remembered since the last seal: returns it
        (number, [(source, epoch, seq, content, ts), ...]), None if empty, and the
        numbers of the oldest segments forgotten to keep ``recent_ids``."""
        sealed = None
        if self._open:
            number, self._next_segment = self._next_segment, self._next_segment + 1
            self._segments.append((number, self._open))
            sealed = (number, [(*i, *self._recent[i]) for i in self._open])
            self._open = []
        dropped = []
        held = sum(len(idents) for _, idents in self._segments)
        while len(self._segments) > 1 and held > self.recent_ids:
            number, idents = self._segments.popleft()
            held -= len(idents)
            for ident in idents:
                self._recent.pop(ident, None)
            dropped.append(number)
        return sealed, dropped

    def state(self) -> tuple[Any, ...]:
        """The clock and the ids seen, as plain data (the contents go by :meth:`seal`)."""
        seen = {key: (r.lo, r.hi, r.newest) for key, r in self._seen.items()}
        return (self.clock.max_ts, seen, self._next_segment)

    @classmethod
    def from_state(
        cls,
        slack_ms: int,
        state: tuple[Any, ...],
        segments: Iterable[tuple[int, list[tuple[Any, ...]]]] = (),
        horizon_ms: int = DEDUPE_HORIZON_MS,
    ) -> StreamSequencer:
        """The sequencer :meth:`state` and the sealed ``segments`` still kept describe."""
        max_ts, seen, next_segment = state
        sequencer = cls(slack_ms, horizon_ms)
        sequencer.clock.max_ts = max_ts
        sequencer._next_segment = next_segment
        for key, (lo, hi, newest) in seen.items():
            sequencer._seen[key] = _Ranges(list(lo), list(hi), list(newest))
        for number, entries in sorted(segments, key=lambda s: s[0]):
            idents: list[Ident] = []
            for source, epoch, seq, content, ts in entries:
                sequencer._recent[(source, epoch, seq)] = (content, ts)
                idents.append((source, epoch, seq))
            sequencer._segments.append((number, idents))
        return sequencer


def sort_key(value: Hashable) -> str:
    """A total, deterministic order over key values that may mix types and NULLs."""
    return repr(value)
