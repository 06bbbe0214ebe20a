"""Which window operator, built from which pieces, serves a stage's keyed evaluators;
and the checks that refuse window specs no piece serves (``ValueError``).

The decisions are taken once per stage (:func:`evaluator_pieces`); what they give makes
one operator per key. Every branch on a window's form is here: operators and pieces
take what they are handed (:mod:`engine.core.windows`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from engine.core.aggregates import make_aggregate
from engine.core.grouped import RowsGroupOperator
from engine.core.pattern_plan import PatternWindow
from engine.core.patterns import PatternOperator
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
    RowOps,
    RowsGroupWindow,
    Stage,
)
from engine.core.several import SeveralOverOperator
from engine.core.windows.base import Operator, StatelessOperator
from engine.core.windows.contents import (
    CallSlot,
    Contents,
    IncrementalContents,
    MixedContents,
    PruningContents,
    slot_kind,
)
from engine.core.windows.emits import (
    BatchedTimeSlide,
    EveryTuple,
    ExpiryOutputs,
    LastOfInstant,
    RelationExpiryOutputs,
    RowSlide,
    TimeSlide,
)
from engine.core.windows.extents import ExtentOperator, PaneExtentOperator
from engine.core.windows.frames import (
    Band,
    ExpiringFrame,
    Frame,
    LaggedLandmarkFrame,
    LaggedRangeFrame,
    LaggedRowsFrame,
    LandmarkFrame,
    RangeFrame,
    ResettingFrame,
    RowsFrame,
    UnboundedRowsFrame,
)
from engine.core.windows.over import OverOperator
from engine.core.windows.panes import PaneOperator
from engine.core.windows.relations import (
    BandedInterval,
    ExtentInterval,
    Interval,
    PeriodInterval,
    RangeInterval,
    RowsRelationOperator,
    TimeRelationOperator,
)
from engine.core.windows.streams import (
    ChangesAfterTimers,
    ChangesAtExtentEnds,
    RelationChanges,
    StreamRows,
    dstream,
    istream,
    rstream,
)

MAX_EXTENT_PANES = 4096
"""An extent window runs on panes only if an extent spans at most this many (``r /
gcd(r, s)``): its state is then bounded whatever the tuple rate."""

STREAMS: dict[R2S, StreamRows] = {R2S.ISTREAM: istream, R2S.DSTREAM: dstream, R2S.RSTREAM: rstream}


@dataclass(frozen=True)
class EvaluatorPieces:
    """What a stage's evaluators are made of.

    * ``operator`` makes the window operator of one key;
    * ``changes`` makes the relation-to-stream step the evaluator applies itself, given
      the query's compiled ``post`` (None: rows pass as they are);
    * ``final``: the operator's results are the query's rows (it ran ``post`` itself);
    * ``copies``: extents whose results the SELECT list only copies, with nothing
      reading the sink inside the stage, leave as columns: the row key each output
      column copies (None: as rows).
    """

    operator: Callable[[], Operator]
    changes: Callable[[RowOps], RelationChanges] | None = None
    final: bool = False
    copies: tuple[str, ...] | None = None


def evaluator_pieces(stage: Stage) -> EvaluatorPieces:
    """The pieces of ``stage``'s evaluators (class docstring)."""
    query = stage.query
    window = query.window
    make = _operator(query)
    changes = _changes(query)
    copies = None
    post = query.post
    if (
        isinstance(window, ExtentWindow)
        and extent_pane_eligible(window)
        and changes is None
        and len(post) == 1
        and isinstance(post[0], Project)
        and query.sink.name not in {q.input for q in stage.downstream}
    ):
        copies = post[0].copies
    return EvaluatorPieces(make, changes, isinstance(window, RelationWindow), copies)


