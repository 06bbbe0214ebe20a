"""The rules over one part of the stream graph, batch after batch (pure; no Spark).

A :class:`Pipeline` runs every stage fed, directly or through derived streams, by a
set of source streams: it judges each stream's arrivals with its
:class:`~engine.core.sequencer.StreamSequencer` (duplicates, conflicts, slack), feeds
the on-time readings to the stages reading the stream, advances the stages to their
input's watermark in dependency order, and hands each derived row at once to the
stages that read it. ``lookout replay`` and the live engine both run it, so they give
the same rows by construction; the live engine runs one pipeline per connected part of
the graph (:func:`components`) inside one Spark stateful step.

**Time.** A source stream's watermark is its slack clock after the batch; a derived
stream's is the lowest of its producing stages' watermarks (a UNION ALL waits for its
slowest branch). Advancing never depends on how arrivals were cut into batches
(snapshot-equivalence), so any batching gives the same rows.

**Work per batch** is proportional to what the batch touches: an evaluator is advanced
when it received rows or its :meth:`~engine.core.evaluator.KeyedEvaluator.next_wakeup`
is due, found in a per-stage heap of wakeups; idle keys cost nothing.

**State.** With a :class:`~engine.core.state.StateStore`, :meth:`Pipeline.save` writes
what changed since the last save: each touched evaluator's head and window chunks, each
sequencer's clock and ids, the contents of the readings just judged. A pipeline built
on a store with state resumes it; an evaluator whose rule was edited or removed since
(:attr:`~engine.core.plan.Query.definition`) is dropped with its chunks, and said so in
:attr:`Pipeline.dropped`.
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from engine.core.evaluator import KeyedEvaluator, Output, OutputColumns
from engine.core.plan import END_OF_TIME, ColumnType, Plan, Stage, StreamSchema
from engine.core.sequencer import StreamSequencer, Verdict, content_hash
from engine.core.state import StateKey, StateStore

Row = dict[str, Any]
Key = tuple[Any, ...]

HEARTBEAT = "heartbeat"
"""The column that marks a heartbeat among a stream's arrivals (true: only its
timestamp counts)."""
ARRIVAL_WATERMARK = "arrival_watermark"
"""The column :attr:`BatchResult.readings` adds: the stream's watermark once the reading
had arrived (epoch ms)."""

_PICKLE = pickle.HIGHEST_PROTOCOL


def arrival_type(column_type: ColumnType) -> pa.DataType:
    """The Arrow type of a column in the arrivals :meth:`Pipeline.process` takes:
    timestamps as epoch ms (int64)."""
    return pa.int64() if column_type == ColumnType.TIMESTAMP else ARROW_TYPES[column_type]


ARROW_TYPES: dict[ColumnType, pa.DataType] = {
    ColumnType.INT: pa.int32(),
    ColumnType.BIGINT: pa.int64(),
    ColumnType.DOUBLE: pa.float64(),
    ColumnType.STRING: pa.string(),
    ColumnType.BOOLEAN: pa.bool_(),
    ColumnType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
}
"""The Arrow type of each column type as tables store it (timestamps in microseconds,
which Spark and Delta read as TIMESTAMP)."""


def key_json(key: Key) -> str:
    """An evaluator's key as stored: a JSON array of its values."""
    return orjson.dumps(list(key)).decode()


@dataclass(frozen=True)
class LateReading:
    """A reading below its stream's watermark: the reading, its stream and how late."""

    stream: str
    row: Row
    ts: int
    watermark: int

    @property
    def lateness_ms(self) -> int:
        """How far below the watermark the reading was."""
        return self.watermark - self.ts


@dataclass(frozen=True)
class Conflict:
    """A reading whose id (source, epoch, seq) was seen before with other content (or
    with content no longer kept to compare): stored apart, never taken for a copy."""

    stream: str
    row: Row
    ts: int
    reason: str
    original_ts: int | None


@dataclass(frozen=True)
class Emitted:
    """One output of a stage's evaluator: which stage (its index in plan order), which
    key, and the output itself."""

    stage: int
    key: Key
    output: Output | OutputColumns


@dataclass
class BatchResult:
    """What one batch produced, everything deterministic."""

    readings: dict[str, pa.Table] = field(default_factory=dict)
    late: list[LateReading] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    heartbeats: dict[str, int] = field(default_factory=dict)
    outputs: list[Emitted] = field(default_factory=list)
    watermarks: dict[str, int] = field(default_factory=dict)
    """Each source stream's watermark after the batch."""


