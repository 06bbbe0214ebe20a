"""The keyed evaluator: one stage's logic for one partition-key value, on an explicit clock.

The runtime (Spark's stateful processor, or :mod:`engine.core.replay`) creates one
:class:`KeyedEvaluator` per (stage, key value) and drives it with two calls:

* ``insert(row)`` buffers a tuple: the stream's columns (timestamp as int ms) plus
  ``source`` (str) and ``seq`` (int). Its ts must not be below the last watermark.
* ``advance(watermark)`` processes, in (ts, source, seq) order merged with the window's
  timers, every buffered tuple and every timer whose instant is ``< watermark`` (a
  future on-time tuple may still have ts == watermark), and returns the outputs in that
  order. At one instant, tuples come before timers.

The result never depends on how inserts and advances were batched (snapshot-equivalence,
PIPES): the sequence of state changes is fixed by the tuples and the watermarks' final
value. ``next_wakeup()`` tells the runtime where to set its event-time timer;
``snapshot()`` / :meth:`KeyedEvaluator.restore` move the whole state through bytes.

**Tie order of derived rows.** A derived stream's rows feed later stages like readings
do, so they need a (ts, source, seq) order that any runtime reproduces without global
state. Every :class:`Output` carries it: ``source`` is :func:`derived_source` of the
producing stage's name and key value (canonical JSON, fixed at the evaluator's first
insert), ``seq`` the evaluator's own output counter (0, 1, 2, ... over all its outputs,
kept in the snapshot). Both are fixed by the input alone, whatever the batching, and the
pair is unique per derived stream.
"""

from __future__ import annotations

import itertools
import json
import pickle
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from engine.core.chunks import ChunkReader
from engine.core.plan import END_OF_TIME, Project, Query, RowOps, Stage, compiled_ops
from engine.core.planner.operators import EvaluatorPieces, evaluator_pieces
from engine.core.windows.base import Result, Row
from engine.core.windows.extents import ExtentColumns

_SNAPSHOT_VERSION = 7
"""7: a data-driven RANGE frame's buffer may be a chunk index (:meth:`KeyedEvaluator.save`);
6: extent windows over algebraic aggregates keep pane partials (PaneExtentOperator);
a version-5 snapshot still restores (its buffered tuples are regrouped into panes)."""


def derived_source(stage: str, key: tuple[Any, ...]) -> str:
    """The ``source`` of the rows a (stage, key) evaluator produces: canonical JSON of
    ``[stage, *key]`` (compact separators, non-ASCII kept), e.g. ``["station_speed",3]``."""
    return json.dumps([stage, *key], separators=(",", ":"), ensure_ascii=False, default=str)


class Output(NamedTuple):
    """One output row: ``sink`` (derived stream or alert name), event time ``ts`` (int
    ms), ``row`` (column -> value, keys = the SELECT list's names), and its tie order as
    a derived-stream row: ``source`` (:func:`derived_source`) and ``seq`` (the producing
    evaluator's output counter). A named tuple: one is made per output, and a frozen
    dataclass costs nearly three times as much to build."""

    sink: str
    ts: int
    row: dict[str, Any]
    source: str = ""
    seq: int = 0


class OutputColumns(NamedTuple):
    """A run of one query's outputs as columns (:meth:`KeyedEvaluator.advance_columns`):
    the :class:`Output` s ``outputs()`` gives, whose ``seq`` count on from ``seq``.
    ``columns`` maps the SELECT list's names to one value per output; ``ts`` holds
    their event times."""

    sink: str
    ts: list[int]
    columns: dict[str, list[Any]]
    source: str
    seq: int

    def outputs(self) -> list[Output]:
        """The same outputs, one :class:`Output` each."""
        names, sink, source, seq = list(self.columns), self.sink, self.source, self.seq
        columns = zip(*self.columns.values(), strict=True)
        rows = [dict(zip(names, values, strict=True)) for values in columns]
        return [
            Output(sink, ts, row, source, seq + j)
            for j, (ts, row) in enumerate(zip(self.ts, rows, strict=True))
        ]


Emitted = list[Output | OutputColumns]
"""What an advance emits, in order."""


def output_rows(outputs: Iterable[Output | OutputColumns]) -> list[Output]:
    """``outputs`` with each :class:`OutputColumns` as its :class:`Output` s."""
    rows: list[Output] = []
    for output in outputs:
        if isinstance(output, OutputColumns):
            rows += output.outputs()
        else:
            rows.append(output)
    return rows