def _operator(query: Query) -> Callable[[], Operator]:
    window, r2s = query.window, query.r2s
    if isinstance(window, OverWindows):
        if r2s is not None:
            raise ValueError("several OVER windows are not read as a relation")
        return several_operator(window)
    if isinstance(window, RowsGroupWindow):
        if r2s is None:
            raise ValueError("a grouped ROWS window needs ISTREAM, DSTREAM or RSTREAM")
        return partial(RowsGroupOperator, window)
    if isinstance(window, PatternWindow):
        if r2s is not None:
            raise ValueError("MATCH_RECOGNIZE's rows are a stream: no ISTREAM / DSTREAM / RSTREAM")
        return partial(PatternOperator, window)
    if isinstance(window, RelationWindow):
        if r2s is None:
            raise ValueError("a relation window needs ISTREAM, DSTREAM or RSTREAM")
        return relation_operator(window, r2s, query)
    if isinstance(window, OverWindow):
        return over_operator(window, relation=r2s is not None)
    if isinstance(window, ExtentWindow):
        return extent_operator(window)
    return StatelessOperator


def _changes(query: Query) -> Callable[[RowOps], RelationChanges] | None:
    """The relation-to-stream step the evaluator applies itself."""
    window, r2s = query.window, query.r2s
    if r2s is None or isinstance(window, RelationWindow):
        return None  # a relation window applies its operator itself
    if window is None:
        if r2s is not R2S.DSTREAM:
            return None  # ISTREAM / RSTREAM (S [NOW]) is S
        raise ValueError("DSTREAM needs a window (extent or OVER)")
    if isinstance(window, ExtentWindow):
        return partial(ChangesAtExtentEnds, STREAMS[r2s])
    if isinstance(window, OverWindow) and window.active_expiration:
        return partial(ChangesAfterTimers, STREAMS[r2s])
    return partial(RelationChanges, STREAMS[r2s])


def over_operator(window: OverWindow, relation: bool = False) -> Callable[[], Operator]:
    """The operator of a data-driven window; ``relation``: read as a CQL relation (only
    the last tuple of an instant counts)."""
    check_over(window)
    if not relation and pane_eligible(window):
        assert window.preceding is not None and window.slide_rows is not None
        return partial(PaneOperator, window.aggregates, window.preceding, window.slide_rows)
    return _over_operator(window, relation)


def _over_operator(window: OverWindow, relation: bool) -> Callable[[], OverOperator]:
    """A checked window's :class:`OverOperator`: its frame and emit policy."""
    calls = window.aggregates
    kinds = tuple(slot_kind(c) for c in calls)
    incremental = all(kind is CallSlot for kind in kinds)
    if window.lag and not incremental:
        raise ValueError("a lagged window takes incremental aggregates only")
    bounded_range = window.units is FrameUnits.RANGE and window.preceding is not None
    # A RANGE frame's tuples leave by time, so with only ESL-shaped aggregates the ones
    # deleted from every inwindow may go at once. Not for ROWS frames (they count
    # deleted tuples) nor a relation (each expiry replaces its rows).
    prunes = bounded_range and CallSlot not in kinds and not relation
    contents = _contents(calls, kinds, prunes)
    batched = slot_batching(window, incremental, relation)
    # A buffer that only appends tuples and expires them by time may live in chunks.
    chunk_span = None
    if bounded_range and not relation and not prunes:
        assert window.preceding is not None
        chunk_span = window.preceding + window.lag

    def make() -> OverOperator:
        frame, expiring = _frame(window, contents())
        emit = _emit(window, relation, frame, expiring, batched)
        return OverOperator(frame, emit, chunk_span)

    return make


def _contents(
    calls: tuple[AggCall, ...], kinds: tuple[type[CallSlot], ...], prunes: bool
) -> Callable[[], Contents]:
    if all(kind is CallSlot for kind in kinds):
        return partial(IncrementalContents, calls)
    return partial(PruningContents if prunes else MixedContents, calls, kinds)