def components(plan: Plan) -> list[tuple[str, ...]]:
    """The source streams of each connected part of ``plan``'s stream graph (streams
    joined by a stage reading one and writing the other), sorted; a source no stage
    reads is a part of its own."""
    parent: dict[str, str] = {name: name for name in plan.streams}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for stage in plan.stages():
        for query in (stage.query, *stage.downstream):
            parent[find(query.sink.name)] = find(stage.input)
    groups: dict[str, list[str]] = {}
    for source in plan.sources():
        groups.setdefault(find(source.name), []).append(source.name)
    return sorted(tuple(sorted(names)) for names in groups.values())


def _sinks(stage: Stage) -> list[str]:
    return [q.sink.name for q in (stage.query, *stage.downstream)]


def dependency_order(stages: Iterable[tuple[int, Stage]]) -> list[tuple[int, Stage]]:
    """``stages`` (with their plan indexes) so that every stage comes after the stages
    writing the stream it reads; ties in plan order."""
    pending = sorted(stages, key=lambda item: item[0])
    writers: dict[str, set[int]] = {}
    for i, stage in pending:
        for sink in _sinks(stage):
            writers.setdefault(sink, set()).add(i)
    done: set[int] = set()
    ordered: list[tuple[int, Stage]] = []
    while pending:
        ready = [(i, s) for i, s in pending if writers.get(s.input, set()) <= done | {i}]
        if not ready:
            raise ValueError("the stages' streams form a cycle")
        i, stage = ready[0]
        ordered.append((i, stage))
        done.add(i)
        pending.remove((i, stage))
    return ordered


def fed_stages(plan: Plan, sources: Collection[str]) -> list[tuple[int, Stage]]:
    """The stages fed by ``sources``, directly or through derived streams, with their
    plan indexes, in dependency order."""
    fed = set(sources)
    mine: list[tuple[int, Stage]] = []
    for i, stage in dependency_order(enumerate(plan.stages())):
        if stage.input in fed:
            mine.append((i, stage))
            fed.update(_sinks(stage))
    return mine


