"""Rules over recorded readings: the live engine's :class:`~engine.core.pipeline.Pipeline`,
fed from a file instead of the landing.

Every reading goes through the same sequencer as live: a repeated (source, epoch, seq)
is a duplicate (counted, dropped) or a conflict (set aside), a reading below its
stream's slack watermark is late (set aside, never processed). End of input is a final
heartbeat at :data:`~engine.core.plan.END_OF_TIME` by default: every window closes and
every expiration fires. Ending at a given time closes what that heartbeat would; ending
at the input's own watermarks closes nothing the input did not (nothing expires just
because the recording stops).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from engine.core.evaluator import Output
from engine.core.incidents import IncidentUpdate
from engine.core.keycap import CappedReading
from engine.core.output_order import STAGE, OutputOrder, Runs
from engine.core.partitions import (
    DistinctKeys,
    IncidentKey,
    Partitioning,
    Produced,
    Shares,
)
from engine.core.pipeline import (
    HEARTBEAT,
    BatchResult,
    Conflict,
    LateReading,
    Pipeline,
    fed_stages,
    stream_watermarks,
)
from engine.core.plan import END_OF_TIME, Plan, StreamSchema
from engine.core.runners import SinkRows, emitted_outputs
from engine.core.schema import arrival_type
from engine.core.sequencer import sort_key

Row = dict[str, Any]

__all__ = [
    "STAGE",
    "Finished",
    "LateReading",
    "ReplayResult",
    "arrival_table",
    "run",
    "run_arrivals",
    "run_split",
    "sink_tables",
]


@dataclass
class ReplayResult:
    """What :func:`run` produced: output rows, incidents, late readings, conflicts and
    duplicate counts per stream, all deterministic."""

    outputs: list[Output] = field(default_factory=list)
    incidents: list[IncidentUpdate] = field(default_factory=list)
    """Every incident in its final state, by opening time, alert and key."""
    late: list[LateReading] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    capped: list[CappedReading] = field(default_factory=list)
    """Readings of new keys beyond their stream's cap on live keys, in arrival order."""
    duplicates: dict[str, int] = field(default_factory=dict)
    watermarks: dict[str, int] = field(default_factory=dict)
    """Each source stream's watermark at the end of the input (before the final heartbeat;
    empty for no input)."""
    closed: dict[str, int] = field(default_factory=dict)
    """How many output rows the final heartbeat produced, per output (sink)."""
    emitted: list[SinkRows] = field(default_factory=list)
    """The output rows as the stages emitted them, batch after batch (:attr:`outputs`
    holds them in output order as rows; :func:`sink_tables` as a table per sink); empty
    when they were handed on as they became final (``finished``)."""


Finished = Callable[[Runs], None]
"""Takes output rows as they become final: each sink's next rows in output order, as the
sink's own columns (:class:`~engine.core.output_order.OutputOrder`)."""


def arrival_table(schema: StreamSchema, rows: list[Row]) -> pa.Table:
    """Readings of ``schema`` (dicts, timestamps as epoch ms) as the columns
    :meth:`Pipeline.process` takes; a missing ``source`` or ``epoch`` is ""."""
    columns = {
        c.name: pa.array([r.get(c.name) for r in rows], arrival_type(c.type))
        for c in schema.columns
    }
    columns["source"] = pa.array([r.get("source") or "" for r in rows], pa.string())
    columns["epoch"] = pa.array([r.get("epoch") or "" for r in rows], pa.string())
    columns["seq"] = pa.array([r.get("seq") for r in rows], pa.int64())
    columns[HEARTBEAT] = pa.array([False] * len(rows), pa.bool_())
    return pa.table(columns)


def run(
    plan: Plan,
    readings: Iterable[tuple[str, Row]],
    batch: int = 10_000,
    end_at: int | None = END_OF_TIME,
    caps: Mapping[str, int] | None = None,
) -> ReplayResult:
    """Evaluate ``plan`` over ``(stream, row)`` readings in arrival order, then end with
    a heartbeat at ``end_at`` (int ms; None: none, the input's own watermarks end it).

    Rows carry their stream's columns with the timestamp as int ms; ``source`` and
    ``seq`` default to ``""`` and the arrival index (ties then follow arrival order, and
    such readings are never duplicates of each other). The readings go to the pipeline
    ``batch`` at a time (which bounds memory and, by snapshot-equivalence, does not
    change the result).

    ``caps``: each source stream's cap on live keys (``[engine] max_live_keys``, as the
    live engine has them): readings beyond it are in ``capped``.

    Outputs are ordered by event time, then stage, key and the evaluator's own order;
    late readings in arrival order.
    """
    sources = {s.name: s for s in plan.sources()}
    result = run_arrivals(plan, _row_batches(sources, readings, batch), end_at, caps=caps)
    result.outputs = ordered_outputs(result.emitted)
    return result


