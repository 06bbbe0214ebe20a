"""What happens to an arriving reading: identity, then slack (one implementation).

The live engine and ``lookout replay`` judge every arriving reading of a source stream
with a :class:`StreamSequencer` (through :class:`engine.core.pipeline.Pipeline`), a
batch of arrivals at a time, so replay removes duplicates and sets late readings aside
exactly like the live pipeline.

* **Slack** (:class:`SlackClock`): per stream, a reading's watermark is the max event
  time of the readings (and heartbeats) that arrived before it, minus the slack; a
  reading at or above it is on time, one below it is late.
* **Slack per source** (:class:`SourceClocks`, ``SLACK d PER SOURCE IDLE i``): each
  source has its own clock and a reading is judged against its source's; the stream's
  watermark is the lowest clock of the sources not idle, idleness measured in the other
  sources' event time (docs/engine.md, *Per-source clocks*).
* **Identity**: a reading's id is ``(source, epoch, seq)``; ``epoch`` names one run of
  its source (a boot, a restart of a gateway or simulator; empty when the source does
  not say), so a source that starts its ``seq`` again under a new epoch sends new
  readings. A repeated id is a :attr:`Verdict.DUPLICATE` when it carries the same values
  as the reading first seen with it (a QoS 1 redelivery: dropped and counted), and a
  :attr:`Verdict.CONFLICT` when its values differ or the first one is too far back to
  compare: never dropped, the runtime stores it with the reason. A repeated id still
  moves the clock, so a batch judged again after a restart is judged as the first time.

Memory stays bounded however long a stream runs: the ids seen are kept per
``(source, epoch)`` as ranges of seqs (a source counting up is one range), forgotten
``horizon_ms`` of event time behind the watermark; the values of the latest
``recent_ids`` readings are kept as 64-bit digests (:func:`content_hashes`) under a
64-bit digest of their id, in segments a runtime stores once each and forgets whole.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.core.clocks import SlackClock, SourceClocks
from engine.core.columnar.ops import stable_argsort

#: How far behind a stream's watermark (in event time) a repeated id is still recognised.
DEDUPE_HORIZON_MS = 60 * 60_000
#: How many of the latest readings' values are kept to tell redeliveries from conflicts.
RECENT_IDS = 200_000


def content_hashes(values: pa.Table) -> np.ndarray:
    """A 64-bit digest of each row's values (a reading's declared columns), the same in
    every process and whatever Arrow types carry them (int32 or int64, with or without
    NULLs elsewhere in the batch)."""
    digest = np.full(values.num_rows, 0x9E3779B97F4A7C15, dtype=np.uint64)
    for column in values.columns:
        kind = column.type
        if pa.types.is_integer(kind) or pa.types.is_boolean(kind) or pa.types.is_timestamp(kind):
            hashed = _number_hashes(column, pa.int64())
        elif pa.types.is_floating(kind):
            hashed = _number_hashes(column, pa.float64())
        else:
            hashed = _text_hashes(column)
        if column.null_count:
            nulls = np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
            hashed ^= nulls.astype(np.uint64) * np.uint64(0x632BE59BD9B4E019)
        digest ^= hashed
        _mix_in_place(digest)
    return digest


def _number_hashes(column: pa.ChunkedArray, kind: pa.DataType) -> np.ndarray:
    """Each row's number as ``kind`` (NULL as 0) hashed as pandas' ``hash_array`` hashes
    64-bit numbers (splitmix64's finaliser of their bits): the digests saved state holds."""
    if column.type != kind:
        column = pc.cast(column, kind)
    if column.null_count:
        column = pc.fill_null(column, 0)
    bits = np.array(column.to_numpy(), dtype=kind.to_pandas_dtype()).view(np.uint64)
    _mix_in_place(bits)
    return bits


def _text_hashes(column: pa.ChunkedArray) -> np.ndarray:
    """Each row's hash of its value as text (NULL as ""): each distinct value of a
    chunk hashed once (a door, a name), then spread over its rows; the same hashes as
    hashing every row's text."""
    # Imported here: a process that never hashes text (Spark's planning runners, which
    # load the engine's modules to plan a batch) does not pay pandas' 0.3 s import.
    import pandas as pd

    text = pc.fill_null(pc.cast(column, pa.string()), "")
    parts = [np.zeros(0, dtype=np.uint64)]
    for chunk in text.chunks:
        encoded = pc.dictionary_encode(chunk)
        words = np.asarray(encoded.dictionary.to_pylist(), dtype=object)
        # Not categorized: pandas' factorizing takes "a\x00b" for "a" (C strings), so a
        # value's hash would depend on the values beside it; each is distinct already.
        hashed = pd.util.hash_array(words, categorize=False)
        parts.append(hashed[encoded.indices.to_numpy(zero_copy_only=False)])
    return np.concatenate(parts)


def _mix_in_place(x: np.ndarray) -> None:
    """splitmix64's finaliser of each of ``x``, in place (no new array per step): every
    input bit moves every output bit."""
    step = np.right_shift(x, np.uint64(30))
    x ^= step
    x *= np.uint64(0xBF58476D1CE4E5B9)
    np.right_shift(x, np.uint64(27), out=step)
    x ^= step
    x *= np.uint64(0x94D049BB133111EB)
    np.right_shift(x, np.uint64(31), out=step)
    x ^= step


def _source_hash(source: str, epoch: str) -> int:
    digest = hashlib.blake2b(f"{source}\x1f{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def id_hashes(source_hash: int, seqs: np.ndarray) -> np.ndarray:
    """64-bit digests of the ids (source, epoch, seq) of one (source, epoch): its own
    digest mixed with each seq."""
    ids = seqs.astype(np.int64).view(np.uint64) ^ np.uint64(source_hash)
    _mix_in_place(ids)
    return ids


class Verdict(IntEnum):
    """What happens to one arriving line."""

    ON_TIME = 0
    LATE = 1
    DUPLICATE = 2
    CONFLICT = 3
    HEARTBEAT = 4


@dataclass
class Judgement:
    """A batch of arrivals judged, per line in arrival order: the verdict, the stream's
    watermark before it and after it (its ``arrival_watermark``), what it was judged
    against (the watermark before it; per source, the higher of that and its source's
    clock), and for a conflict the event time of the first reading with its id (-1: not
    kept)."""

    verdicts: np.ndarray
    before: np.ndarray
    after: np.ndarray
    original_ts: np.ndarray
    threshold: np.ndarray


@dataclass
class _Ranges:
    """One (source, epoch)'s seen seqs: sorted disjoint ``[lo, hi]`` ranges, each with
    the newest event time among its readings (what the horizon forgets by)."""

    lo: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    hi: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    newest: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def contains(self, seqs: np.ndarray) -> np.ndarray:
        at = np.searchsorted(self.lo, seqs, "right") - 1
        inside = at >= 0
        inside[inside] = seqs[inside] <= self.hi[at[inside]]
        return inside

    def add(self, seqs: np.ndarray, ts: np.ndarray) -> None:
        """Record ``seqs`` (distinct, none present yet) seen at times ``ts``, merging
        ranges. In any order: each run of consecutive seqs is a range, and the ranges are
        sorted and merged."""
        starts = np.flatnonzero(np.concatenate([[True], np.diff(seqs) != 1]))
        lo = np.concatenate([self.lo, seqs[starts]])
        hi = np.concatenate([self.hi, seqs[np.concatenate([starts[1:], [len(seqs)]]) - 1]])
        newest = np.concatenate([self.newest, np.maximum.reduceat(ts, starts)])
        order = stable_argsort(lo)
        lo, hi, newest = lo[order], hi[order], newest[order]
        # A range starts anew where it does not touch every range before it.
        reach = np.maximum.accumulate(hi)
        first = np.flatnonzero(np.concatenate([[True], lo[1:] > reach[:-1] + 1]))
        self.lo = lo[first]
        self.hi = np.maximum.reduceat(hi, first)
        self.newest = np.maximum.reduceat(newest, first)

    def forget_before(self, limit: int) -> None:
        keep = self.newest >= limit
        if not keep.all():
            self.lo, self.hi, self.newest = self.lo[keep], self.hi[keep], self.newest[keep]


@dataclass
class _Segment:
    """Values of readings judged together: id digests (sorted, for lookups), value
    digests and event times."""

    number: int
    ids: np.ndarray
    contents: np.ndarray
    ts: np.ndarray

    @staticmethod
    def of(number: int, ids: np.ndarray, contents: np.ndarray, ts: np.ndarray) -> _Segment:
        # A segment's ids are distinct (``id_hashes`` is a bijection of the seq; two
        # (source, epoch)s meet only by a 64-bit collision), so the sort need not be
        # stable: numpy's quicksort is four times as fast.
        order = np.argsort(ids)
        return _Segment(number, ids[order], contents[order], ts[order])

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found, value digest, event time) of each id."""
        at = np.minimum(np.searchsorted(self.ids, ids), max(len(self.ids) - 1, 0))
        found = (self.ids[at] == ids) if len(self.ids) else np.zeros(len(ids), dtype=bool)
        return (
            found,
            self.contents[at] if len(self.ids) else ids,
            self.ts[at] if len(self.ids) else ids,
        )


def _id_groups(
    sources: Sequence[str] | pa.Array | pa.ChunkedArray,
    epochs: Sequence[str] | pa.Array | pa.ChunkedArray,
    readings: np.ndarray,
) -> list[tuple[tuple[str, str], np.ndarray]]:
    """The arrivals ``readings`` grouped by (source, epoch): each group's key and its
    arrivals in arrival order, groups in order of their first arrival."""
    if isinstance(sources, Sequence) or isinstance(epochs, Sequence):
        groups: dict[tuple[str, str], list[int]] = {}
        for position in readings.tolist():
            groups.setdefault((sources[position], epochs[position]), []).append(position)
        return [(key, np.array(found, dtype=np.int64)) for key, found in groups.items()]
    # Arrow arrays: each (source, epoch) as a number from the two columns' dictionaries.
    names, codes = [], []
    for column in (sources, epochs):
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        encoded = pc.dictionary_encode(column)
        names.append(encoded.dictionary.to_pylist())
        codes.append(np.asarray(encoded.indices.to_numpy(), dtype=np.int64)[readings])
    width = max(len(names[1]), 1)
    code = codes[0] * width + codes[1]
    order = stable_argsort(code)  # arrival order within a group
    ordered = code[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    ends = np.concatenate([starts[1:], [len(ordered)]])
    found = [readings[order[a:b]] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
    keys = [(names[0][c // width], names[1][c % width]) for c in ordered[starts].tolist()]
    first = [int(f[0]) for f in found]
    return [(keys[i], found[i]) for i in sorted(range(len(found)), key=first.__getitem__)]


@dataclass
class StreamSequencer:
    """One stream's arrival-order state: its clock (one for the stream, or one per
    source with ``source_idle_ms``) and the ids seen."""

    slack_ms: int
    horizon_ms: int = DEDUPE_HORIZON_MS
    recent_ids: int = RECENT_IDS
    source_idle_ms: int | None = None
    clock: SlackClock | SourceClocks = field(init=False)
    _seen: dict[tuple[str, str], _Ranges] = field(default_factory=dict, init=False)
    _sources: dict[tuple[str, str], int] = field(default_factory=dict, init=False)
    _segments: list[_Segment] = field(default_factory=list, init=False)
    _held: int = field(default=0, init=False)  # the segments' readings, all told
    # Each remembered reading's values since the last seal, and its place in the arrivals
    # this sequencer judged (``_arrived`` so far): which are the latest.
    _open: list[tuple[np.ndarray, ...]] = field(default_factory=list, init=False)
    _arrived: int = field(default=0, init=False)
    _next_segment: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.source_idle_ms is None:
            self.clock = SlackClock(self.slack_ms)
        else:
            self.clock = SourceClocks(self.slack_ms, self.source_idle_ms)

    def judge(
        self,
        ts: np.ndarray,
        beat: np.ndarray,
        sources: Sequence[str] | pa.Array | pa.ChunkedArray,
        epochs: Sequence[str] | pa.Array | pa.ChunkedArray,
        seqs: np.ndarray,
        contents: np.ndarray,
    ) -> Judgement:
        """Judge a batch of arrivals in arrival order: event times, which are heartbeats,
        and each reading's id and value digest (a heartbeat's are ignored). ``sources``
        and ``epochs`` are strings, as Python sequences or Arrow arrays without NULLs."""
        n = len(ts)
        if isinstance(self.clock, SourceClocks) and not isinstance(sources, Sequence):
            sources = sources.to_pylist()
        threshold, before, after = self.clock.judge(ts, beat, sources)
        verdicts = np.full(n, Verdict.HEARTBEAT, dtype=np.int8)
        original_ts = np.full(n, -1, dtype=np.int64)
        readings = np.flatnonzero(~beat)
        if len(readings):
            on_time = ts[readings] >= threshold[readings]
            verdicts[readings] = np.where(on_time, Verdict.ON_TIME, Verdict.LATE)
            for key, positions in _id_groups(sources, epochs, readings):
                self._judge_ids(key, positions, ts, seqs, contents, verdicts, original_ts)
        self._arrived += n
        return Judgement(verdicts, before, after, original_ts, threshold)

    def _judge_ids(
        self,
        key: tuple[str, str],
        at: np.ndarray,
        ts: np.ndarray,
        seqs: np.ndarray,
        contents: np.ndarray,
        verdicts: np.ndarray,
        original_ts: np.ndarray,
    ) -> None:
        """The identity part for one (source, epoch)'s readings ``at`` (arrival order)."""
        mine = seqs[at]
        ranges = self._seen.get(key)
        seen = ranges.contains(mine) if ranges is not None else np.zeros(len(at), dtype=bool)
        order = stable_argsort(mine)  # equal seqs keep their arrival order
        sorted_seqs = mine[order]
        first_sorted = np.concatenate([[True], sorted_seqs[1:] != sorted_seqs[:-1]])
        first = np.zeros(len(at), dtype=bool)
        first[order[first_sorted]] = True
        new = first & ~seen
        source_hash = self._sources.get(key)
        if source_hash is None:
            source_hash = self._sources[key] = _source_hash(*key)
        ids = id_hashes(source_hash, mine)
        repeats = np.flatnonzero(~new)
        if len(repeats):
            # The reading first seen with each repeated id: earlier in this batch...
            leader = np.empty(len(at), dtype=np.int64)
            leader[order] = order[
                np.maximum.accumulate(np.where(first_sorted, np.arange(len(at)), 0))
            ]
            known = np.zeros(len(repeats), dtype=bool)
            first_content = np.zeros(len(repeats), dtype=np.uint64)
            first_ts = np.full(len(repeats), -1, dtype=np.int64)
            in_batch = ~seen[repeats]
            lead = leader[repeats[in_batch]]
            known[in_batch] = True
            first_content[in_batch] = contents[at[lead]]
            first_ts[in_batch] = ts[at[lead]]
            # ... or in a kept segment of an earlier one.
            for segment in self._segments:
                look = np.flatnonzero(~known)
                if not len(look):
                    break
                found, content, when = segment.find(ids[repeats[look]])
                hit = look[found]
                known[hit] = True
                first_content[hit] = content[found]
                first_ts[hit] = when[found]
            same = known & (first_content == contents[at[repeats]])
            verdicts[at[repeats]] = np.where(same, Verdict.DUPLICATE, Verdict.CONFLICT)
            original_ts[at[repeats]] = first_ts
        fresh = at[new]
        if len(fresh):
            if ranges is None:
                ranges = self._seen[key] = _Ranges()
            ranges.add(mine[new], ts[fresh])
            self._open.append((ids[new], contents[fresh], ts[fresh], fresh + self._arrived))

    def forget_old(self) -> None:
        """Forget ids far enough behind the watermark that no redelivery can still come,
        and what idle sources' clocks no longer need."""
        self.clock.forget()
        limit = self.clock.watermark - self.horizon_ms
        for key in list(self._seen):
            ranges = self._seen[key]
            ranges.forget_before(limit)
            if not len(ranges.lo):
                del self._seen[key]
                self._sources.pop(key, None)

    def sources(self) -> int:
        """How many (source, epoch) pairs are remembered."""
        return len(self._seen)

    # -- state -------------------------------------------------------------------------------
    def seal(self) -> tuple[tuple[int, Any] | None, list[int]]:
        """Close the segment of values remembered since the last seal (of its latest
        ``recent_ids`` readings): returns it (number, arrays), None if empty, and the
        numbers of the oldest segments forgotten to keep at most ``recent_ids``."""
        sealed = None
        if self._open:
            ids, contents, ts, arrived = (
                np.concatenate(parts) for parts in zip(*self._open, strict=True)
            )
            self._open = []
            if len(ids) > self.recent_ids:
                # Values of the latest ``recent_ids`` readings at most are kept: a
                # backlog's batch of a million would otherwise store 24 MB of them.
                latest = np.argsort(arrived)[len(ids) - self.recent_ids :]
                ids, contents, ts = ids[latest], contents[latest], ts[latest]
            if len(ids):
                number, self._next_segment = self._next_segment, self._next_segment + 1
                segment = _Segment.of(number, ids, contents, ts)
                self._segments.insert(0, segment)  # newest first: a redelivery is recent
                self._held += len(segment.ids)
                sealed = (number, (segment.ids, segment.contents, segment.ts))
        dropped = []
        while len(self._segments) > 1 and self._held > self.recent_ids:
            oldest = self._segments.pop()
            self._held -= len(oldest.ids)
            dropped.append(oldest.number)
        return sealed, dropped

    def state(self) -> tuple[Any, ...]:
        """The clock and the ids seen, as plain data (the values go by :meth:`seal`)."""
        seen = {key: (r.lo, r.hi, r.newest) for key, r in self._seen.items()}
        if isinstance(self.clock, SourceClocks):
            # A fourth item, so that a one-clock stream's state reads as it always did.
            return (self.clock.max_ts, seen, self._next_segment, self.clock.state())
        return (self.clock.max_ts, seen, self._next_segment)

    @classmethod
    def from_state(
        cls,
        slack_ms: int,
        state: tuple[Any, ...],
        segments: Iterable[tuple[int, Any]] = (),
        horizon_ms: int = DEDUPE_HORIZON_MS,
        source_idle_ms: int | None = None,
    ) -> StreamSequencer:
        """The sequencer :meth:`state` and the sealed ``segments`` still kept describe,
        with the clock the stream declares now: a stream that changed between one clock
        and per-source clocks keeps its watermark (one clock resumes at the max event time
        seen minus the slack, which is never below it)."""
        max_ts, seen, next_segment, *clocks = state
        sequencer = cls(slack_ms, horizon_ms, source_idle_ms=source_idle_ms)
        if source_idle_ms is None:
            sequencer.clock.max_ts = max_ts
        else:
            sequencer.clock = SourceClocks.from_state(
                slack_ms, source_idle_ms, max_ts, clocks[0] if clocks else None
            )
        sequencer._next_segment = next_segment
        for key, (lo, hi, newest) in seen.items():
            sequencer._seen[key] = _Ranges(lo, hi, newest)
        for number, (ids, contents, ts) in sorted(segments, key=lambda s: -s[0]):
            sequencer._segments.append(_Segment(number, ids, contents, ts))
            sequencer._held += len(ids)
        return sequencer


def sort_key(value: Any) -> str:
    """A total, deterministic order over key values that may mix types and NULLs."""
    return repr(value)
