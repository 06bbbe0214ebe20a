"""What happens to an arriving reading: dedupe, then slack (one implementation).

The live landing job (:mod:`engine.landing`) and ``lookout replay``
(:func:`engine.core.replay.run`) both judge every arriving reading with a
:class:`StreamSequencer`, so replay removes duplicates and sets late readings aside
exactly like the live pipeline (DESIGN §5: replay = live).

* :class:`SlackClock` is THE implementation of the DESIGN §4 slack rule: per stream, a
  reading's watermark is the max event time of the readings that arrived before it
  minus the slack; a reading at or above it is on time, one below it is late.
* :class:`StreamSequencer` adds the (source, seq) dedupe in front of it: a reading
  whose id was already accepted is a :attr:`Verdict.DUPLICATE` (QoS 1 redelivery).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from engine.core.plan import END_OF_TIME

#: How far behind a stream's watermark (in event time) duplicates are still recognised.
DEDUPE_HORIZON_MS = 60 * 60_000


@dataclass
class SlackClock:
    """One stream's watermark under ``SLACK slack_ms`` (DESIGN §4)."""

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


@dataclass
class StreamSequencer:
    """One stream's arrival-order state: its slack clock and the recently seen ids."""

    slack_ms: int
    horizon_ms: int = DEDUPE_HORIZON_MS
    clock: SlackClock = field(init=False)
    _seen: set[tuple[str, int]] = field(default_factory=set, init=False)
    _seen_order: deque[tuple[int, tuple[str, int]]] = field(default_factory=deque, init=False)

    def __post_init__(self) -> None:
        self.clock = SlackClock(self.slack_ms)

    def remember(self, source: str, seq: int, ts: int) -> None:
        """Record an id as seen (also used to rebuild the state after a restart)."""
        ident = (source, seq)
        if ident not in self._seen:
            self._seen.add(ident)
            self._seen_order.append((ts, ident))

    def admit(self, source: str, seq: int, ts: int) -> Verdict:
        """Judge the next arriving reading of this stream."""
        # A duplicate still moves the clock (a no-op when its original did already), so
        # a batch re-run after a restart judges every later reading as the first run did.
        on_time = self.clock.admit(ts)
        if (source, seq) in self._seen:
            return Verdict.DUPLICATE
        self.remember(source, seq, ts)
        return Verdict.ON_TIME if on_time else Verdict.LATE

    def heartbeat(self, ts: int) -> None:
        """A heartbeat moves event time like a reading does."""
        self.clock.admit(ts)

    def forget_old(self) -> None:
        """Drop ids far enough behind the watermark that no redelivery can still come."""
        limit = self.clock.watermark - self.horizon_ms
        # Ids are pruned in arrival order; an old id behind a newer one waits its turn.
        while self._seen_order and self._seen_order[0][0] < limit:
            self._seen.discard(self._seen_order.popleft()[1])
