"""The rules over one part of the stream graph, batch after batch (pure; no Spark).

A :class:`Pipeline` runs every stage fed, directly or through derived streams, by a
set of source streams: it judges each stream's arrivals with its
:class:`~engine.core.sequencer.StreamSequencer` (duplicates, conflicts, slack), feeds
the on-time readings to the stages reading the stream, advances the stages to their
input's watermark in dependency order, and hands each derived row at once to the
stages that read it. ``lookout replay`` and the live engine both run it, so they give
the same rows by construction; the live engine runs one pipeline per connected part of
the graph (:func:`components`) inside one Spark stateful step.

**Time.** A source stream's watermark is its slack clock after the batch (per source:
the lowest clock of the sources not idle, :class:`~engine.core.sequencer.SourceClocks`);
a derived stream's is the lowest of its producing stages' watermarks (a UNION ALL
waits for its slowest branch). Advancing never depends on how arrivals were cut into
batches (snapshot-equivalence), so any batching gives the same rows.

**Stages** are run by :mod:`engine.core.runners` (row by row, or per column where the
window form allows it), fed Arrow tables and emitting Arrow tables; work per batch is
proportional to what the batch touches.

**State.** With a :class:`~engine.core.state.StateStore`, :meth:`Pipeline.save` writes
what changed since the last save: each sequencer's clock and ids, the contents of the
readings just judged, and each runner's changed keys. A pipeline built on a store with
state resumes it; state of a rule edited or removed since
(:attr:`~engine.core.plan.Query.definition`) is dropped, and said so in
:attr:`Pipeline.dropped`.

**New rules.** The store also keeps which stages its state was saved for, with their
definitions. A pipeline resumed on a store that has not seen one of its stages, or saw
another definition of it, names that stage in :attr:`Pipeline.fresh`: its windows are
empty. A warm start (``engine.warm_start``) fills them from history and hands the state
over with :meth:`Pipeline.adopt`.

**Keys.** Keyed stages evict keys whose state is idle (docs/engine.md, *Eviction*). A
source stream may have a cap on live keys (:mod:`engine.core.keycap`): readings of new
keys beyond it are set aside (:attr:`BatchResult.capped`), never evaluated.
"""

from __future__ import annotations

import pickle
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engine.core.batch import (
    HEARTBEAT,
    BatchResult,
    Conflict,
    LateReading,
    reading_row,
    reading_rows,
)
from engine.core.columnar.ops import apply, vectorised
from engine.core.held import KIND as HELD
from engine.core.held import HeldRows
from engine.core.incidents import IncidentTracker
from engine.core.key_index import KEY_INDEX, recorded_states
from engine.core.keycap import KIND as KEYCAP
from engine.core.keycap import CappedReading, CappedStage, KeyCap
from engine.core.plan import (
    END_OF_TIME,
    Filter,
    Incidents,
    Plan,
    Stage,
    StatelessOp,
    StreamSchema,
)
from engine.core.planner.runners import runner_for
from engine.core.runners import (
    KEY,
    LISTED_PIECE_KINDS,
    STAGE_STATE_KINDS,
    SinkRows,
    StageRunner,
    input_rows,
)
from engine.core.sequencer import StreamSequencer, Verdict, content_hashes
from engine.core.state import StateKey, StateStore

Key = tuple[Any, ...]

ARRIVAL_WATERMARK = "arrival_watermark"
"""The column :attr:`BatchResult.readings` adds: the stream's watermark once the reading
had arrived (epoch ms)."""

_PICKLE = pickle.HIGHEST_PROTOCOL

STAGES: StateKey = ("stages", "", "", 0)
"""The store entry naming the stages the state was saved for, with their definitions."""
NEW, EDITED = "new", "edited"
"""Why a stage is fresh (:attr:`Pipeline.fresh`): the store never saw it, or saw another
definition of it."""


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
        for sink in stage_sinks(stage):
            parent[find(sink)] = find(stage.input)
    groups: dict[str, list[str]] = {}
    for source in plan.sources():
        groups.setdefault(find(source.name), []).append(source.name)
    return sorted(tuple(sorted(names)) for names in groups.values())


def stage_sinks(stage: Stage) -> list[str]:
    """The streams a stage writes: its root query's sink and its downstream queries'."""
    return [q.sink.name for q in (stage.query, *stage.downstream)]