def _frame(window: OverWindow, contents: Contents) -> tuple[Frame, ExpiringFrame | None]:
    """The frame of ``window`` over ``contents``, and it again if it expires actively."""
    reach, lag = window.preceding, window.lag
    band = Band(window.since_ms, window.until_ms)
    frame: Frame
    expiring = None
    if window.units is FrameUnits.ROWS:
        rows = RowsFrame(contents, reach) if reach is not None else UnboundedRowsFrame(contents)
        frame = LaggedRowsFrame(rows, lag) if lag else rows
    elif window.active_expiration:
        assert reach is not None  # check_over
        frame = expiring = ExpiringFrame(contents, reach)
    elif lag:
        frame = (
            LaggedRangeFrame(contents, reach, lag)
            if reach is not None
            else LaggedLandmarkFrame(contents, lag, band)
        )
    else:
        frame = RangeFrame(contents, reach) if reach is not None else LandmarkFrame(contents, band)
    if window.reset_every_ms is not None:
        frame = ResettingFrame(frame, window.reset_every_ms)
    return frame, expiring


def _emit(
    window: OverWindow,
    relation: bool,
    frame: Frame,
    expiring: ExpiringFrame | None,
    batched: bool,
) -> EveryTuple:
    """The emit policy of ``window`` over ``frame``."""
    calls = window.aggregates
    if expiring is not None:
        kind = RelationExpiryOutputs if relation else ExpiryOutputs
        return kind(frame, calls, expiring)
    if window.slide_rows:
        return RowSlide(frame, calls, window.slide_rows)
    if window.slide_ms:
        if batched:
            assert isinstance(frame, RangeFrame) and isinstance(frame.contents, IncrementalContents)
            return BatchedTimeSlide(frame, calls, window.slide_ms, frame.contents, frame.reach)
        return TimeSlide(frame, calls, window.slide_ms)
    return LastOfInstant(frame, calls) if relation else EveryTuple(frame, calls)


def slot_batching(window: OverWindow, incremental: bool, relation: bool) -> bool:
    """Whether a time slide takes a slot's arrivals in one call: over a bounded RANGE
    frame with passive expiry and no lag or reset, incremental aggregates, not read as
    a relation. Then a slot's tuples only enter and leave the frame."""
    return (
        window.units is FrameUnits.RANGE
        and window.preceding is not None
        and not window.active_expiration
        and not window.lag
        and window.reset_every_ms is None
        and incremental
        and not relation
    )


def several_operator(window: OverWindows) -> Callable[[], Operator]:
    """Several OVER windows of one SELECT, one operator per window and partition."""
    for w in window.windows:
        if w.slide_rows or w.slide_ms or w.active_expiration:
            raise ValueError("several OVER windows take no SLIDE or ACTIVE EXPIRATION")
        for call in w.aggregates:
            if slot_kind(call) is not CallSlot:
                raise ValueError(f"'{call.name}' in several OVER windows must be incremental")
    for w in window.windows:
        check_over(w)
    makers = [_over_operator(w, relation=False) for w in window.windows]
    return partial(SeveralOverOperator, window, makers)


def extent_operator(window: ExtentWindow) -> Callable[[], Operator]:
    """Extents on panes where they fit, else on tuples."""
    if window.range_ms <= 0 or window.slide_ms <= 0:
        raise ValueError("extent RANGE and SLIDE must be positive")
    if extent_pane_eligible(window):
        return partial(PaneExtentOperator, window)
    calls = window.aggregates
    contents = _contents(calls, tuple(slot_kind(c) for c in calls), prunes=False)
    return lambda: ExtentOperator(contents(), window)


def relation_operator(window: RelationWindow, r2s: R2S, query: Query) -> Callable[[], Operator]:
    """A CQL window of raw tuples under ``r2s``, applying ``query``'s post ops."""
    check_relation(window)
    stream = STREAMS[r2s]
    if window.units is FrameUnits.ROWS:
        assert window.rows is not None
        return partial(RowsRelationOperator, window.rows, stream, query.post)
    interval: Interval
    if window.slide_ms is not None:
        assert window.range_ms is not None
        interval = ExtentInterval(window.range_ms, window.slide_ms)
    elif window.range_ms is not None:
        interval = RangeInterval(window.range_ms, window.lag_ms)
    elif window.reset_every_ms:
        interval = PeriodInterval(window.reset_every_ms)
    else:
        interval = Interval()
    if window.since_ms is not None or window.until_ms is not None:
        interval = BandedInterval(interval, Band(window.since_ms, window.until_ms))
    # Members that never leave are kept only for RSTREAM, which streams all of R.
    keep = window.range_ms is not None or bool(window.reset_every_ms) or r2s is R2S.RSTREAM
    return partial(TimeRelationOperator, interval, keep, stream, query.post)


