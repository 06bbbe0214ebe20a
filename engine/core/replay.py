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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from engine.core.evaluator import Output
from engine.core.incidents import IncidentUpdate
from engine.core.keycap import CappedReading
from engine.core.pipeline import (
    HEARTBEAT,
    BatchResult,
    Conflict,
    LateReading,
    Pipeline,
)
from engine.core.plan import END_OF_TIME, Plan, StreamSchema
from engine.core.runners import emitted_outputs
from engine.core.schema import arrival_type
from engine.core.sequencer import sort_key

Row = dict[str, Any]

__all__ = ["LateReading", "ReplayResult", "arrival_table", "run"]


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
    pipeline = Pipeline(plan, caps=caps)
    result = ReplayResult()
    produced: list[tuple[int, int, str, int, Output]] = []

    incidents: dict[tuple[str, str, int], IncidentUpdate] = {}

    def collect(step: BatchResult) -> Counter[str]:
        """Take in what a step produced; return its number of output rows per sink."""
        rows: Counter[str] = Counter()
        for update in step.incidents:
            incidents[(update.alert, update.key, update.opened_at)] = update
        result.late += step.late
        result.conflicts += step.conflicts
        result.capped += step.capped
        for stream, count in step.duplicates.items():
            result.duplicates[stream] = result.duplicates.get(stream, 0) + count
        for emitted in step.outputs:
            for key, o in emitted_outputs(emitted):
                produced.append((o.ts, emitted.stage, sort_key(key), o.seq, o))
                rows[o.sink] += 1
        return rows

    iterator = iter(readings)
    arrived = 0
    while chunk := list(itertools.islice(iterator, batch)):
        by_stream: dict[str, list[Row]] = {}
        order: list[str] = []
        for arrival, (stream, row) in enumerate(chunk, start=arrived):
            if row.get("seq") is None:
                row = {**row, "seq": arrival}
            if stream not in pipeline.sources:
                raise ValueError(f"unknown source stream {stream!r}")
            if stream not in by_stream:
                order.append(stream)
            by_stream.setdefault(stream, []).append(row)
        arrived += len(chunk)
        # Streams are judged apart (each has its own clock), so grouping a chunk's
        # readings by stream keeps every stream's arrival order.
        step = pipeline.process(
            {s: arrival_table(pipeline.sources[s], by_stream[s]) for s in order}
        )
        collect(step)
        result.watermarks = {s: step.watermarks[s] for s in pipeline.sources}
    if end_at is not None:
        result.closed = dict(collect(pipeline.finish(end_at)))
    produced.sort(key=lambda p: p[:4])
    result.outputs = [p[4] for p in produced]
    result.incidents = [incidents[k] for k in sorted(incidents, key=lambda k: (k[2], k[0], k[1]))]
    return result