class Pipeline:
    """Every stage fed by ``sources`` (all source streams of ``plan`` by default), on a
    state store (none: state lives as long as the object)."""

    def __init__(
        self,
        plan: Plan,
        sources: Collection[str] | None = None,
        store: StateStore | None = None,
    ) -> None:
        self.plan = plan
        self.sources: dict[str, StreamSchema] = {
            s.name: s for s in plan.sources() if sources is None or s.name in sources
        }
        for name, schema in self.sources.items():
            if schema.timestamp is None:
                raise ValueError(f"source stream {name!r} has no timestamp column")
        mine = fed_stages(plan, self.sources)
        self.stages = mine
        self._by_index = dict(mine)
        self._readers: dict[str, list[int]] = {}
        for i, stage in mine:
            self._readers.setdefault(stage.input, []).append(i)
        self.store = store
        self.sequencers = {name: StreamSequencer(s.slack_ms) for name, s in self.sources.items()}
        self.evaluators: dict[int, dict[Key, KeyedEvaluator]] = {i: {} for i, _ in mine}
        # Evaluators in the store not loaded yet: (stage, key) -> (head, its wakeup).
        self._stored: dict[int, dict[Key, bytes]] = {i: {} for i, _ in mine}
        # Per stage, a heap of (wakeup, key JSON, key); the current wakeup of each key
        # decides which entries still count (entries go stale as wakeups move).
        self._heaps: dict[int, list[tuple[int, str, Key]]] = {i: [] for i, _ in mine}
        self._wakeups: dict[int, dict[Key, int]] = {i: {} for i, _ in mine}
        # Per stage, the keys given rows since the last advance, and the keys changed
        # since the last save (kept only with a store).
        self._fed: dict[int, set[Key]] = {i: set() for i, _ in mine}
        self._touched: dict[int, set[Key]] = {i: set() for i, _ in mine}
        self._arrivals = 0  # identity of readings that carry none (replay): arrival index
        self.dropped: list[str] = []
        """Stages whose saved state was dropped at restore (edited or removed rules)."""
        if store is not None:
            self._restore(store)

    # -- arrivals ------------------------------------------------------------------------
    def process(self, arrivals: Mapping[str, pa.Table]) -> BatchResult:
        """Judge each source stream's arrivals (a table in arrival order: the stream's
        columns with timestamps as epoch ms, ``source``, ``epoch``, ``seq`` and
        ``heartbeat``; other columns are kept with the readings), evaluate, and return
        what the batch produced."""
        result = BatchResult()
        for stream, table in arrivals.items():
            if stream not in self.sources:
                raise ValueError(f"unknown source stream {stream!r}")
            if table.num_rows:
                self._judge(stream, table, result)
        watermarks = {name: s.clock.watermark for name, s in self.sequencers.items()}
        self._advance(watermarks, result)
        result.watermarks = watermarks
        return result

    def finish(self) -> BatchResult:
        """The end of input: a final heartbeat at +infinity closes every window and fires
        every pending expiration."""
        result = BatchResult()
        self._advance(dict.fromkeys(self.sources, END_OF_TIME), result)
        result.watermarks = {name: s.clock.watermark for name, s in self.sequencers.items()}
        return result

    def _judge(self, stream: str, table: pa.Table, result: BatchResult) -> None:
        schema = self.sources[stream]
        ts_column = schema.timestamp or "ts"
        columns = [c.name for c in schema.columns]
        sequencer = self.sequencers[stream]
        accepted: list[int] = []
        stamps: list[int] = []
        feed: list[Row] = []
        beats = 0
        rows = table.to_pylist()
        for index, row in enumerate(rows):
            arrival, self._arrivals = self._arrivals, self._arrivals + 1
            ts = row[ts_column]
            if row.pop(HEARTBEAT, None):
                sequencer.heartbeat(ts)
                beats += 1
                continue
            source = row["source"] = row.get("source") or ""
            epoch = row.get("epoch") or ""
            if not epoch:
                row.pop("epoch", None)
            seq = row.get("seq")
            if seq is None:
                seq = row["seq"] = arrival
            watermark = sequencer.clock.watermark
            content = content_hash(row.get(c) for c in columns)
            verdict = sequencer.admit(source, seq, ts, epoch, content)
            if verdict is Verdict.ON_TIME:
                accepted.append(index)
                stamps.append(sequencer.clock.watermark)
                # What a stage sees of a reading: its columns and its tie order.
                tuple_ = {c: row.get(c) for c in columns}
                tuple_["source"], tuple_["seq"] = source, seq
                feed.append(tuple_)
            elif verdict is Verdict.LATE:
                result.late.append(LateReading(stream, row, ts, watermark))
            elif verdict is Verdict.DUPLICATE:
                result.duplicates[stream] = result.duplicates.get(stream, 0) + 1
            else:
                first = sequencer.original(source, seq, epoch)
                reason = (
                    "the same (source, epoch, seq) came before with other values"
                    if first is not None
                    else "the same (source, epoch, seq) came before; the first reading "
                    "is too far back to compare"
                )
                original_ts = None if first is None else first[1]
                result.conflicts.append(Conflict(stream, row, ts, reason, original_ts))
        if beats:
            result.heartbeats[stream] = result.heartbeats.get(stream, 0) + beats
        kept = table.take(pa.array(accepted, pa.int64())) if accepted else table.slice(0, 0)
        if "seq" in kept.column_names and kept.num_rows:
            kept = kept.set_column(
                kept.column_names.index("seq"),
                "seq",
                pa.array([r["seq"] for r in feed], pa.int64()),
            )
        result.readings[stream] = kept.append_column(
            ARRIVAL_WATERMARK, pa.array(stamps, pa.int64())
        )
        for i in self._readers.get(stream, ()):
            self._insert(i, feed)

    def _insert(self, i: int, rows: list[Row]) -> None:
        """Hand ``rows`` (in arrival order) to stage ``i``'s evaluators by key."""
        if not rows:
            return
        key_columns = self._stage(i).key
        by_key: dict[Key, list[Row]] = {}
        for row in rows:
            by_key.setdefault(tuple(row.get(c) for c in key_columns), []).append(row)
        for key, mine in by_key.items():
            self._evaluator(i, key).insert_many(mine)
            self._fed[i].add(key)

    # -- advancing -----------------------------------------------------------------------
    def _advance(self, watermarks: dict[str, int], result: BatchResult) -> None:
        """Advance every stage to its input's watermark in dependency order, feeding each
        derived row to the stages reading it (they come later in that order)."""
        for i, stage in self.stages:
            watermark = watermarks[stage.input]
            due = self._fed[i]
            self._fed[i] = set()
            due.update(self._due(i, watermark))
            touched = self._touched[i] if self.store is not None else set()
            produced: dict[str, list[Row]] = {}
            for key in sorted(due, key=key_json):
                evaluator = self._evaluator(i, key)
                for output in evaluator.advance_columns(max(watermark, evaluator.watermark)):
                    result.outputs.append(Emitted(i, key, output))
                    if output.sink in self._readers:
                        rows = [output] if isinstance(output, Output) else output.outputs()
                        produced.setdefault(output.sink, []).extend(
                            {**o.row, "_ts": o.ts, "source": o.source, "seq": o.seq} for o in rows
                        )
                touched.add(key)
                self._schedule(i, key, evaluator.next_wakeup())
            # What the stage emits from now on has ts >= watermark: its sinks' watermark,
            # the lowest of their producers' for a UNION ALL.
            for sink in _sinks(stage):
                watermarks[sink] = min(watermarks.get(sink, watermark), watermark)
            for sink, rows in produced.items():
                for j in self._readers[sink]:
                    ts = self._stage(j).timestamp
                    self._insert(j, [{**row, ts: row["_ts"]} for row in rows])

    def _due(self, i: int, watermark: int) -> list[Key]:
        """Pop the keys of stage ``i`` whose wakeup is at or below ``watermark``."""
        heap, current = self._heaps[i], self._wakeups[i]
        due = []
        while heap and heap[0][0] <= watermark:
            wakeup, _, key = heapq.heappop(heap)
            if current.get(key) == wakeup:
                del current[key]
                due.append(key)
        return due

    def _schedule(self, i: int, key: Key, wakeup: int | None) -> None:
        current = self._wakeups[i]
        if wakeup is None:
            current.pop(key, None)
        elif current.get(key) != wakeup:
            current[key] = wakeup
            heapq.heappush(self._heaps[i], (wakeup, key_json(key), key))

    def _stage(self, i: int) -> Stage:
        return self._by_index[i]

    def _evaluator(self, i: int, key: Key) -> KeyedEvaluator:
        """Stage ``i``'s evaluator of ``key``: in memory, loaded from the store, or new."""
        found = self.evaluators[i].get(key)
        if found is not None:
            return found
        stage = self._stage(i)
        head = self._stored[i].pop(key, None)
        if head is None:
            evaluator = KeyedEvaluator(stage)
        else:
            name, text = stage.name, key_json(key)

            def read_chunk(number: int) -> bytes:
                # The store at the time of reading: a runtime may hand the pipeline a
                # new one for each batch (`store` is reassigned), chunks stay valid.
                assert self.store is not None
                data = self.store.get(("chunk", name, text, number))
                if data is None:
                    raise KeyError(f"state chunk {number} of {name} {text} missing")
                return data

            evaluator = KeyedEvaluator.load(stage, head, read_chunk)
        self.evaluators[i][key] = evaluator
        return evaluator

    # -- state ---------------------------------------------------------------------------
    def save(self) -> None:
        """Write to the store what changed since the last save (nothing without one)."""
        store = self.store
        if store is None:
            return
        for name, sequencer in self.sequencers.items():
            sealed, dropped = sequencer.seal()
            if sealed is not None:
                store.put(("recent", name, "", sealed[0]), pickle.dumps(sealed[1], _PICKLE))
            for number in dropped:
                store.delete(("recent", name, "", number))
            store.put(("sequencer", name, "", 0), pickle.dumps(sequencer.state(), _PICKLE))
        for i, stage in self.stages:
            touched = self._touched[i]
            for key in sorted(touched, key=key_json):
                evaluator = self.evaluators[i][key]
                saved = evaluator.save()
                text = key_json(key)
                record = (stage.query.definition, evaluator.next_wakeup(), saved.head)
                store.put(("head", stage.name, text, 0), pickle.dumps(record, _PICKLE))
                for number in saved.deletes:
                    store.delete(("chunk", stage.name, text, number))
                for number, data in saved.writes.items():
                    store.put(("chunk", stage.name, text, number), data)
            touched.clear()

    def _restore(self, store: StateStore) -> None:
        segments: dict[str, list[tuple[int, list[tuple[Any, ...]]]]] = {}
        for (_, stream, _, number), data in store.scan("recent"):
            segments.setdefault(stream, []).append((number, pickle.loads(data)))
        for (_, stream, _, _), data in store.scan("sequencer"):
            if stream in self.sources:
                self.sequencers[stream] = StreamSequencer.from_state(
                    self.sources[stream].slack_ms, pickle.loads(data), segments.get(stream, ())
                )
        by_name = {stage.name: i for i, stage in self.stages}
        stale: set[tuple[str, str]] = set()
        for (_, name, text, _), data in store.scan("head"):
            definition, wakeup, head = pickle.loads(data)
            i = by_name.get(name)
            if i is None or self._stage(i).query.definition != definition:
                stale.add((name, text))
                continue
            key = tuple(orjson.loads(text))
            self._stored[i][key] = head
            self._schedule(i, key, wakeup)
        if stale:
            self._drop(store, stale)

    def _drop(self, store: StateStore, stale: set[tuple[str, str]]) -> None:
        """Delete the saved evaluators of edited or removed rules, with their chunks."""
        for name, text in stale:
            store.delete(("head", name, text, 0))
        chunks: list[StateKey] = [k for k, _ in store.scan("chunk") if (k[1], k[2]) in stale]
        for chunk in chunks:
            store.delete(chunk)
        self.dropped = sorted({name for name, _ in stale})

    # -- health --------------------------------------------------------------------------
    def live_keys(self) -> dict[str, int]:
        """How many keys each stage holds state for (in memory or in the store)."""
        return {
            stage.name: len(self.evaluators[i].keys() | self._stored[i].keys())
            for i, stage in self.stages
        }
