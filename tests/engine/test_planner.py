"""The planner's choices for the row runner's evaluators (engine.core.planner.operators):
which operator serves a window form, and the window specs it refuses, whatever the
piece that would otherwise have served them (docs/engine.md, *Refused at
construction*)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.evaluator import KeyedEvaluator
from engine.core.plan import (
    R2S,
    AggCall,
    ExtentWindow,
    FrameUnits,
    OverWindow,
    OverWindows,
    Project,
    Query,
    RelationWindow,
    Sink,
    SinkKind,
    Stage,
)
from engine.core.windows.emits import (
    BatchedTimeSlide,
    ExpiryOutputs,
    LastOfInstant,
    RowSlide,
    TimeSlide,
)
from engine.core.windows.extents import ExtentOperator, PaneExtentOperator
from engine.core.windows.frames import (
    ExpiringFrame,
    LaggedRangeFrame,
    LaggedRowsFrame,
    LandmarkFrame,
    RangeFrame,
    ResettingFrame,
    RowsFrame,
)
from engine.core.windows.over import OverOperator
from engine.core.windows.panes import PaneOperator
from engine.core.windows.relations import RowsRelationOperator, TimeRelationOperator
from rules.udas import Silence
from tests.engine.helpers import col

SUM = (AggCall("sum", (col("speed"),), "v"),)
LAST = (AggCall("last", (col("speed"),), "v"),)  # incremental, not algebraic
SILENCE = (AggCall("silence", (col("ts"),), "v", factory=Silence),)  # ESL-shaped


def evaluator(window: Any, r2s: R2S | None = None) -> KeyedEvaluator:
    post = (Project((("v", col("ts")),)),)
    query = Query(Sink("out", SinkKind.STREAM), "s", window=window, post=post, r2s=r2s)
    return KeyedEvaluator(Stage(query))


def over(aggs: tuple[AggCall, ...] = SUM, **spec: Any) -> OverWindow:
    units = spec.pop("units", FrameUnits.RANGE)
    return OverWindow(aggs, units, spec.pop("preceding", 10), **spec)


@pytest.mark.parametrize(
    ("window", "r2s", "frame", "emit"),
    [
        (over(), None, RangeFrame, None),
        (over(units=FrameUnits.ROWS, preceding=3), None, RowsFrame, None),
        (over(units=FrameUnits.ROWS, preceding=3, lag=2), None, LaggedRowsFrame, None),
        (over(lag=5), None, LaggedRangeFrame, None),
        (over(preceding=None, since_ms=5), None, LandmarkFrame, None),
        (over(preceding=None, reset_every_ms=100), None, ResettingFrame, None),
        (over(active_expiration=True), None, ExpiringFrame, ExpiryOutputs),
        (over(slide_ms=5), None, RangeFrame, BatchedTimeSlide),
        (over(slide_ms=5, reset_every_ms=100), None, ResettingFrame, TimeSlide),
        (over(slide_ms=5), R2S.ISTREAM, RangeFrame, TimeSlide),
        (over(LAST, units=FrameUnits.ROWS, preceding=3, slide_rows=2), None, RowsFrame, RowSlide),
        (over(), R2S.ISTREAM, RangeFrame, LastOfInstant),
    ],
)
def test_an_over_window_is_a_frame_and_an_emit_policy(
    window: OverWindow, r2s: R2S | None, frame: type, emit: type | None
) -> None:
    op = evaluator(window, r2s).operator
    assert isinstance(op, OverOperator)
    assert type(op.frame) is frame
    if emit is not None:
        assert type(op.emit) is emit


def test_panes_serve_algebraic_row_slides_and_extents() -> None:
    rows = over(units=FrameUnits.ROWS, preceding=3, slide_rows=2)
    assert type(evaluator(rows).operator) is PaneOperator
    assert type(evaluator(rows, R2S.ISTREAM).operator) is OverOperator  # read as a relation
    assert type(evaluator(ExtentWindow(SUM, 60, 15)).operator) is PaneExtentOperator
    assert type(evaluator(ExtentWindow(LAST, 60, 15)).operator) is ExtentOperator


def test_relation_windows_by_units() -> None:
    rows = RelationWindow(FrameUnits.ROWS, rows=3)
    assert type(evaluator(rows, R2S.ISTREAM).operator) is RowsRelationOperator
    ranged = RelationWindow(FrameUnits.RANGE, range_ms=10)
    assert type(evaluator(ranged, R2S.RSTREAM).operator) is TimeRelationOperator


@pytest.mark.parametrize(
    ("window", "r2s", "message"),
    [
        (over(active_expiration=True, slide_ms=5), None, "ACTIVE EXPIRATION cannot"),
        (over(preceding=None, active_expiration=True), None, "needs a bounded RANGE"),
        (over(lag=5, aggs=SILENCE), None, "incremental aggregates only"),
        (over(since_ms=5), None, "SINCE/UNTIL bounds apply"),
        (over(reset_every_ms=0), None, "positive period"),
        (over(slide_rows=2, slide_ms=5), None, "in rows or in time"),
        # Row slides over algebraic aggregates run on panes: checked all the same.
        (
            over(units=FrameUnits.ROWS, preceding=3, slide_rows=2, active_expiration=True),
            None,
            "needs a bounded RANGE",
        ),
        (
            over(units=FrameUnits.ROWS, preceding=3, slide_rows=2, since_ms=5),
            None,
            "SINCE/UNTIL bounds apply",
        ),
        (ExtentWindow(SUM, 0, 15), None, "must be positive"),
        (ExtentWindow(LAST, 60, 0), None, "must be positive"),
        (OverWindows((over(slide_ms=5), over())), None, "no SLIDE"),
        (OverWindows((over(SILENCE), over())), None, "must be incremental"),
        (RelationWindow(FrameUnits.RANGE, range_ms=10), None, "needs ISTREAM"),
        (RelationWindow(FrameUnits.ROWS, rows=0), R2S.ISTREAM, "at least one row"),
        (RelationWindow(FrameUnits.RANGE, lag_ms=5), R2S.ISTREAM, "LAG applies"),
        (None, R2S.DSTREAM, "DSTREAM needs a window"),
    ],
)
def test_refused_window_specs(window: Any, r2s: R2S | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluator(window, r2s)