def dependency_order(stages: Iterable[tuple[int, Stage]]) -> list[tuple[int, Stage]]:
    """``stages`` (with their plan indexes) so that every stage comes after the stages
    writing the stream it reads; ties in plan order."""
    pending = sorted(stages, key=lambda item: item[0])
    writers: dict[str, set[int]] = {}
    for i, stage in pending:
        for sink in stage_sinks(stage):
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


def stream_watermarks(
    stages: Iterable[tuple[int, Stage]], sources: Mapping[str, int]
) -> dict[str, int]:
    """Every stream's watermark once ``stages`` (in dependency order) have advanced to
    their inputs' with the source streams at ``sources``: a derived stream's is the lowest
    of the watermarks its producing stages advanced to, since what a stage emits from
    then on has ts at or above the watermark it advanced to (for a UNION ALL, the lowest
    producer's)."""
    watermarks = dict(sources)
    for _, stage in stages:
        watermark = watermarks[stage.input]
        for sink in stage_sinks(stage):
            watermarks[sink] = min(watermarks.get(sink, watermark), watermark)
    return watermarks


def _numbers(column: pa.ChunkedArray | pa.Array, dtype: type) -> np.ndarray:
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=dtype)


def fed_stages(plan: Plan, sources: Collection[str]) -> list[tuple[int, Stage]]:
    """The stages fed by ``sources``, directly or through derived streams, with their
    plan indexes, in dependency order."""
    fed = set(sources)
    mine: list[tuple[int, Stage]] = []
    for i, stage in dependency_order(enumerate(plan.stages())):
        if stage.input in fed:
            mine.append((i, stage))
            fed.update(stage_sinks(stage))
    return mine


def _stale_pieces(
    store: StateStore,
    stale: list[StateKey],
    saved: Mapping[str, Mapping[str, list[tuple[StateKey, bytes]]]],
    owners: Collection[str],
) -> list[StateKey]:
    """The pieces of stale state (entries a runner reads only when it needs them): those
    of the stale entries' keys and of stages no rule has any more, found by listing the
    store's pieces, and the key states stale indexes name."""
    keys = {(entry[1], entry[2]) for entry in stale}
    found = [
        entry
        for kind in LISTED_PIECE_KINDS
        for entry in store.keys(kind)
        if (entry[1], entry[2]) in keys or entry[1] not in owners
    ]
    doomed = set(stale)
    for kinds in saved.values():
        for entry, data in kinds.get(KEY_INDEX, []):
            if entry in doomed:
                found += recorded_states(entry, data)
    return found


def tracker_for(
    plan: Plan, spec: Incidents, stages: Iterable[tuple[int, Stage]]
) -> IncidentTracker | None:
    """A new incident tracker of ``spec``'s alert, if one of ``stages`` emits it. Observed
    rows carry the alert's key (``_key``) when the alert is a query fed inside another
    stage (the observed stream is produced in that stage); otherwise the key is the
    alert's stage's key columns of each observed row."""
    stage = next((s for _, s in stages if spec.alert in stage_sinks(s)), None)
    if stage is None:
        return None
    own = stage.query.sink.name == spec.alert
    observed = plan.streams.get(spec.observe or "")
    timestamp = observed.timestamp if observed and observed.timestamp else "ts"
    return IncidentTracker(spec, stage.key if own else None, timestamp)