def ordered_outputs(emitted: Iterable[SinkRows]) -> list[Output]:
    """Emitted rows as :class:`Output` s, by event time, then stage, key and the
    evaluator's own order."""
    produced: list[tuple[int, int, str, int, Output]] = []
    for item in emitted:
        for key, o in emitted_outputs(item):
            produced.append((o.ts, item.stage, sort_key(key), o.seq, o))
    produced.sort(key=lambda p: p[:4])
    return [p[4] for p in produced]


def _row_batches(
    sources: Mapping[str, StreamSchema], readings: Iterable[tuple[str, Row]], batch: int
) -> Iterator[dict[str, pa.Table]]:
    """``(stream, row)`` readings as arrival tables, ``batch`` readings a time; a
    reading without ``seq`` gets its arrival index."""
    iterator = iter(readings)
    arrived = 0
    while chunk := list(itertools.islice(iterator, batch)):
        by_stream: dict[str, list[Row]] = {}
        for arrival, (stream, row) in enumerate(chunk, start=arrived):
            if row.get("seq") is None:
                row = {**row, "seq": arrival}
            if stream not in sources:
                raise ValueError(f"unknown source stream {stream!r}")
            by_stream.setdefault(stream, []).append(row)
        arrived += len(chunk)
        # Streams are judged apart (each has its own clock), so grouping a chunk's
        # readings by stream keeps every stream's arrival order.
        yield {s: arrival_table(sources[s], rows) for s, rows in by_stream.items()}


def run_arrivals(
    plan: Plan,
    arrivals: Iterable[Mapping[str, pa.Table]],
    end_at: int | None = END_OF_TIME,
    progress: Callable[[int], None] | None = None,
    caps: Mapping[str, int] | None = None,
    finished: Finished | None = None,
) -> ReplayResult:
    """Evaluate ``plan`` over batches of arrivals, each ``{stream: table}`` as
    :meth:`Pipeline.process` takes it (every stream's readings in arrival order; a
    ``seq`` left NULL is numbered by the pipeline's own arrival count), then end with a
    heartbeat at ``end_at`` as :func:`run` does. The outputs are left as the stages
    emitted them (:attr:`ReplayResult.emitted`; :func:`sink_tables` orders them) or,
    given ``finished``, handed to it in output order after every batch, as far as they
    are final (so that a long input's outputs need not fit in memory). ``progress`` is
    told how many readings each batch held once it is evaluated; ``caps`` as :func:`run`
    takes them."""
    pipeline = Pipeline(plan, caps=caps)
    result = ReplayResult()
    produced = Produced()
    ordered = _Handing(plan, finished)
    for tables in arrivals:
        step = pipeline.process(tables)
        _sealed(pipeline)
        _set_aside(result, step)
        produced.take(step)
        ordered.hand_on([produced], step.watermarks)
        result.watermarks = {s: step.watermarks[s] for s in pipeline.sources}
        if progress is not None:
            progress(sum(t.num_rows for t in tables.values()))
    if end_at is not None:
        step = pipeline.finish(end_at)
        _set_aside(result, step)
        produced.closed = produced.take(step)
    ordered.hand_on([produced], None)
    return _merged(result, [produced])


class _Handing:
    """Output rows handed to ``finished`` as they become final (none: left alone)."""

    def __init__(self, plan: Plan, finished: Finished | None) -> None:
        self.finished = finished
        self.stages = fed_stages(plan, [s.name for s in plan.sources()])
        self.order = OutputOrder(rows_only=True)

    def hand_on(
        self, produced: Iterable[Produced | Worker], watermarks: Mapping[str, int] | None
    ) -> None:
        """Take the rows each of ``produced`` emitted since the last time and hand on
        those final once every stage has advanced to the source streams' ``watermarks``
        (None: every row, at the end)."""
        if self.finished is None:
            return
        for part in produced:
            self.order.add(part.drain())
        bounds = None if watermarks is None else stream_watermarks(self.stages, watermarks)
        runs = self.order.finished(bounds)
        if runs:
            self.finished(runs)