class SavedState(NamedTuple):
    """What :meth:`KeyedEvaluator.save` gives the runtime's state store: the ``head``
    snapshot, the buffer chunks to write (number -> bytes) and the ones to delete."""

    head: bytes
    writes: dict[int, bytes]
    deletes: list[int]


class KeyedEvaluator:
    """One stage, one partition key: ``insert`` / ``advance`` / ``next_wakeup`` /
    ``snapshot`` / ``restore`` (see the module docstring for the contract)."""

    def __init__(self, stage: Stage, pieces: EvaluatorPieces | None = None) -> None:
        self.stage = stage
        # What the planner chose for the stage (a runner passes it: chosen once).
        pieces = pieces if pieces is not None else evaluator_pieces(stage)
        self.operator = pieces.operator()
        # A relation window's results are the query's final rows (it ran `post` itself).
        self._final = pieces.final
        self.watermark = -END_OF_TIME
        # Tie order of the outputs (module docstring); source is set at the first insert.
        self.source = ""
        self.emitted = 0
        # (ts, source, seq, tiebreak, row), sorted lazily by advance: arrivals are mostly in
        # order, which Timsort handles in linear time. tiebreak keeps dicts out of compares.
        self.pending: list[tuple[int, str, int, int, Row]] = []
        self._tiebreak = itertools.count()
        self.pre = stage.query.pre
        self._pre, self._post = compiled_ops(self.pre), compiled_ops(stage.query.post)
        # The relation-to-stream step applied here (None: rows pass as they are).
        self.changes = pieces.changes(self._post) if pieces.changes is not None else None
        self.ts_column = stage.timestamp
        self.chunked = False  # whether the operator's buffer is kept in chunks (`save`)
        # Per stream this stage writes: the stateless queries reading it, with their
        # pre and post ops.
        self._consumers: dict[str, list[tuple[Query, RowOps, RowOps]]] = {}
        for q in stage.downstream:
            entry = (q, compiled_ops(q.pre), compiled_ops(q.post))
            self._consumers.setdefault(q.input, []).append(entry)
        self._copies = pieces.copies

    def insert(self, row: Row) -> None:
        """Buffer one input tuple (processed by a later ``advance``)."""
        self.insert_many((row,))

    def insert_many(self, rows: Sequence[Row]) -> None:
        """Buffer input tuples (processed by a later ``advance``), in arrival order."""
        if not rows:
            return
        ts_column, tiebreak = self.ts_column, self._tiebreak
        times = [row[ts_column] for row in rows]
        if (oldest := min(times)) < self.watermark:
            raise ValueError(
                f"late tuple: ts {oldest} < watermark {self.watermark} (the runtime must divert it)"
            )
        if not self.source:
            key = tuple(rows[0].get(c) for c in self.stage.key)
            self.source = derived_source(self.stage.name, key)
        if not self.pre:
            self.pending += [
                (ts, row["source"], row["seq"], next(tiebreak), row)
                for ts, row in zip(times, rows, strict=True)
            ]
            return
        for ts, row in zip(times, rows, strict=True):
            # Several rows of one tuple (a lookup join's matches) keep the table's row order.
            source, seq = row["source"], row["seq"]
            for kept in self._pre(row):
                self.pending.append((ts, source, seq, next(tiebreak), kept))

    def insert_prepared(
        self, key: tuple[Any, ...], entries: Sequence[tuple[int, str, int, Row]]
    ) -> None:
        """Buffer tuples of ``key`` the query's pre steps have already made, each as
        (event time, source, seq of the input tuple it came from, the row), in arrival
        order."""
        if not entries:
            return
        if (oldest := min(e[0] for e in entries)) < self.watermark:
            raise ValueError(
                f"late tuple: ts {oldest} < watermark {self.watermark} (the runtime must divert it)"
            )
        if not self.source:
            self.source = derived_source(self.stage.name, key)
        tiebreak = self._tiebreak
        self.pending += [(ts, source, seq, next(tiebreak), row) for ts, source, seq, row in entries]

    def advance(self, watermark: int) -> list[Output]:
        """Process every buffered tuple and timer strictly below ``watermark``."""
        return output_rows(self.advance_columns(watermark))

    def advance_columns(self, watermark: int) -> Emitted:
        """:meth:`advance`, with a run of extents whose columns the query only copies as
        one :class:`OutputColumns` (the runtime writes columns: no row per output)."""
        out: Emitted = []
        op = self.operator
        if self.chunked:
            op.prepare(watermark)  # type: ignore[attr-defined]
        pending = self.pending
        pending.sort()
        n, i = len(pending), 0
        query = self.stage.query
        # Locals: this loop runs once per distinct timestamp.
        next_timer, arrive, changes = op.next_timer, op.arrive, self.changes
        # A run of arrivals no timer separates, in one call (the sliding RANGE window).
        arrive_slot = getattr(op, "arrive_slot", None)
        # Arrivals and timers in one call, where no relation needs a hook per timer.
        run = getattr(op, "run", None)
        if self._copies is not None:
            i, extents = op.run_columns(pending, i, n, watermark)  # type: ignore[attr-defined]
            self._emit_columns(query, extents, out)
        elif run is not None and changes is None:
            i, results = run(pending, i, n, watermark)
            self._emit_all(query, results, out)
        while True:
            arrival = pending[i][0] if i < n else None
            if arrival is not None and arrival >= watermark:
                arrival = None
            timer = next_timer()
            if timer is not None and timer >= watermark:
                timer = None
            if arrival is not None and (timer is None or arrival <= timer):
                if arrive_slot is not None:
                    i = arrive_slot(pending, i, n, watermark)  # no outputs, no relation
                    continue
                j = i + 1
                if j < n and pending[j][0] == arrival:
                    while j < n and pending[j][0] == arrival:
                        j += 1
                    results = arrive([(arrival, entry[4]) for entry in pending[i:j]])
                else:  # the usual group of one, without a slice
                    results = arrive([(arrival, pending[i][4])])
                i = j
                if changes is not None:
                    self._deliver_all(query, changes.arrived(results), out)
                    continue
            elif timer is not None:
                results = op.fire(timer)
                if changes is not None:
                    self._deliver_all(query, changes.fired(timer, results), out)
                    continue
            else:
                break
            self._emit_all(query, results, out)
        del pending[:i]
        if changes is not None:
            self._deliver_all(query, changes.below(watermark), out)
        op.settle(watermark)
        self.watermark = max(self.watermark, watermark)
        return out

    def _emit_columns(self, query: Query, extents: ExtentColumns, out: Emitted) -> None:
        """Deliver extents as ``query``'s outputs, its SELECT list copying columns."""
        count = len(extents.ends)
        if not count:
            return
        assert self._copies is not None
        project = query.post[0]
        assert isinstance(project, Project)  # what _copies was computed from
        names = [name for name, _ in project.columns]
        have = extents.columns
        columns = {
            name: have[key] if key in have else [None] * count
            for name, key in zip(names, self._copies, strict=True)
        }
        out.append(OutputColumns(query.sink.name, extents.ends, columns, self.source, self.emitted))
        self.emitted += count

    def _emit_all(self, query: Query, results: list[Result], out: Emitted) -> None:
        """Deliver the operator's ``results`` as ``query``'s outputs (through its post ops
        unless the operator ran them)."""
        if self._final:
            self._deliver_all(query, results, out)
            return
        post = self._post
        self._deliver_all(query, [(ts, final) for ts, row in results for final in post(row)], out)

    def _emit(self, query: Query, post: RowOps, ts: int, row: Row, out: Emitted) -> None:
        """Run ``query``'s post ops (``post``) and deliver the result."""
        self._deliver_all(query, [(ts, final) for final in post(row)], out)

    def _deliver_all(self, query: Query, finals: Sequence[Result], out: Emitted) -> None:
        """Write rows ``(ts, row)`` to ``query``'s sink in order, each followed by what the
        stateless queries reading it make of it (their outputs number after it)."""
        sink, source = query.sink.name, self.source
        consumers = self._consumers.get(sink, ())
        append = out.append
        for ts, final in finals:
            append(Output(sink, ts, final, source, self.emitted))
            self.emitted += 1
            for consumer, pre, post in consumers:
                for kept in pre(final):
                    self._emit(consumer, post, ts, kept, out)

    def next_wakeup(self) -> int | None:
        """The smallest watermark at which ``advance`` would emit something new."""
        times = []
        if self.pending:
            times.append(min(self.pending)[0] + 1)
        wake = self.operator.next_timer()
        if wake is not None:
            times.append(wake + 1)
        change = self.changes.change if self.changes is not None else None
        if change is not None:
            times.append(change[0] + 1)
        return min(times) if times else None

    def idle(self, watermark: int) -> bool:
        """Whether, advanced to ``watermark``, the evaluator gives every later tuple what
        a new one given its :meth:`residue` would: nothing pending, no timer, no relation
        held by a relation-to-stream operator, and an idle operator. Its key may then be
        evicted (docs/engine.md, *Eviction*)."""
        changes = self.changes
        return (
            not self.pending
            and (changes is None or (changes.change is None and not changes.relation))
            and self.operator.next_timer() is None
            and self.operator.idle(watermark)
        )

    def idle_wakeup(self) -> int | None:
        """The lowest watermark at which time alone can make the evaluator idle (None:
        only its timers, or nothing)."""
        return self.operator.idle_wakeup()

    def residue(self) -> tuple[int, Any] | None:
        """What an idle evaluator's key must keep to go on as if never evicted: the
        output count (``seq`` of its next output, which alert ids hash) and the
        operator's own (None: nothing, a new evaluator starts there)."""
        kept = self.operator.residue()
        return None if not self.emitted and kept is None else (self.emitted, kept)

    def resume(self, residue: tuple[int, Any]) -> None:
        """Go on from an evicted evaluator's :meth:`residue` (on a new evaluator)."""
        self.emitted, kept = residue
        self.operator.resume(kept)

    def stored_chunks(self) -> list[int]:
        """The numbers of the buffer chunks :meth:`save` has stored (none unless
        chunked)."""
        chunks = getattr(self.operator, "stored_chunks", None)
        return chunks() if self.chunked and chunks is not None else []

    def snapshot(self) -> bytes:
        """The whole state as bytes (plain data only: no callables, no plan)."""
        return self._dump(self.operator.get_state())

    def save(self) -> SavedState:
        """The state for a key-value store, changed parts only: a data-driven RANGE
        frame's buffer goes in chunks (:mod:`engine.core.chunks`), of which only the
        ones with new tuples are written; the rest of the state is the ``head``.
        Restore with :meth:`load`; every other operator's state is all in the head."""
        op = self.operator
        if not (self.chunked or self._store_in_chunks(None)):
            return SavedState(self.snapshot(), {}, [])
        head = self._dump(op.get_state(chunked=True))  # type: ignore[call-arg]
        chunks = op.chunks  # type: ignore[attr-defined]
        assert chunks is not None  # set by store_in_chunks
        return SavedState(head, chunks.writes, chunks.deletes)

    def _dump(self, op_state: Any) -> bytes:
        pending = [(ts, src, seq, row) for ts, src, seq, _, row in sorted(self.pending)]
        changes = self.changes
        state = (
            _SNAPSHOT_VERSION,
            self.watermark,
            pending,
            op_state,
            changes.relation if changes is not None else [],
            changes.change if changes is not None else None,
            self.source,
            self.emitted,
        )
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def restore(
        cls, stage: Stage, data: bytes, pieces: EvaluatorPieces | None = None
    ) -> KeyedEvaluator:
        """Rebuild an evaluator from the stage (recompiled from the rules) and a snapshot."""
        ev = cls(stage, pieces)
        ev._apply(data)
        return ev

    @classmethod
    def load(
        cls, stage: Stage, head: bytes, read: ChunkReader, pieces: EvaluatorPieces | None = None
    ) -> KeyedEvaluator:
        """Rebuild an evaluator from what :meth:`save` stored: its head, and its chunks
        through ``read`` (chunk number -> bytes), which reads only the ones it needs."""
        ev = cls(stage, pieces)
        ev._store_in_chunks(read)
        ev._apply(head)
        return ev

    def _store_in_chunks(self, read: ChunkReader | None) -> bool:
        """Have the operator keep its buffer in chunks if it can (a data-driven RANGE
        frame); sets and returns ``chunked``."""
        store = getattr(self.operator, "store_in_chunks", None)
        self.chunked = store is not None and store(read)
        return self.chunked

    def _apply(self, data: bytes) -> None:
        state = pickle.loads(data)
        if state[0] not in (5, 6, _SNAPSHOT_VERSION):
            raise ValueError(f"unsupported snapshot version {state[0]}")
        version, watermark, pending, op_state, relation, change, source, emitted = state
        self.source, self.emitted = source, emitted
        if self.changes is not None:
            self.changes.relation, self.changes.change = relation, change
        self.watermark = watermark
        self.pending = [(ts, src, seq, next(self._tiebreak), row) for ts, src, seq, row in pending]
        self.operator.restore_state(op_state, version)