class Pipeline:
    """Every stage fed by ``sources`` (all source streams of ``plan`` by default), on a
    state store (none: state lives as long as the object). ``evict``: keyed stages drop
    keys whose state is idle (docs/engine.md, *Eviction*); off, every key ever seen is
    kept, which gives the same rows. ``caps``: per source stream, how many keys each
    keyed stage reading it may hold (:mod:`engine.core.keycap`; none: no cap).
    ``only``: the plan indexes of the stages to run, when not all of them (a split
    evaluation's share, :mod:`engine.core.partitions`)."""

    def __init__(
        self,
        plan: Plan,
        sources: Collection[str] | None = None,
        store: StateStore | None = None,
        evict: bool = True,
        caps: Mapping[str, int] | None = None,
        only: Collection[int] | None = None,
    ) -> None:
        self.plan = plan
        self.evict = evict
        self.sources: dict[str, StreamSchema] = {
            s.name: s for s in plan.sources() if sources is None or s.name in sources
        }
        for name, schema in self.sources.items():
            if schema.timestamp is None:
                raise ValueError(f"source stream {name!r} has no timestamp column")
        self.stages = [
            (i, stage) for i, stage in fed_stages(plan, self.sources) if only is None or i in only
        ]
        self._stage_of = dict(self.stages)
        self._readers: dict[str, list[int]] = {}
        for i, stage in self.stages:
            self._readers.setdefault(stage.input, []).append(i)
        self.store = store
        self.sequencers = {
            name: StreamSequencer(s.slack_ms, source_idle_ms=s.source_idle_ms)
            for name, s in self.sources.items()
        }
        self.held = {
            name: HeldRows(name, s.timestamp)
            for name, s in self.sources.items()
            if name in self._readers and s.timestamp is not None
        }
        self.runners: dict[int, StageRunner] = {
            i: runner_for(i, stage, self) for i, stage in self.stages
        }
        self.trackers = self._trackers()
        self._observers: dict[str, list[IncidentTracker]] = {}
        for tracker in self.trackers.values():
            if tracker.spec.observe is not None:
                self._observers.setdefault(tracker.spec.observe, []).append(tracker)
        self._arrivals = 0  # identity of readings that carry none (replay): arrival index
        # Each source stream's watermark its stages were last advanced to.
        self._at = {name: -END_OF_TIME for name in self.sources}
        self.caps: dict[str, KeyCap] = {}
        for name, cap in (caps or {}).items():
            capped = [
                CappedStage(i, stage, self.runners[i], set())
                for i, stage in self.stages
                if stage.input == name and stage.key
            ]
            if name in self.sources and cap > 0 and capped:
                self.caps[name] = KeyCap(name, cap, capped)
        # Without a store (replay), a stream whose every stage here filters its rows
        # first (columnar) holds only the rows one of those filters keeps: an unkeyed
        # alert over a WHERE, evaluated apart from the keyed stages in a split replay,
        # would otherwise hold and sort every reading. Not under a cap, whose decisions
        # read the held rows, nor with a store: a rule added later would find stored
        # held rows that only the earlier rules' filters kept.
        self._hold_through: dict[str, list[tuple[StatelessOp, ...]]] = {
            stream: [self._stage_of[i].query.pre for i in readers]
            for stream, readers in self._readers.items()
            if store is None and stream in self.held and stream not in self.caps and all(
                any(isinstance(op, Filter) for op in self._stage_of[i].query.pre)
                and vectorised(self._stage_of[i].query.pre)
                for i in readers
            )
        }  # fmt: skip
        self.dropped: list[str] = []
        """Stages whose saved state was dropped at restore (edited or removed rules)."""
        self.fresh: dict[str, str] = {}
        """Stages resumed without state of their definition, each :data:`NEW` or
        :data:`EDITED` (none on a store that names no stages: a new one, or state saved
        before stages were recorded)."""
        self._recorded: dict[str, str] | None = None  # the stages the store was saved for
        if store is not None:
            self._restore(store)

    def _trackers(self) -> dict[str, IncidentTracker]:
        """An incident tracker per alert this pipeline's stages emit (:func:`tracker_for`)."""
        trackers = {}
        for spec in self.plan.incidents:
            tracker = tracker_for(self.plan, spec, self.stages)
            if tracker is not None:
                trackers[spec.alert] = tracker
        return trackers

    # -- arrivals ------------------------------------------------------------------------
    def process(self, arrivals: Mapping[str, pa.Table]) -> BatchResult:
        """Judge each source stream's arrivals (a table in arrival order: the stream's
        columns with timestamps as epoch ms, ``source``, ``epoch``, ``seq`` and
        ``heartbeat``; other columns are kept with the readings), evaluate, and return
        what the batch produced: :meth:`evaluate` after :meth:`admit`."""
        return self.evaluate(self.admit(arrivals))

    def admit(self, arrivals: Mapping[str, pa.Table]) -> BatchResult:
        """The first half of :meth:`process`: judge each source stream's arrivals and
        hand the admitted ones to the stages. The result's readings, late readings,
        conflicts, duplicates, heartbeats and capped readings are final; its outputs
        and watermarks are :meth:`evaluate`'s to add."""
        result = BatchResult()
        for stream, kept in self._judged(arrivals, result):
            self._hand_over(stream, kept)
        return result

    def evaluate(self, result: BatchResult) -> BatchResult:
        """The second half of :meth:`process`: advance every stage to its stream's
        watermark, adding what they emit to ``result`` (:meth:`admit`'s)."""
        watermarks = self._clocks()
        self._advance(watermarks, result)
        result.watermarks = watermarks
        return result

    def judge(self, arrivals: Mapping[str, pa.Table]) -> tuple[BatchResult, dict[str, pa.Table]]:
        """The first half of :meth:`process`: judge each stream's arrivals and return
        what the batch set aside (late readings, conflicts, duplicate counts, the
        watermarks) with the admitted readings of each stream, in arrival order, as
        :meth:`feed` takes them; no stage sees them. Only without caps on live keys,
        whose decisions need the stages' keys."""
        if self.caps:
            raise ValueError("judging apart from evaluating needs a pipeline without caps")
        result = BatchResult()
        admitted = {
            stream: kept.select(self._seen(stream))
            for stream, kept in self._judged(arrivals, result)
        }
        result.watermarks = self._clocks()
        return result, admitted

    def feed(self, admitted: Mapping[str, pa.Table], watermarks: Mapping[str, int]) -> BatchResult:
        """The second half of :meth:`process`: readings another pipeline's :meth:`judge`
        admitted (any subset of them, e.g. the keys of one partition) to the stages,
        then every stage advanced to ``watermarks`` (each source stream's, as that judge
        returned them)."""
        for stream, kept in admitted.items():
            self._hand_over(stream, kept)
        result = BatchResult()
        self._advance(dict(watermarks), result)
        result.watermarks = dict(watermarks)
        return result

    def finish(self, at: int = END_OF_TIME) -> BatchResult:
        """The end of input: a final heartbeat at `at` on every source stream (one that is
        past it already stays where it is). At +infinity, the default, it closes every
        window and fires every pending expiration."""
        return self.advance_to({name: at for name in self.sequencers})

    def advance_to(self, marks: Mapping[str, int]) -> BatchResult:
        """Advance each source stream named in `marks` to at least its mark, as a
        heartbeat there would (the others stay where they are)."""
        result = BatchResult()
        self._advance(self.marks(marks), result)
        result.watermarks = self._clocks()
        return result

    def marks(self, marks: Mapping[str, int]) -> dict[str, int]:
        """Each source stream's watermark once advanced to at least its mark in
        ``marks`` (:meth:`advance_to`)."""
        return {
            name: max(marks.get(name, -END_OF_TIME), s.clock.watermark)
            for name, s in self.sequencers.items()
        }

    def _clocks(self) -> dict[str, int]:
        """Each source stream's slack clock's watermark."""
        return {name: s.clock.watermark for name, s in self.sequencers.items()}

    def positions(self) -> dict[str, int]:
        """Each source stream's watermark its stages have been advanced to: every
        reading below it has been evaluated, none at or above it."""
        return dict(self._at)

    def _judged(
        self, arrivals: Mapping[str, pa.Table], result: BatchResult
    ) -> Iterator[tuple[str, pa.Table]]:
        """Each stream's admitted readings not yet handed over, as each stream is judged
        (:meth:`_judge`)."""
        for stream, table in arrivals.items():
            if stream not in self.sources:
                raise ValueError(f"unknown source stream {stream!r}")
            if table.num_rows:
                yield stream, self._judge(stream, table, result)

    def _judge(self, stream: str, table: pa.Table, result: BatchResult) -> pa.Table:
        """Judge a stream's arrivals into ``result``; return the admitted readings not yet
        handed to the stages (a capped stream's are partly handed over while judging)."""
        schema = self.sources[stream]
        columns = [c.name for c in schema.columns]
        sequencer = self.sequencers[stream]
        n = table.num_rows
        ts = _numbers(table.column(schema.timestamp or "ts"), np.int64)
        beat = _numbers(pc.fill_null(table.column(HEARTBEAT), False), bool)
        sources = pc.fill_null(table.column("source"), "")
        epochs = pc.fill_null(table.column("epoch"), "")
        # Readings without an identity (replay) are numbered by arrival.
        seq_column = table.column("seq")
        arrival = np.arange(self._arrivals, self._arrivals + n, dtype=np.int64)
        self._arrivals += n
        seqs = np.where(
            _numbers(pc.is_null(seq_column), bool),
            arrival,
            _numbers(pc.fill_null(seq_column, 0), np.int64),
        )
        judged = sequencer.judge(
            ts,
            beat,
            sources,
            epochs,
            seqs,
            content_hashes(table.select(columns)),
        )
        sequencer.forget_old()
        verdicts = judged.verdicts
        table = table.set_column(table.column_names.index("seq"), "seq", pa.array(seqs))
        table = table.set_column(table.column_names.index("source"), "source", sources)
        on_time = verdicts == Verdict.ON_TIME
        handed = 0  # the readings before this one went to the stages already
        if stream in self.caps:
            on_time, handed = self._admit(stream, table, on_time, ts, judged.before, result)
        # Most batches are all on time: filtering a million rows by an all-true mask
        # copies every column (0.06-0.2 s).
        kept = table if on_time.all() else table.filter(pa.array(on_time))
        result.readings[stream] = kept.append_column(
            ARRIVAL_WATERMARK, pa.array(judged.after[on_time], pa.int64())
        )
        beats = int((verdicts == Verdict.HEARTBEAT).sum())
        if beats:
            result.heartbeats[stream] = result.heartbeats.get(stream, 0) + beats
        duplicates = int((verdicts == Verdict.DUPLICATE).sum())
        if duplicates:
            result.duplicates[stream] = result.duplicates.get(stream, 0) + duplicates
        late = verdicts == Verdict.LATE
        aside = np.flatnonzero(late | (verdicts == Verdict.CONFLICT))
        # Plain lists, not an array element and an enum member per reading: one reading
        # in a hundred may be late.
        for index, row, is_late, when, threshold in zip(
            aside.tolist(),
            reading_rows(table, aside),
            late[aside].tolist(),
            ts[aside].tolist(),
            judged.threshold[aside].tolist(),
            strict=True,
        ):
            if is_late:
                result.late.append(LateReading(stream, row, when, threshold))
                continue
            first = int(judged.original_ts[index])
            reason = (
                "the same (source, epoch, seq) came before with other values"
                if first >= 0
                else "the same (source, epoch, seq) came before; the first reading "
                "is too far back to compare"
            )
            result.conflicts.append(
                Conflict(stream, row, when, reason, first if first >= 0 else None)
            )
        if not handed:
            return kept
        rest = on_time.copy()
        rest[:handed] = False
        return table.filter(pa.array(rest))

    def _hand_over(self, stream: str, kept: pa.Table) -> None:
        """Admitted readings to the stages (held until the watermark passes them) and
        to the incident trackers observing the stream."""
        if kept.num_rows and stream in self.held:
            self.held[stream].add(self._needed(stream, kept.select(self._seen(stream))))
        if kept.num_rows:
            for tracker in self._observers.get(stream, ()):
                tracker.observe(kept)

    def _needed(self, stream: str, rows: pa.Table) -> pa.Table:
        """``rows`` of ``stream`` without those no stage here can use (every stage
        filters them out first: ``_hold_through``)."""
        pres = self._hold_through.get(stream)
        if not pres:
            return rows
        used = np.unique(np.concatenate([apply(pre, rows)[1] for pre in pres]))
        return rows if len(used) == rows.num_rows else rows.take(pa.array(used, pa.int64()))

    def _seen(self, stream: str) -> list[str]:
        """What a stage sees of a reading of ``stream``: its columns and its tie order."""
        return [*(c.name for c in self.sources[stream].columns), "source", "seq"]

    def _admit(
        self,
        stream: str,
        table: pa.Table,
        on_time: np.ndarray,
        ts: np.ndarray,
        before: np.ndarray,
        result: BatchResult,
    ) -> tuple[np.ndarray, int]:
        """Which on-time readings of a capped stream are admitted, and how many of the
        first readings went to the stages already (:mod:`engine.core.keycap`): deciding a
        reading that arrived past a step of the watermark first evaluates the stream's
        stages up to that step, with every reading admitted before it."""
        cap = self.caps[stream]
        held = self.held.get(stream)
        if not cap.may_fill(held.rows if held is not None else (), table, on_time):
            return on_time, 0
        admitted = on_time.copy()
        names = sorted({c for s in cap.stages for c in s.stage.key})
        rows = table.select(names).to_pylist()
        handed = 0
        decide = None
        for i in np.flatnonzero(on_time):
            step = cap.due(int(before[i]))
            if step is not None:
                mask = admitted.copy()
                mask[:handed] = mask[i:] = False
                self._hand_over(stream, table.filter(pa.array(mask)))
                handed = int(i)
                self._step(stream, step, result)
                decide = None
            if decide is None:
                decide = cap.decider(held.rows if held is not None else ())
            reason = decide(rows[i])
            if reason is not None:
                admitted[i] = False
                result.capped.append(
                    CappedReading(stream, reading_row(table, int(i)), int(ts[i]), reason)
                )
        return admitted, handed

    def _step(self, stream: str, step: int, result: BatchResult) -> None:
        """Evaluate ``stream``'s stages up to ``step`` (the other streams' stay)."""
        self._advance_once({**self._at, stream: max(step, self._at[stream])}, result)
        self.caps[stream].stepped(step)

    # -- advancing -----------------------------------------------------------------------
    def _advance(self, watermarks: dict[str, int], result: BatchResult) -> None:
        """Advance every stage to its input's watermark (:meth:`_advance_once`), a capped
        stream's first to the last step before it if it passes one (the keys its stages
        hold there decide the next readings: :mod:`engine.core.keycap`)."""
        steps = {
            name: step
            for name, cap in self.caps.items()
            if (step := cap.due(watermarks[name])) is not None
        }
        if steps:
            at = {name: max(step, self._at[name]) for name, step in steps.items()}
            self._advance_once({**watermarks, **at}, result)
            for name, step in steps.items():
                self.caps[name].stepped(step)
        self._advance_once(watermarks, result)
        if steps:
            # An incident both advances changed is the batch's change once, in its last
            # state (the incidents table merges a batch's rows by incident).
            latest = {(u.alert, u.key, u.opened_at): u for u in result.incidents}
            result.incidents = list(latest.values())

    def _advance_once(self, watermarks: dict[str, int], result: BatchResult) -> None:
        """Advance every stage to its input's watermark in dependency order, feeding each
        derived row to the stages reading it (they come later in that order), after the
        held readings the watermarks have passed."""
        for name in self.sources:
            self._at[name] = max(self._at[name], watermarks[name])
        watermarks = stream_watermarks(self.stages, watermarks)
        for stream, held in self.held.items():
            released = held.release(watermarks[stream])
            if released is not None:
                # Sorted once per arrangement (key), not once per stage.
                arranged: dict[tuple[str, ...] | None, pa.Table] = {}
                for i in self._readers[stream]:
                    runner = self.runners[i]
                    key = runner.arrangement
                    if key not in arranged:
                        arranged[key] = (
                            released.in_tie_order() if key is None else released.arranged(key)
                        )
                    runner.insert(arranged[key], arranged=key is not None)
        for i, stage in self.stages:
            watermark = watermarks[stage.input]
            for emitted in self.runners[i].advance(watermark):
                result.outputs.append(emitted)
                for j in self._readers.get(emitted.sink, ()):
                    self.runners[j].insert(input_rows(self.stage(j).timestamp, emitted.table))
                self._to_trackers(emitted)
            evicted = self.runners[i].take_evicted()
            if stage.input in self.caps:
                self.caps[stage.input].note_evicted(i, evicted)
        for alert, tracker in self.trackers.items():
            # Every report and observation below both watermarks is in.
            watermark = min(watermarks[alert], watermarks[tracker.spec.observe or alert])
            result.incidents += tracker.advance(watermark)

    def _to_trackers(self, emitted: SinkRows) -> None:
        """An alert's rows are its tracker's reports; a stream's rows are observations
        of the trackers observing it."""
        tracker = self.trackers.get(emitted.sink)
        if tracker is not None:
            tracker.report(emitted.table)
        for tracker in self._observers.get(emitted.sink, ()):
            rows = input_rows(tracker.timestamp, emitted.table)
            own = tracker.key_columns is None
            tracker.observe(rows, emitted.table.column(KEY) if own else None)

    def stage(self, i: int) -> Stage:
        """The stage with plan index ``i``."""
        return self._stage_of[i]

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
        for name, held in self.held.items():
            held.save(store, self.sequencers[name].clock.watermark)
        for runner in self.runners.values():
            runner.save(store)
        for tracker in self.trackers.values():
            tracker.save(store)
        for cap in self.caps.values():
            cap.save(store)
        stages = {stage.name: stage.query.definition for _, stage in self.stages}
        if self._recorded != stages:
            store.put(STAGES, orjson.dumps(stages, option=orjson.OPT_SORT_KEYS))
            self._recorded = stages

    def adopt(self, entries: Iterable[tuple[StateKey, bytes]]) -> None:
        """Take up state saved by another pipeline over the same rules (a warm start's,
        filled from history up to :meth:`positions`) for the stages it names: the
        entries are written to the store and those stages resume from them, as from a
        store at restore. The stages are fresh no more."""
        store = self.store
        assert store is not None, "a pipeline without a store has no state to adopt"
        saved: dict[str, dict[str, list[tuple[StateKey, bytes]]]] = {}
        for entry, data in entries:
            store.put(entry, data)
            if entry[0] in STAGE_STATE_KINDS:
                saved.setdefault(entry[1], {}).setdefault(entry[0], []).append((entry, data))
        runners = {stage.name: self.runners[i] for i, stage in self.stages}
        for name, found in saved.items():
            stale = runners[name].restore(found)
            if stale:
                raise ValueError(f"state of {name!r} adopted from another definition")
            self.fresh.pop(name, None)

    def _restore(self, store: StateStore) -> None:
        segments: dict[str, list[tuple[int, list[tuple[Any, ...]]]]] = {}
        for (_, stream, _, number), data in store.scan("recent"):
            segments.setdefault(stream, []).append((number, pickle.loads(data)))
        for (_, stream, _, _), data in store.scan("sequencer"):
            if stream in self.sources:
                schema = self.sources[stream]
                self.sequencers[stream] = StreamSequencer.from_state(
                    schema.slack_ms,
                    pickle.loads(data),
                    segments.get(stream, ()),
                    source_idle_ms=schema.source_idle_ms,
                )
                # Each batch ends with the stream's stages advanced to its watermark.
                self._at[stream] = self.sequencers[stream].clock.watermark
        for entry, data in store.scan(KEYCAP):
            if entry[1] in self.caps:
                self.caps[entry[1]].restore([(entry, data)])
            elif entry[1] in self.sources:  # the stream has no cap any more
                store.delete(entry)
        chunks: dict[str, list[tuple[StateKey, bytes]]] = {}
        for entry, data in store.scan(HELD):
            chunks.setdefault(entry[1], []).append((entry, data))
        for stream, found in chunks.items():
            if stream in self.held:
                self.held[stream].restore(found, self.sequencers[stream].clock.watermark)
            else:  # no rule reads the stream any more
                for entry, _ in found:
                    store.delete(entry)
        saved: dict[str, dict[str, list[tuple[StateKey, bytes]]]] = {}
        for kind in STAGE_STATE_KINDS:
            for entry, data in store.scan(kind):
                saved.setdefault(entry[1], {}).setdefault(kind, []).append((entry, data))
        owners: dict[str, StageRunner | IncidentTracker] = {
            stage.name: self.runners[i] for i, stage in self.stages
        }
        owners.update({tracker.name: tracker for tracker in self.trackers.values()})
        doomed: list[StateKey] = []
        dropped: set[str] = set()
        for name, entries in saved.items():
            owner = owners.get(name)
            stale = (
                [e for found in entries.values() for e, _ in found]
                if owner is None
                else owner.restore(entries)
            )
            if stale:
                dropped.add(name)
                doomed += stale
        if doomed:
            doomed += _stale_pieces(store, doomed, saved, owners)
        for entry in doomed:
            store.delete(entry)
        self.dropped = sorted(dropped)
        recorded = store.get(STAGES)
        if recorded is not None:
            self._recorded = orjson.loads(recorded)
        mine = {stage.name: stage.query.definition for _, stage in self.stages}
        if self._recorded is not None:
            seen = self._recorded
            self.fresh = {
                name: NEW if name not in seen else EDITED
                for name, definition in mine.items()
                if seen.get(name) != definition or name in dropped
            }

    # -- health --------------------------------------------------------------------------
    def live_keys(self) -> dict[str, int]:
        """How many keys each stage holds state for."""
        live = {stage.name: self.runners[i].live_keys() for i, stage in self.stages}
        live.update({t.name: t.live_keys() for t in self.trackers.values()})
        return live

    def key_figures(self, stream: str) -> dict[str, int]:
        """A source stream's cap on live keys (0: none) and the most keys a stage reading
        it holds."""
        cap = self.caps.get(stream)
        live = [self.runners[i].live_keys() for i, s in self.stages if s.input == stream and s.key]
        return {"max_live_keys": cap.cap if cap else 0, "live_keys": max(live, default=0)}

    def firing(self) -> dict[str, int]:
        """How many incidents of each alert are open now."""
        return {alert: tracker.firing() for alert, tracker in self.trackers.items()}
