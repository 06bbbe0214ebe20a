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

from engine.core.columnar import StatelessRunner
from engine.core.columnar.aggregates import columnar_call
from engine.core.columnar.expiry import NewestExpiryRunner, columnar_expiry
from engine.core.columnar.extents import ExtentRunner, columnar_extent
from engine.core.columnar.ops import vectorised
from engine.core.columnar.over import OverRunner, columnar_over
from engine.core.plan import R2S, ExtentWindow, OverWindow, Stage
from engine.core.runners import HasStore, RowRunner, StageRunner


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
        return columnar_extent(window) and all(columnar_call(c) for c in window.aggregates)
    return False


def runner_for(index: int, stage: Stage, owner: HasStore) -> StageRunner:
    """The runner of `stage` (plan index `index`) in `owner` (a pipeline)."""
    if not columnar(stage):
        return RowRunner(index, stage, owner)
    window = stage.query.window
    if isinstance(window, OverWindow) and window.active_expiration:
        return NewestExpiryRunner(index, stage, owner)
    if isinstance(window, OverWindow):
        return OverRunner(index, stage, owner)
    if isinstance(window, ExtentWindow):
        return ExtentRunner(index, stage, owner)
    return StatelessRunner(index, stage, owner)
