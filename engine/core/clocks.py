"""A stream's clock under its slack: one for the whole stream (:class:`SlackClock`), or
one per source (:class:`SourceClocks`, ``SLACK d PER SOURCE IDLE i``); the stream's
sequencer (:mod:`engine.core.sequencer`) judges each arrival against it."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from typing import Any

import numpy as np

from engine.core.plan import END_OF_TIME


@dataclass
class SlackClock:
    """One stream's watermark under ``SLACK slack_ms``."""

    slack_ms: int
    max_ts: int | None = None

    @property
    def watermark(self) -> int:
        """Max event time seen so far minus the slack (-END_OF_TIME before any reading)."""
        return -END_OF_TIME if self.max_ts is None else self.max_ts - self.slack_ms

    def judge(
        self, ts: np.ndarray, beat: np.ndarray, sources: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Move the clock over a batch of arrivals: per arrival, what a reading there is
        judged against (the watermark before it), the watermark before and after it."""
        slack = self.slack_ms
        start = -END_OF_TIME + slack if self.max_ts is None else self.max_ts
        running = np.maximum.accumulate(np.concatenate([[start], ts]))
        before, after = running[:-1] - slack, running[1:] - slack
        if len(ts):
            self.max_ts = int(running[-1])
        return before, before, after

    def forget(self) -> None:
        """Nothing to forget: the clock is one number."""


@dataclass
class _Source:
    """One source's clock under ``PER SOURCE``: its max event time, the arrival index it
    was last heard at (None: idle, or never heard), a version that names its current
    entry in :attr:`SourceClocks._heap`, and the rises of its clock credited since it
    last started holding the watermark, as ``[since, cumulative credit]`` groups
    (``since``: the hearing the group's first rise is counted from; a group: credits
    no other source was heard between)."""

    max_ts: int
    heard: int | None = None
    version: int = 0
    credit: int = 0
    groups: deque[list[int]] = field(default_factory=deque)


@dataclass
class SourceClocks:
    """One stream's watermark under ``SLACK slack_ms PER SOURCE IDLE idle_ms``, arrival
    after arrival (docs/engine.md, *Per-source clocks*, states it; the tests' brute
    force is written from it).

    * A source's clock is the max event time of its arrivals minus the slack. An arrival
      is judged against the higher of its source's clock and the stream's watermark
      before it: at or above, it is *heard* (a reading on time), below it is late.
    * A heard arrival credits its source's clock rise (new max minus old) if the source
      was holding before it and the rise is at most ``idle_ms``: a bigger rise is a
      jump, not time passing. The rise took place since the source's previous hearing,
      so it counts against the silence of the sources last heard before that.
    * A source is *holding* once heard, until *idle*: the credits another source made
      of rises since the source was last heard add up to ``idle_ms`` (its own cannot:
      it credits only when heard).
    * The watermark after an arrival is the highest of the watermark before it, the
      lowest clock of the holding sources, and every sourceless heartbeat minus the
      slack.

    Work per arrival is O(log sources): for each source, the latest arrival index its
    credits of rises since then reach ``idle_ms`` (its *back*), of which only the
    highest matters: a source is idle when last heard at or before it (a source's own
    back is always before its last hearing); the holding sources' clocks in a heap with
    stale entries skipped.
    """

    slack_ms: int
    idle_ms: int
    max_ts: int | None = None
    """The max event time of every arrival (health; and the stream's clock if the
    stream becomes one-clock again)."""
    watermark: int = -END_OF_TIME
    arrivals: int = 0
    _sources: dict[str, _Source] = field(default_factory=dict)
    _back: int = -1
    _run_source: str | None = None
    _run_start: int = 0
    _heap: list[tuple[int, int, str]] = field(default_factory=list)

    def judge(
        self, ts: np.ndarray, beat: np.ndarray, sources: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Move the clocks over a batch of arrivals (event times, which are heartbeats,
        their sources): per arrival, what a reading there is judged against, the
        stream's watermark before and after it."""
        n = len(ts)
        threshold = np.empty(n, dtype=np.int64)
        before = np.empty(n, dtype=np.int64)
        after = np.empty(n, dtype=np.int64)
        slack = self.slack_ms
        for i, (t, is_beat, name) in enumerate(
            zip(ts.tolist(), beat.tolist(), sources, strict=True)
        ):
            k = self.arrivals
            self.arrivals += 1
            before[i] = self.watermark
            if self.max_ts is None or t > self.max_ts:
                self.max_ts = t
            if is_beat and not name:
                # A heartbeat without a source speaks for the whole stream.
                threshold[i] = self.watermark
                self.watermark = max(self.watermark, t - slack)
            else:
                threshold[i] = self._arrive(name, t, k)
                low = self._lowest()
                if low is not None and low > self.watermark:
                    self.watermark = low
            after[i] = self.watermark
        return threshold, before, after

    def _holding(self, source: _Source) -> bool:
        return source.heard is not None and source.heard > self._back

    def _arrive(self, name: str, t: int, k: int) -> int:
        """Arrival ``k`` of source ``name`` at event time ``t``: returns what it is judged
        against."""
        source = self._sources.get(name)
        if source is None:
            source = self._sources[name] = _Source(t)
            clock, rise, moved = -END_OF_TIME, 0, True
        else:
            clock, rise = source.max_ts - self.slack_ms, t - source.max_ts
            moved = rise > 0
            if moved:
                source.max_ts = t
        threshold = max(clock, self.watermark)
        holding = self._holding(source)
        if t < threshold:
            if moved:
                source.version += 1
                if holding:
                    heappush(self._heap, (source.max_ts - self.slack_ms, source.version, name))
            return threshold
        if not holding:
            # Holding starts afresh: what it credited before it went idle is spent.
            source.credit = 0
            source.groups.clear()
        elif 0 < rise <= self.idle_ms:
            assert source.heard is not None  # holding
            self._credit(name, source, source.heard, rise)
        source.heard = k
        if self._run_source != name:
            self._run_source, self._run_start = name, k
        source.version += 1
        heappush(self._heap, (source.max_ts - self.slack_ms, source.version, name))
        return threshold

    def _credit(self, name: str, source: _Source, since: int, amount: int) -> None:
        """Credit ``amount``, a rise of the source's clock since its hearing at ``since``:
        it counts against the silence of the sources last heard before ``since``."""
        source.credit += amount
        groups = source.groups
        if groups and self._run_source == name and groups[-1][0] >= self._run_start:
            # No other source was heard since the group began: no source can have been
            # last heard inside it, so one entry tells the same as several.
            groups[-1][1] = source.credit
        else:
            groups.append([since, source.credit])
        reach = source.credit - self.idle_ms
        if reach < 0:
            return
        while groups[0][1] <= reach:
            groups.popleft()
        self._back = max(self._back, groups[0][0] - 1)

    def _lowest(self) -> int | None:
        """The lowest clock of the holding sources (None: none holds)."""
        heap = self._heap
        while heap:
            clock, version, name = heap[0]
            source = self._sources.get(name)
            if source is not None and source.version == version and self._holding(source):
                return clock
            heappop(heap)  # stale, or idle: idle lasts until the source is heard again
        return None

    def forget(self) -> None:
        """Forget what idle sources no longer need: a source whose max event time is at
        or below the watermark, nothing (it comes back as a new one would); one above
        it, its max event time only."""
        for name in list(self._sources):
            source = self._sources[name]
            if self._holding(source):
                continue
            if source.max_ts <= self.watermark:
                del self._sources[name]
            else:
                source.heard, source.credit = None, 0
                source.groups.clear()
        if len(self._heap) > 2 * len(self._sources) + 64:
            self._heap = [
                (s.max_ts - self.slack_ms, s.version, name)
                for name, s in self._sources.items()
                if self._holding(s)
            ]
            heapify(self._heap)

    def holding(self) -> int:
        """How many sources hold the watermark."""
        return sum(self._holding(s) for s in self._sources.values())

    def remembered(self) -> int:
        """How many sources' clocks are kept."""
        return len(self._sources)

    def state(self) -> tuple[Any, ...]:
        """The clocks as plain data."""
        sources = {
            name: (s.max_ts, s.heard, s.credit, np.array(list(s.groups), np.int64).reshape(-1, 2))
            for name, s in self._sources.items()
        }
        return (
            self.idle_ms,
            self.watermark,
            self.arrivals,
            self._back,
            (self._run_source, self._run_start),
            sources,
        )

    @classmethod
    def from_state(
        cls, slack_ms: int, idle_ms: int, max_ts: int | None, saved: tuple[Any, ...] | None
    ) -> SourceClocks:
        """The clocks :meth:`state` describes. ``saved`` None (the stream had one clock):
        no source known, the watermark where the one clock had it. A changed
        ``idle_ms``: every source's silence counts from now."""
        clocks = cls(slack_ms, idle_ms, max_ts)
        if saved is None:
            if max_ts is not None:
                clocks.watermark = max_ts - slack_ms
            return clocks
        old_idle, clocks.watermark, clocks.arrivals, back, run, sources = saved
        for name, (top, heard, credit, groups) in sources.items():
            clocks._sources[name] = _Source(
                int(top), heard, 0, credit, deque([int(a), int(c)] for a, c in groups)
            )
        if old_idle == idle_ms:
            clocks._back = back
            clocks._run_source, clocks._run_start = run
        else:
            for source in clocks._sources.values():
                source.credit = 0
                source.groups.clear()
        clocks._heap = [
            (s.max_ts - slack_ms, s.version, name)
            for name, s in clocks._sources.items()
            if clocks._holding(s)
        ]
        heapify(clocks._heap)
        return clocks