class Worker(Protocol):
    """A :class:`~engine.core.partitions.PartitionWorker`, here or in another process."""

    def feed(self, shares: Shares, watermarks: Mapping[str, int]) -> None:
        """A batch's share of the admitted readings, and the judge's watermarks."""

    def end(self, ends: Mapping[str, int] | None) -> None:
        """The final advance (None: none)."""

    def drain(self) -> list[SinkRows]:
        """The rows the worker emitted since the last drain, every batch fed so far
        evaluated."""

    def produced(self) -> Produced:
        """Everything the worker produced (once it has ended) but the rows drained."""


DRAIN_BATCHES = 8
"""A split evaluation handing on final rows takes the workers' rows every this many
batches (each time it waits for them to catch up)."""


def run_split(
    plan: Plan,
    arrivals: Iterable[Mapping[str, pa.Table]],
    split: Partitioning,
    workers: Sequence[Worker],
    end_at: int | None = END_OF_TIME,
    progress: Callable[[int], None] | None = None,
    caps: Mapping[str, int] | None = None,
    finished: Finished | None = None,
    drain_every: int = DRAIN_BATCHES,
) -> ReplayResult:
    """:func:`run_arrivals`, the evaluation split among ``workers`` as ``split`` says
    (:mod:`engine.core.partitions`; worker ``i`` runs ``split.groups_of(i)``), the
    central stages here: the same result; ``finished`` is handed the final rows every
    ``drain_every`` batches. Raises
    :class:`~engine.core.partitions.CapReachable` as soon as a cap on live keys could
    quarantine a reading (then evaluate with :func:`run_arrivals`)."""
    judge = Pipeline(plan, only=split.central)
    keys = DistinctKeys(plan, caps or {})
    result = ReplayResult()
    central = Produced()
    ordered = _Handing(plan, finished)
    for number, tables in enumerate(arrivals, start=1):
        step, admitted = judge.judge(tables)
        _sealed(judge)
        _set_aside(result, step)
        keys.add(admitted)
        for worker, share in zip(workers, split.split(admitted), strict=True):
            worker.feed(share, step.watermarks)
        central.take(judge.feed(admitted, step.watermarks))
        if number % drain_every == 0:
            ordered.hand_on([central, *workers], step.watermarks)
        result.watermarks = dict(step.watermarks)
        if progress is not None:
            progress(sum(t.num_rows for t in tables.values()))
    ends = None if end_at is None else judge.marks(dict.fromkeys(judge.sources, end_at))
    for worker in workers:  # every worker ends at once, then each is waited for
        worker.end(ends)
    if ends is not None:
        central.closed = central.take(judge.feed({}, ends))
    produced = [central, *(worker.produced() for worker in workers)]
    ordered.hand_on(produced, None)
    return _merged(result, produced)


def _sealed(pipeline: Pipeline) -> None:
    """What the live engine's save does after every batch: the batch's readings' values
    join those a later repeat of their ids is compared with (without it a redelivery in
    a later batch would be a conflict, however it was batched)."""
    for sequencer in pipeline.sequencers.values():
        sequencer.seal()


def _set_aside(result: ReplayResult, step: BatchResult) -> None:
    result.late += step.late
    result.conflicts += step.conflicts
    result.capped += step.capped
    for stream, count in step.duplicates.items():
        result.duplicates[stream] = result.duplicates.get(stream, 0) + count


def _merged(result: ReplayResult, produced: Sequence[Produced]) -> ReplayResult:
    """``result`` with the outputs, incidents and final-close counts of ``produced``."""
    incidents: dict[IncidentKey, IncidentUpdate] = {}
    closed: Counter[str] = Counter()
    for part in produced:
        result.emitted += part.emitted
        incidents.update(part.incidents)
        closed.update(part.closed)
    result.closed = dict(closed)
    result.incidents = [incidents[k] for k in sorted(incidents, key=lambda k: (k[2], k[0], k[1]))]
    return result


def sink_tables(emitted: Iterable[SinkRows]) -> dict[str, pa.Table] | None:
    """The emitted rows of each sink in one table, in :func:`run`'s output order (event
    time, stage, key, the evaluator's own order), with the engine's columns and
    :data:`STAGE`; sinks are in order of their first rows. None when the tables of some
    sink differ in their columns' names, order or types (a NULL column aside), which
    one table cannot hold as the rows hold them: take :func:`run`'s rows then."""
    order = OutputOrder()
    order.add(emitted)
    tables = {}
    for sink, runs in order.finished().items():
        if len(runs) > 1:
            return None
        tables[sink] = runs[0]
    return tables
