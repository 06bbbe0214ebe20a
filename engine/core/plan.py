"""The plan: the intermediate representation the rule compiler produces and the engine runs.

Contract (read by ``rules/language`` and ``engine/spark``; changes here are additive only):

* **Time** is ``int`` epoch milliseconds UTC everywhere (event times, durations, slack,
  watermarks). :data:`END_OF_TIME` is the final heartbeat at +infinity: advancing to it
  closes every window and fires every pending expiration.
* **Expressions** are plain Python callables ``Callable[[Mapping[str, Any]], Any]``
  (:data:`Expr`) built by the compiler. They read a row (column name -> value, timestamps
  as int ms) and return a value; ``None`` is SQL NULL. The engine never parses or
  evaluates text.
* A :class:`Plan` is the set of stream schemas (sources and derived streams) plus the
  compiled queries, one per ``CREATE STREAM ... AS`` / ``CREATE ALERT ... AS``
  statement. A :class:`Query` reads one stream, applies stateless ``pre`` ops (joins
  with reference tables as :class:`LookupJoin`, then the SQL ``WHERE``), at most one
  window (:class:`OverWindow` for ``agg OVER (...)``, :class:`OverWindows` for several,
  :class:`ExtentWindow` for ``FROM s [RANGE r SLIDE s] GROUP BY ...``,
  :class:`RelationWindow` for a CQL window of raw tuples under ISTREAM / DSTREAM /
  RSTREAM, :class:`RowsGroupWindow` for a grouped CQL ``[ROWS n]``,
  :class:`PatternWindow` for ``MATCH_RECOGNIZE``), then stateless
  ``post`` ops (the ``SELECT`` list as a :class:`Project`, ``HAVING`` as a
  :class:`Filter`), optionally a CQL relation-to-stream operator (:class:`R2S`), and
  writes to its :class:`Sink`.
* The row a window hands to ``post`` is: for :class:`OverWindow` (and
  :class:`OverWindows`), the input row (or the
  expiring row, for outputs of active expiration) plus one entry per aggregate alias;
  for :class:`ExtentWindow`, the ``group_by`` columns, the aggregate aliases and the
  pseudo-columns ``window_start`` / ``window_end``; for :class:`RowsGroupWindow`, the
  ``group_by`` columns and the aliases; for :class:`PatternWindow`, the partition
  columns, the measures and the timestamp column; a :class:`RelationWindow` hands
  ``post`` each tuple of the window (and applies the relation-to-stream operator to
  ``post``'s rows itself).
* Event time travels with every output row outside its columns (``Output.ts`` in
  :mod:`engine.core.evaluator`): an over-window output has the input tuple's timestamp
  (or the expiration instant), an extent output has ``window_end``, a stateless query
  keeps its input's event time. So does its tie order as a derived-stream row
  (``Output.source`` / ``Output.seq``: producing stage and key, output counter), which
  a stage reading that derived stream uses as the row's ``source`` / ``seq``.
* :meth:`Plan.stages` cuts the plan into :class:`Stage` s, the units the runtime runs:
  each stage has one input stream and partition-key columns; the runtime groups the
  input rows by the key and runs one ``KeyedEvaluator`` per (stage, key value).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from engine.core.pattern_plan import PatternWindow

if TYPE_CHECKING:
    from engine.core.aggregates import WindowAggregate

END_OF_TIME: int = 2**62
"""The final heartbeat at +infinity (int ms). Far below 2**63 so ``ts + range`` cannot
overflow a BIGINT column."""

DEFAULT_SOURCE_IDLE_MS = 60_000
"""The idle timeout of a ``PER SOURCE`` stream that names none: longer than the gap
between a live sensor's readings or heartbeats, short enough that a dead one holds its
stream's time back for a minute only."""

Expr = Callable[[Mapping[str, Any]], Any]
"""A compiled expression: row -> value (None is SQL NULL)."""

VectorExpr = Callable[[Any], Any]
"""The same expression over a batch: an Arrow table of rows -> an Arrow array of the
values (``rules.language.vectors``). The compiler gives one where Arrow computes exactly
what the row expression does; the engine's columnar path needs one for every
expression of a query it runs."""


class ColumnType(StrEnum):
    """SQL column types of the rule language. TIMESTAMP values are int epoch ms."""

    INT = "INT"
    BIGINT = "BIGINT"
    DOUBLE = "DOUBLE"
    STRING = "STRING"
    BOOLEAN = "BOOLEAN"
    TIMESTAMP = "TIMESTAMP"