def pane_eligible(window: OverWindow) -> bool:
    """Whether :class:`PaneOperator` can run ``window``: a plain ROWS frame sliding by
    more than one row, over algebraic aggregates only."""
    if not (
        window.units is FrameUnits.ROWS
        and window.preceding is not None
        and window.slide_rows is not None
        and window.slide_rows > 1
        and not window.lag
        and window.reset_every_ms is None
    ):
        return False
    return all(algebraic(c) for c in window.aggregates)


def extent_pane_eligible(window: ExtentWindow) -> bool:
    """Whether :class:`PaneExtentOperator` runs ``window``: algebraic aggregates only, and
    at most :data:`MAX_EXTENT_PANES` panes per extent."""
    panes = window.range_ms // math.gcd(window.range_ms, window.slide_ms)
    return panes <= MAX_EXTENT_PANES and all(algebraic(c) for c in window.aggregates)


def algebraic(call: AggCall) -> bool:
    """Whether the call's partials merge: declared ALGEBRAIC (UDA), or a built-in that is."""
    if call.factory is not None:
        return call.algebraic
    return bool(getattr(make_aggregate(call.name, call.factory), "algebraic", False))


def check_over(window: OverWindow) -> None:
    """Reject window specs the semantics pins do not define."""
    bounded_range = window.units is FrameUnits.RANGE and window.preceding is not None
    if window.active_expiration and not bounded_range:
        raise ValueError("ACTIVE EXPIRATION needs a bounded RANGE frame")
    if window.active_expiration and (window.slide_rows or window.slide_ms or window.lag):
        raise ValueError("ACTIVE EXPIRATION cannot be combined with SLIDE or LAG")
    if window.slide_rows and window.slide_ms:
        raise ValueError("a window slides in rows or in time, not both")
    if (window.since_ms is not None or window.until_ms is not None) and (
        window.units is not FrameUnits.RANGE or window.preceding is not None
    ):
        raise ValueError("SINCE/UNTIL bounds apply to RANGE landmark windows only")
    if window.reset_every_ms is not None and window.reset_every_ms <= 0:
        raise ValueError("RESET EVERY needs a positive period")
    if window.lag < 0:
        raise ValueError("LAG cannot be negative")


def check_relation(window: RelationWindow) -> None:
    """Reject relation windows the definitions do not cover."""
    if window.units is FrameUnits.ROWS:
        if window.rows is None or window.rows < 1:
            raise ValueError("a ROWS relation window holds at least one row")
        times = (window.range_ms, window.slide_ms, window.reset_every_ms, window.since_ms)
        if any(v is not None for v in (*times, window.until_ms)) or window.lag_ms:
            raise ValueError("a ROWS relation window has no time parameters")
        return
    if window.rows is not None:
        raise ValueError("a RANGE relation window has no row count")
    if window.range_ms is not None and window.range_ms < 0:
        raise ValueError("RANGE cannot be negative")
    if window.lag_ms < 0:
        raise ValueError("LAG cannot be negative")
    if window.slide_ms is not None and (
        window.slide_ms <= 0 or window.range_ms is None or window.range_ms <= 0 or window.lag_ms
    ):
        raise ValueError("a sliding relation window needs positive RANGE and SLIDE, no LAG")
    bounded = window.since_ms is not None or window.until_ms is not None
    if (bounded or window.reset_every_ms is not None) and window.range_ms is not None:
        raise ValueError("bounds and RESET EVERY apply to unbounded relation windows only")
    if window.reset_every_ms is not None and window.reset_every_ms <= 0:
        raise ValueError("RESET EVERY needs a positive period")
    if window.lag_ms and window.range_ms is None:
        raise ValueError("LAG applies to a bounded RANGE relation window only")
