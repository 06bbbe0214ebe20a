"""Which runner runs a stage (chosen once, when a pipeline is built).

A stage runs per column (:mod:`engine.core.columnar`) when every part of it has a
columnar form: its window is a form those runners compute (built-in aggregates with no
active expiration, lag, periodic reset, fixed bounds or relation-to-stream operator; or
active expiration over an aggregate declared ``newest_only``) and every expression of
the query and of the stateless queries it feeds was compiled to columns. Anything else
(other user-defined aggregates, CQL relations) runs row by row
(:class:`~engine.core.runners.RowRunner`). Both give the same rows.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from engine.core.columnar.aggregates import columnar_call
from engine.core.columnar.expiry import NewestExpiryRunner, newest_only_call
from engine.core.columnar.extents import ExtentRunner
from engine.core.columnar.frames import (
    Frame,
    RangeFrame,
    RowsFrame,
    SlicedRowsFrame,
    SliceLoader,
    UnboundedFrame,
)
from engine.core.columnar.ops import vectorised
from engine.core.columnar.over import EveryRow, OverRunner, RowSlide, TimeSlide
from engine.core.columnar.short_rows import SHORT_ROWS_BELOW, ShortRowsRunner, short_rows_calls
from engine.core.columnar.stateless import StatelessRunner
from engine.core.plan import R2S, ExtentWindow, FrameUnits, OverWindow, Stage
from engine.core.runners import HasStore, RowRunner, StageRunner

SLICED_ROWS_FROM = 128
"""A ``ROWS n PRECEDING`` frame with ``n`` at least this keeps its rows in slices
(:class:`SlicedRowsFrame`); a shorter one in the key's state (:class:`RowsFrame`)."""


def columnar(stage: Stage) -> bool:
    """Whether `stage` runs per column (module docstring)."""
    query = stage.query
    steps = [*query.pre, *query.post]
    for downstream in stage.downstream:
        steps += [*downstream.pre, *downstream.post]
        if downstream.r2s not in (None, R2S.ISTREAM, R2S.RSTREAM):
            return False
    if not vectorised(steps):
        return False
    window = query.window
    if window is None:
        return query.r2s in (None, R2S.ISTREAM, R2S.RSTREAM)
    if query.r2s is not None:
        return False
    if isinstance(window, OverWindow):
        return columnar_over(window) or columnar_expiry(window)
    if isinstance(window, ExtentWindow):
        return all(columnar_call(c) for c in window.aggregates)
    return False


def columnar_over(window: OverWindow) -> bool:
    """Whether :class:`OverRunner` computes ``window``: built-in aggregates, no active
    expiration, lag, reset or fixed bounds."""
    return (
        not window.active_expiration
        and not window.lag
        and window.reset_every_ms is None
        and window.since_ms is None
        and window.until_ms is None
        and all(columnar_call(c) for c in window.aggregates)
    )


def columnar_expiry(window: OverWindow) -> bool:
    """Whether ``window`` is a RANGE frame with active expiration over one aggregate that
    declares ``newest_only`` (columnar arguments), and nothing else
    (:class:`NewestExpiryRunner`)."""
    calls = window.aggregates
    return (
        window.active_expiration
        and window.units is FrameUnits.RANGE
        and window.preceding is not None
        and not window.lag
        and window.slide_rows is None
        and window.slide_ms is None
        and window.reset_every_ms is None
        and window.since_ms is None
        and window.until_ms is None
        and len(calls) == 1
        and newest_only_call(calls[0])
    )


def over_frame(window: OverWindow) -> Callable[[SliceLoader], Frame]:
    """The columnar frame of ``window`` (given how its runner reads a slice back)."""
    reach = window.preceding
    if reach is None:
        peers = window.units is FrameUnits.RANGE
        return lambda load: UnboundedFrame(peers)
    if window.units is FrameUnits.ROWS and reach < SLICED_ROWS_FROM:
        return lambda load: RowsFrame(reach)
    if window.units is FrameUnits.ROWS:
        return partial(SlicedRowsFrame, reach)
    return partial(RangeFrame, reach)


def short_rows(window: OverWindow) -> bool:
    """Whether :class:`ShortRowsRunner` computes ``window``: a short ``ROWS n
    PRECEDING`` frame, every row an output, counts and extremes only."""
    return (
        window.units is FrameUnits.ROWS
        and window.preceding is not None
        and window.preceding + 1 < SHORT_ROWS_BELOW
        and not window.slide_rows
        and not window.slide_ms
        and short_rows_calls(window.aggregates)
    )


def over_emit(window: OverWindow) -> EveryRow:
    """The columnar emit policy of ``window``."""
    if window.slide_rows:
        return RowSlide(window.slide_rows)
    if window.slide_ms:
        return TimeSlide(window.slide_ms)
    return EveryRow()


def runner_for(index: int, stage: Stage, owner: HasStore) -> StageRunner:
    """The runner of `stage` (plan index `index`) in `owner` (a pipeline)."""
    if not columnar(stage):
        return RowRunner(index, stage, owner)
    window = stage.query.window
    if isinstance(window, OverWindow) and window.active_expiration:
        return NewestExpiryRunner(index, stage, owner)
    if isinstance(window, OverWindow) and short_rows(window):
        assert window.preceding is not None
        return ShortRowsRunner(index, stage, owner, window.preceding)
    if isinstance(window, OverWindow):
        return OverRunner(index, stage, owner, over_frame(window), over_emit(window))
    if isinstance(window, ExtentWindow):
        return ExtentRunner(index, stage, owner)
    return StatelessRunner(index, stage, owner)