@dataclass(frozen=True)
class Column:
    """One column of a stream schema."""

    name: str
    type: ColumnType


@dataclass(frozen=True)
class StreamSchema:
    """A stream: ``CREATE STREAM name (...) ORDER BY ts SLACK d [PER SOURCE [IDLE i]]
    SOURCE 'topic'``.

    Derived streams (``CREATE STREAM name AS SELECT ...``) have a schema too, with
    ``topic=None`` and ``slack_ms=0``; their ``timestamp`` names the SELECT column that
    carries the event time if there is one, else ``None``.
    """

    name: str
    columns: tuple[Column, ...]
    timestamp: str | None
    slack_ms: int = 0
    topic: str | None = None
    source_idle_ms: int | None = None
    """``PER SOURCE``: each source (a reading's ``source``) has its own clock and is idle
    after this long without being heard (:class:`engine.core.sequencer.SourceClocks`);
    None: one clock for the whole stream."""

    def column(self, name: str) -> Column:
        """The column called ``name`` (KeyError if absent)."""
        for col in self.columns:
            if col.name == name:
                return col
        raise KeyError(f"stream {self.name!r} has no column {name!r}")


@dataclass(frozen=True)
class Filter:
    """Keep the rows where ``predicate`` is true (None, like SQL NULL, drops the row)."""

    predicate: Expr
    vector: VectorExpr | None = field(default=None, compare=False)
    """The predicate over a batch (None: the query runs row by row)."""


@dataclass(frozen=True)
class Project:
    """Replace the row by ``{name: expr(row) for name, expr in columns}`` (SELECT list).

    ``copies``, when the compiler knows every column is a plain copy of one row key (a
    column reference, an aggregate's value): those keys in ``columns`` order, so whole
    columns of results can be projected at once. None: some column is computed."""

    columns: tuple[tuple[str, Expr], ...]
    copies: tuple[str, ...] | None = None
    vectors: tuple[VectorExpr, ...] | None = field(default=None, compare=False)
    """Each column's expression over a batch (None: the query runs row by row)."""


