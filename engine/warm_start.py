"""Warm start: a new or edited rule begins with its windows full, as if it had always run.

A pipeline resumed on a store that never saw one of its stages (or saw another
definition of it) names the stage in :attr:`~engine.core.pipeline.Pipeline.fresh`.
:func:`warm_start` evaluates those stages over the stored readings (the lakehouse's
readings tables, :mod:`engine.history`), in a pipeline of their own holding only them
and the stages that feed them, from far enough back to fill their windows up to
exactly where the live pipeline stands (:meth:`~engine.core.pipeline.Pipeline.positions`:
every reading below a stream's position has been evaluated, none above). The fresh
stages' state is then handed to the live pipeline
(:meth:`~engine.core.pipeline.Pipeline.adopt`), which goes on from there with the next
readings: no reading is missed, none is seen twice.

**How far back.** Each stage reaches back as far as its windows do (:func:`reach_ms`: a
RANGE's length and slide, a landmark's reset period); stages feeding it add theirs.
Windows bounded by a count of rows, or with no bound (ROWS n, UNBOUNDED, a pattern
without WITHIN), reach back ``backfill_ms`` at most. On top of the reach, ``backfill_ms``
more history is read so that a new derived stream's table gets its rows for that past
(with its windows full), and the dashboard's charts of it are complete.

**What is written.** The past rows of a new rule's derived streams over the last
``backfill_ms``; its alerts for the past only when asked (``alert_history``): a rule
deployed now raises alerts from now on. An edited rule's derived table keeps its old
rows (no second copy of the past is written). Incidents start at the deploy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pyarrow.compute as pc

from engine.core.pipeline import NEW, BatchResult, Pipeline, stage_sinks
from engine.core.plan import (
    END_OF_TIME,
    ExtentWindow,
    FrameUnits,
    OverWindow,
    OverWindows,
    Plan,
    RelationWindow,
    SinkKind,
    Stage,
    Window,
)
from engine.core.runners import STAGE_PIECE_KINDS, STAGE_STATE_KINDS, TS, SinkRows
from engine.core.state import MemoryStore, StateKey
from engine.core.subplan import needed_plan
from engine.history import event_time_slices, open_readings, stored_readings
from lookout.config import S3Config
from lookout.storage import DEFAULT_S3

SLICE_MS = 5 * 60_000
"""Event time evaluated per batch of the warm start: bounds what it holds at once."""


@dataclass
class WarmStart:
    """What a warm start did: the state it filled (store entries of the fresh stages),
    the past rows to write (of ``plan``, the cut-down plan it ran), and figures."""

    stages: dict[str, str]
    """The stages warmed, each new or edited."""
    plan: Plan
    entries: list[tuple[StateKey, bytes]] = field(default_factory=list)
    past: BatchResult = field(default_factory=BatchResult)
    start_ms: int | None = None
    """The first instant of history read (None: the pipeline had evaluated nothing yet)."""
    readings: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        """One line for the engine's log."""
        names = ", ".join(f"{name} ({why})" for name, why in sorted(self.stages.items()))
        if self.start_ms is None:
            return f"rules {names} start with the stream (nothing evaluated before)"
        rows = sum(t.table.num_rows for t in self.past.outputs)
        return (
            f"rules {names} warmed from {self.readings:,} stored readings since "
            f"{_iso(self.start_ms)} in {self.seconds:.1f} s ({rows:,} past rows written)"
        )


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def window_reach_ms(window: Window | None, unbounded_ms: int) -> int:
    """How far back before an instant a window may look for the rows that make its
    output there (`unbounded_ms` for a window bounded by a count of rows, or not at
    all)."""
    if window is None:
        return 0
    if isinstance(window, OverWindows):
        return max(window_reach_ms(w, unbounded_ms) for w in window.windows)
    if isinstance(window, ExtentWindow):
        return window.range_ms + window.slide_ms
    if not isinstance(window, OverWindow | RelationWindow):
        return unbounded_ms  # ROWS n GROUP BY, patterns: bounded by rows or not at all
    bounds = [] if window.reset_every_ms is None else [window.reset_every_ms]
    if window.units == FrameUnits.RANGE:
        span = window.preceding if isinstance(window, OverWindow) else window.range_ms
        lag = window.lag if isinstance(window, OverWindow) else window.lag_ms
        if span is not None:
            bounds.append(span + (window.slide_ms or 0) + lag)
    return min(bounds) if bounds else unbounded_ms


def reach_ms(plan: Plan, unbounded_ms: int) -> int:
    """How far back `plan`'s stages may look, in all: the sum over its stages (a chain
    of windows reaches back as far as its windows together)."""
    return sum(
        max(window_reach_ms(q.window, unbounded_ms) for q in (stage.query, *stage.downstream))
        for stage in plan.stages()
    )


def warm_start(
    pipeline: Pipeline,
    lakehouse: str,
    backfill_ms: int,
    alert_history: bool = False,
    s3: S3Config = DEFAULT_S3,
) -> WarmStart | None:
    """Fill the windows of `pipeline`'s fresh stages from the readings stored in
    `lakehouse` (see the module docstring); None when no stage is fresh. The caller
    hands :attr:`WarmStart.entries` to :meth:`Pipeline.adopt` and writes
    :attr:`WarmStart.past`."""
    if not pipeline.fresh:
        return None
    began = time.perf_counter()
    fresh = dict(pipeline.fresh)
    stages = [stage for _, stage in pipeline.stages if stage.name in fresh]
    plan = needed_plan(pipeline.plan, {sink for stage in stages for sink in stage_sinks(stage)})
    warm = WarmStart(fresh, plan)
    positions = pipeline.positions()
    marks = {
        s.name: positions[s.name]
        for s in plan.sources()
        if positions.get(s.name, -END_OF_TIME) > -END_OF_TIME
    }
    if not marks:
        return warm
    start = min(marks.values()) - backfill_ms - reach_ms(plan, backfill_ms)
    tables = {}
    for name, mark in marks.items():
        stored = open_readings(lakehouse, name, s3)
        if stored is not None:
            tables[name] = stored_readings(plan.streams[name], stored, start, mark)
    backfill = Pipeline(plan, store=MemoryStore(), evict=pipeline.evict)
    outputs: list[SinkRows] = []
    for batch in event_time_slices(plan, tables, SLICE_MS):
        outputs += backfill.process(batch).outputs
    outputs += backfill.advance_to(marks).outputs
    backfill.save()
    store = backfill.store
    assert isinstance(store, MemoryStore)
    warm.entries = [
        (entry, data)
        for kind in (*STAGE_STATE_KINDS, *STAGE_PIECE_KINDS)
        for entry, data in store.scan(kind)
        if entry[1] in fresh
    ]
    since = min(marks.values()) - backfill_ms
    warm.past = _past(
        plan, [s for s in stages if fresh[s.name] == NEW], outputs, since, alert_history
    )
    warm.start_ms = start
    warm.readings = sum(t.num_rows for t in tables.values())
    warm.seconds = time.perf_counter() - began
    return warm


def _past(
    plan: Plan,
    stages: list[Stage],
    outputs: list[SinkRows],
    since: int,
    alert_history: bool,
) -> BatchResult:
    """The warm start's rows to write: the new `stages`' derived-stream rows from `since`
    on, and their alerts too with `alert_history`."""
    kinds = {q.sink.name: q.sink.kind for q in plan.queries}
    new = {sink for stage in stages for sink in stage_sinks(stage)}
    written = []
    for emitted in outputs:
        if emitted.sink not in new or (kinds[emitted.sink] == SinkKind.ALERT and not alert_history):
            continue
        kept = emitted.table.filter(pc.greater_equal(emitted.table.column(TS), since))
        if kept.num_rows:
            written.append(SinkRows(emitted.stage, emitted.sink, kept))
    return BatchResult(outputs=written)