@dataclass(frozen=True)
class LookupJoin:
    """``JOIN table ON stream_expr = table.col [AND ...]``: a stream-table equi-join with
    a reference table (``CREATE TABLE ... FROM CSV | DELTA``), inner or ``left``.

    The table's ``rows`` (values in ``columns`` order, as loaded by the compiler) travel
    inside the plan, so a stage pickled to a worker needs no file access. For each input
    row, ``keys`` (``(stream-side expr, table column)`` pairs) select the matching table
    rows; the output is the input row plus, per match, the table's columns under
    ``"<label>.<column>"`` (label = the FROM alias, else the table name), one output row
    per match. A NULL key matches nothing (SQL). With ``left``, an unmatched row is kept
    once, the table's columns NULL; without, it is dropped.
    """

    table: str
    label: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    keys: tuple[tuple[Expr, str], ...]
    left: bool = False
    vector_keys: tuple[VectorExpr, ...] | None = field(default=None, compare=False)
    """The stream-side key expressions over a batch (None: row by row)."""
    _index: dict[tuple[Any, ...], list[dict[str, Any]]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        # Built once per plan (and again where a pickled stage is loaded): a dict lookup
        # per input row instead of a scan of the table.
        positions = [self.columns.index(c) for _, c in self.keys]
        index: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for values in self.rows:
            key = tuple(values[i] for i in positions)
            if None not in key:
                named = {f"{self.label}.{c}": v for c, v in zip(self.columns, values, strict=True)}
                index.setdefault(key, []).append(named)
        object.__setattr__(self, "_index", index)

    def matches(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The joined rows for one input row (see the class docstring)."""
        key = tuple(expr(row) for expr, _ in self.keys)
        found = self._index.get(key) if None not in key else None
        if found:
            return [{**row, **named} for named in found]
        if self.left:
            return [{**row, **{f"{self.label}.{c}": None for c in self.columns}}]
        return []


StatelessOp = Filter | Project | LookupJoin
RowOps = Callable[[Mapping[str, Any]], list[dict[str, Any]]]
"""Stateless ops compiled into one function (:func:`compile_ops`)."""


def compile_ops(ops: Sequence[StatelessOp]) -> RowOps:
    """The ops as one function from a row to the rows that come out (a filter may drop
    it, a lookup join may give several), built once: it runs per tuple and per output,
    where dispatching on each op's type would cost more than a projection."""

    def step(op: StatelessOp) -> Callable[[list[Any]], list[Any]]:
        if isinstance(op, Filter):
            keep = op.predicate
            return lambda rows: [r for r in rows if keep(r)]
        if isinstance(op, LookupJoin):
            matches = op.matches
            return lambda rows: [joined for r in rows for joined in matches(r)]
        columns = op.columns
        return lambda rows: [{name: expr(r) for name, expr in columns} for r in rows]

    if len(ops) == 1 and isinstance(ops[0], Project):  # the usual post: a SELECT list
        columns = ops[0].columns
        return lambda row: [{name: expr(row) for name, expr in columns}]
    steps = [step(op) for op in ops]

    def run(row: Mapping[str, Any]) -> list[Any]:
        rows = [row]
        for one in steps:
            rows = one(rows)
        return rows

    return run


_COMPILED: dict[int, tuple[Sequence[StatelessOp], RowOps]] = {}


def compiled_ops(ops: Sequence[StatelessOp]) -> RowOps:
    """:func:`compile_ops` of ``ops``, compiled once per ops sequence of a plan: every
    key's evaluator of a stage runs the same function (compiling per key was a third of
    a new RFID tag's cost)."""
    found = _COMPILED.get(id(ops))
    if found is None or found[0] is not ops:  # an id may be reused once ops are freed
        found = _COMPILED[id(ops)] = (ops, compile_ops(ops))
    return found[1]


class FrameUnits(StrEnum):
    """How an OVER frame is measured: in rows (physical) or in event time (logical)."""

    ROWS = "ROWS"
    RANGE = "RANGE"


@dataclass(frozen=True)
class AggCall:
    """One aggregate call in a SELECT list: ``name(args...) [OVER (...)] AS alias``.

    ``factory`` is None for a built-in (looked up by ``name`` in
    ``engine.core.aggregates.BUILTINS``) or, for ``CREATE AGGREGATE ... LANGUAGE PYTHON``,
    the imported class (a ``WindowAggregate`` subclass) called with no arguments to get
    a fresh aggregate. ``args`` are evaluated on the input row; ``count(*)`` has none.
    """

    name: str
    args: tuple[Expr, ...]
    alias: str
    factory: Callable[[], WindowAggregate] | None = None
    algebraic: bool = False
    """Declared ``ALGEBRAIC`` (``CREATE AGGREGATE ... ALGEBRAIC``): its partials merge,
    so row slides may run it on panes (ESL §5.1). Built-ins are algebraic by their
    class (count, sum, avg, min, max, var, stddev); a Python aggregate only when
    declared so (the checker makes sure its class has ``merge``)."""
    vector_args: tuple[VectorExpr, ...] | None = field(default=None, compare=False)
    """The arguments over a batch (None: the query runs row by row)."""


@dataclass(frozen=True)
class OverWindow:
    """A data-driven window: ``agg OVER (PARTITION BY ... ROWS|RANGE ... [SLIDE | ACTIVE
    EXPIRATION])`` (SQL:2003 / ESL §5). One output per input tuple (per yield tuple with
    a slide), plus, with active expiration, one per expiring tuple.

    * ``units=ROWS``: the frame is the row and the ``preceding`` rows before it.
    * ``units=RANGE``: the frame is ``[ts - preceding, ts]``, peers (equal ts) included.
    * ``preceding=None``: UNBOUNDED PRECEDING (landmark from the partition's start).
    * ``slide_rows`` / ``slide_ms``: keep only the yield tuple (the last one) of each
      n-row slot, or of each time slot ``[k*s, (k+1)*s)`` counted from the epoch.
    * ``active_expiration``: RANGE only; a tuple at ``t`` expires at ``t + preceding``,
      after all tuples at that instant, and its ``expire`` may emit.
    * ``lag``: the frame is delayed by ``lag`` rows/ms behind the current tuple (0: none):
      ROWS n LAG d is rows ``[i - d - n, i - d]``, RANGE t LAG d is ``[ts - d - t, ts - d]``
      (Patroumpas & Sellis's scope with lag δ). Incremental aggregates only; no ACTIVE EXPIRATION.
    * ``reset_every_ms``: landmark with periodic reset: the window restarts empty (fresh
      aggregates, ESL INITIALIZE) at every multiple of it from the epoch (1 day:
      midnight UTC), i.e. the frame never reaches before ``ts // d * d``.
    * ``since_ms`` / ``until_ms``: fixed bounds (RANGE, ``preceding=None``): only tuples
      with ``since_ms <= ts <= until_ms`` enter the window; SINCE alone is a lower-bounded
      landmark, UNTIL alone an upper-bounded one (frozen after it), both a fixed band.
      Every input tuple still gets its output row (empty window: count 0, others NULL).

    The aggregates of one SELECT with this spec share it (several specs: OverWindows).
    """

    aggregates: tuple[AggCall, ...]
    units: FrameUnits
    preceding: int | None
    partition_by: tuple[str, ...] = ()
    slide_rows: int | None = None
    slide_ms: int | None = None
    active_expiration: bool = False
    lag: int = 0
    reset_every_ms: int | None = None
    since_ms: int | None = None
    until_ms: int | None = None


@dataclass(frozen=True)
class OverWindows:
    """Several data-driven windows in one SELECT (SQL:2003: each ``OVER`` its own
    frame): ``avg(v) OVER (ROWS 3 PRECEDING) AS a, max(v) OVER (PARTITION BY k RANGE 1
    MINUTE PRECEDING) AS m``. One output per input tuple: the input row plus every
    window's aliases, each read over that window's own frame and partition. Aggregates
    with one spec share one :class:`OverWindow` (one frame evaluated once). No SLIDE or
    ACTIVE EXPIRATION (which outputs exist would be one window's choice), incremental
    aggregates only (exactly one value per tuple).
    """

    windows: tuple[OverWindow, ...]

    @property
    def partition_by(self) -> tuple[str, ...]:
        """The evaluators' key: the partition columns every window has (each window
        keeps its further partitions inside the evaluator)."""
        first, *rest = self.windows
        return tuple(c for c in first.partition_by if all(c in w.partition_by for w in rest))


@dataclass(frozen=True)
class ExtentWindow:
    """A domain-driven window: ``FROM s [RANGE r SLIDE s] GROUP BY g`` (CQL / WID).

    The extents are ``[e - range_ms, e)`` for every ``e`` that is a multiple of
    ``slide_ms`` from the epoch; each non-empty extent's result (one row per group) is
    emitted once, when the watermark passes ``e``, with event time ``e``.
    """

    aggregates: tuple[AggCall, ...]
    range_ms: int
    slide_ms: int
    group_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class RelationWindow:
    """A CQL window over a stream read as a relation of its tuples, no aggregates:
    ``SELECT ISTREAM | DSTREAM | RSTREAM (...) FROM s [window]`` (CQL §5-6). R(τ), the
    window's tuples at instant τ (ms), each turned into the query's rows by ``post``:

    * ``units=RANGE``, ``range_ms=r``: the tuples with ``τ - lag_ms - r <= ts <= τ -
      lag_ms`` (``[RANGE r]``; ``[NOW]`` is ``r = 0``): a tuple is in R from instant
      ``ts + lag_ms`` to ``ts + lag_ms + r`` inclusive;
    * ``units=RANGE``, ``range_ms=None``: every tuple so far (``[RANGE UNBOUNDED]``), only
      those of the current period with ``reset_every_ms`` (periods from the epoch), only
      those with ``since_ms <= ts <= until_ms`` with bounds (``[SINCE a]``, ``[UNTIL b]``,
      ``[BETWEEN a AND b]``);
    * ``units=RANGE`` with ``slide_ms=s``: the tuples of the latest WID extent
      ``[e - r, e)``, e the largest multiple of s ``<= τ`` (``[RANGE r SLIDE s]``);
    * ``units=ROWS``: the ``rows`` latest tuples (in (ts, source, seq) order) per
      ``partition_by`` value (``[ROWS n]``, ``[PARTITION BY k ROWS n]``).

    The query's ``r2s`` is applied to R of each ``partition_by`` value (the evaluator's
    key: empty, one relation, unless partitioned): at every instant where a tuple enters
    or leaves the window, ISTREAM emits R(τ) - R(τ-1) and DSTREAM R(τ-1) - R(τ) (bag
    differences of the rows) and RSTREAM all of R(τ), each with event time τ. For a ROWS
    window the query's WHERE and joins are in ``post`` (CQL filters the window's tuples,
    not the stream); for time-based ones, where membership is per tuple, they may stay
    in ``pre``.
    """

    units: FrameUnits
    rows: int | None = None
    range_ms: int | None = None
    slide_ms: int | None = None
    lag_ms: int = 0
    reset_every_ms: int | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    partition_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class RowsGroupWindow:
    """A CQL tuple-based window grouped by any columns: ``FROM s [ROWS n] GROUP BY g``
    or ``FROM s [PARTITION BY p ROWS n] GROUP BY g`` with aggregates, under ISTREAM /
    DSTREAM / RSTREAM (CQL §6.1.2-6.1.3, then SQL's GROUP BY over the window's relation).

    W(τ) is the last ``rows`` tuples with ts ≤ τ in (ts, source, seq) order, of the
    stream or of each ``partition_by`` value; R(τ) is one row per ``group_by`` value with
    tuples in W(τ): the group columns and one entry per aggregate alias, handed to
    ``post``. R changes at the instants with arrivals (a tuple's group gains it, the
    group of the tuple it pushes out loses that one). Incremental aggregates only.
    """

    aggregates: tuple[AggCall, ...]
    rows: int
    partition_by: tuple[str, ...] = ()
    group_by: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, ...]:
        """The evaluators' key: the partition columns when each group lies inside one
        partition (they are among the group columns), else one evaluator holds all."""
        return self.partition_by if set(self.partition_by) <= set(self.group_by) else ()


Window = OverWindow | OverWindows | ExtentWindow | RelationWindow | RowsGroupWindow | PatternWindow
"""Every window a query may have."""


class R2S(StrEnum):
    """CQL relation-to-stream operators (CQL §5.1) over a windowed query's relation R, one
    per partition/group (its rows after ``post``), which changes only at some instants:

    * :class:`ExtentWindow`: R(e) is the rows of the extent ending at e, at every extent
      end (an empty extent right after a non-empty one empties R);
    * :class:`OverWindow` (no ACTIVE EXPIRATION): R(t) is the rows of the last tuple at
      each instant t where the window emits; this is how CQL's ``[ROWS n]``,
      ``[PARTITION BY k ROWS n]``, ``[RANGE UNBOUNDED]`` with ``GROUP BY k`` compile
      (an OVER window partitioned by k, selecting k and the aggregates);
    * :class:`RelationWindow`: R(τ) is the rows of the window's tuples at τ (see there;
      the window applies the operator itself);
    * :class:`RowsGroupWindow`: R(τ) is every group's row at each instant with arrivals.

    * ``RSTREAM``: all of R at every change (CQL streams R at every instant; between
      changes those copies repeat, so one per change is kept).
    * ``ISTREAM``: the rows of the new R not in the previous R (bag difference).
    * ``DSTREAM``: the rows of the previous R not in the new R.
    """

    ISTREAM = "ISTREAM"
    DSTREAM = "DSTREAM"
    RSTREAM = "RSTREAM"


class SinkKind(StrEnum):
    """Where a query's rows go: a derived stream (its own table) or the alerts table."""

    STREAM = "STREAM"
    ALERT = "ALERT"


@dataclass(frozen=True)
class Sink:
    """A query's destination; ``name`` is the derived stream's or the alert's name."""

    name: str
    kind: SinkKind


@dataclass(frozen=True)
class Query:
    """One compiled statement: input -> pre -> [window] -> post -> [r2s] -> sink.

    ``r2s`` applies to windowed queries (see :class:`R2S`); a query without a window may
    carry ``ISTREAM`` or ``RSTREAM`` (of ``S [NOW]``: the stream itself).
    """

    sink: Sink
    input: str
    pre: tuple[StatelessOp, ...] = ()
    window: Window | None = None
    post: tuple[StatelessOp, ...] = ()
    r2s: R2S | None = None
    branch: int = 0
    """``SELECT ... UNION ALL SELECT ...`` compiles to one query per branch, all writing
    the same sink (their ``post`` gives the first branch's column names); ``branch`` is
    the SELECT's index. The sink's rows are the union, and a stage reading it processes
    them in (ts, source, seq) order: the sort-merge by timestamp of ESL's UNION ALL."""
    definition: str = field(default="", compare=False)
    """A digest of the rule text the query was compiled from (positions aside): saved
    state of a query whose definition has changed since is not resumed."""

    @property
    def name(self) -> str:
        """Unique per query: the sink's name, with ``#<branch>`` for later branches."""
        return self.sink.name if self.branch == 0 else f"{self.sink.name}#{self.branch}"

    @property
    def key(self) -> tuple[str, ...]:
        """Partition-key columns of the input stream (empty: one evaluator in all)."""
        if isinstance(self.window, OverWindow | OverWindows | RelationWindow | PatternWindow):
            return self.window.partition_by
        if isinstance(self.window, ExtentWindow):
            return self.window.group_by
        if isinstance(self.window, RowsGroupWindow):
            return self.window.key
        return ()


@dataclass(frozen=True)
class Stage:
    """What the runtime runs as one (keyed) operator.

    ``query`` is a stateful query, or a stateless one whose input is not produced inside
    another stage; ``downstream`` are the stateless queries fed, directly or
    transitively, by its sink, in plan order. Every output of the stage is one of
    their sinks. Rows of ``input`` are grouped by ``key`` (column names of ``input``).
    """

    query: Query
    downstream: tuple[Query, ...] = ()
    timestamp: str = "ts"
    """The input stream's timestamp column (int ms in the rows given to the evaluator)."""

    @property
    def name(self) -> str:
        """The stage is named after its root query (:attr:`Query.name`)."""
        return self.query.name

    @property
    def input(self) -> str:
        """The stream whose rows feed the stage."""
        return self.query.input

    @property
    def key(self) -> tuple[str, ...]:
        """Partition-key columns; the runtime runs one evaluator per key value."""
        return self.query.key


@dataclass(frozen=True)
class Incidents:
    """How an alert's reports become incidents, (alert, key) episodes in event time
    (``engine.core.incidents`` runs them; ``CREATE ALERT ... [FOR d] [RESOLVE WHEN c |
    RESOLVE AFTER d] [KEEP FIRING FOR d]``).

    The condition of a key holds at an instant with a report (a row of the alert with
    that event time); it stops at an instant with an observation and no report, or, with
    ``quiet_ms``, at ``quiet_ms`` after the key's latest report. Observations are the
    rows of ``observe`` (the alert's input stream; None: none) that come out of
    ``clear`` (the query's joins and the RESOLVE WHEN filter; empty by default: every
    input row of the key, so the first row whose WHERE fails ends the condition).
    ``pending_ms`` is FOR (the condition must hold that long before the incident
    opens), ``keep_firing_ms`` KEEP FIRING FOR (it stays open that long after the
    condition stopped, and carries on if it holds again by then).
    """

    alert: str
    observe: str | None
    clear: tuple[StatelessOp, ...] = ()
    quiet_ms: int | None = None
    pending_ms: int = 0
    keep_firing_ms: int = 0
    definition: str = field(default="", compare=False)
    """A digest of the alert's query and clauses: saved state of another one is dropped."""

    @property
    def name(self) -> str:
        """What the tracker's saved state is filed under (no query is named so)."""
        return f"{self.alert}!incidents"


@dataclass(frozen=True)
class Plan:
    """All streams (sources and derived) and all compiled queries of a rule set."""

    streams: Mapping[str, StreamSchema] = field(default_factory=dict)
    queries: tuple[Query, ...] = ()
    incidents: tuple[Incidents, ...] = ()
    """One per alert: how its reports become incidents."""

    def sources(self) -> Iterator[StreamSchema]:
        """The streams fed from outside (those no query writes)."""
        written = {q.sink.name for q in self.queries}
        return (s for s in self.streams.values() if s.name not in written)

    def stages(self) -> tuple[Stage, ...]:
        """Cut the plan into stages: stateless queries join the stage that feeds them,
        unless several queries feed it (UNION ALL): then they are a stage of their own."""
        producers: dict[str, list[Query]] = {}
        for q in self.queries:
            producers.setdefault(q.sink.name, []).append(q)

        def root(q: Query) -> Query:
            # Walk up through stateless queries over derived streams with one producer.
            while q.window is None and len(producers.get(q.input, ())) == 1:
                q = producers[q.input][0]
            return q

        def timestamp(stream: str) -> str:
            schema = self.streams.get(stream)
            return schema.timestamp if schema and schema.timestamp else "ts"

        roots = [q for q in self.queries if root(q) is q]
        return tuple(
            Stage(
                r,
                tuple(q for q in self.queries if q is not r and root(q) is r),
                timestamp(r.input),
            )
            for r in roots
        )
