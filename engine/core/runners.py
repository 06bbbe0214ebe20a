"""How a pipeline runs one stage: the :class:`StageRunner` protocol, the rows a stage
emits (:class:`SinkRows`), and the per-row runner.

A stage is run by one runner for all its keys, fed batches of rows (Arrow tables) and
advanced to watermarks; what it emits are Arrow tables too. Two kinds of runner give the
same rows: :class:`RowRunner`, one :class:`~engine.core.evaluator.KeyedEvaluator` per key
driven row by row (every window form, user-defined aggregates, expiration), and the
columnar runners of :mod:`engine.core.columnar` (the common forms, computed per column);
:func:`runner_for` picks one when a pipeline is built.

**Emitted rows.** A :class:`SinkRows` table holds the sink's columns (timestamps as epoch
ms) and four columns of the engine's own: ``_ts`` (the row's event time), ``_source`` and
``_seq`` (its tie order as a derived-stream row: the producing evaluator, as
:func:`~engine.core.evaluator.derived_source` names it, and its output count) and ``_key``
(the evaluator's key values, as JSON).

**State.** A runner saves, per key, what changed since its last save, under keys of the
store named after the stage; each record carries the rule's definition digest and the
runner's kind, so state built by another rule, or kept in another layout, is dropped at
restore rather than misread.
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import pyarrow as pa

from engine.core.columnar import ops
from engine.core.evaluator import KeyedEvaluator, Output, output_rows
from engine.core.plan import Stage
from engine.core.state import StateKey, StateStore

Key = tuple[Any, ...]

TS, SOURCE, SEQ, KEY = "_ts", "_source", "_seq", "_key"
"""The engine's own columns of emitted rows (module docstring)."""

_PICKLE = pickle.HIGHEST_PROTOCOL

Saved = Mapping[str, list[tuple[StateKey, bytes]]]
"""A stage's saved state as a runner restores it: its store entries by kind."""


def key_json(key: Key) -> str:
    """An evaluator's key as stored and emitted: a JSON array of its values."""
    return orjson.dumps(list(key)).decode()


@dataclass(frozen=True)
class SinkRows:
    """Rows one stage emitted to one sink (module docstring for the columns)."""

    stage: int
    sink: str
    table: pa.Table


class HasStore(Protocol):
    """What a runner is part of: its current store (a runtime may hand over a new one
    for every batch)."""

    store: StateStore | None


class StageRunner(Protocol):
    """Runs one stage for every key (see the module docstring)."""

    kind: str
    """Which runner (saved with its state: another kind's state is not resumed)."""

    def insert(self, rows: pa.Table) -> None:
        """Buffer the stage's input rows (the stream's columns, timestamps as epoch ms,
        ``source`` and ``seq``), in arrival order; none below the last watermark."""
        ...

    def advance(self, watermark: int) -> list[SinkRows]:
        """Process every buffered row and timer below ``watermark``; what is emitted."""
        ...

    def save(self, store: StateStore) -> None:
        """Write what changed since the last save."""
        ...

    def restore(self, saved: Saved) -> list[StateKey]:
        """Take up the state this stage saved (its store entries by kind); returns the
        entries to delete: state of another definition or kind."""
        ...

    def live_keys(self) -> int:
        """How many keys hold state."""
        ...


def input_rows(timestamp: str, table: pa.Table) -> pa.Table:
    """A derived stream's emitted rows as the input of a stage reading it: the event
    time under the stream's timestamp column, the tie order as ``source`` and ``seq``."""
    keep = [c for c in table.column_names if c not in (TS, SOURCE, SEQ, KEY, timestamp)]
    columns = {c: table.column(c) for c in keep}
    columns[timestamp] = table.column(TS)
    columns["source"] = table.column(SOURCE)
    columns["seq"] = table.column(SEQ)
    return pa.table(columns)


def emitted_outputs(emitted: SinkRows) -> list[tuple[Key, Output]]:
    """Emitted rows as :class:`Output` s, each with its evaluator's key."""
    table = emitted.table
    names = [n for n in table.column_names if n not in (TS, SOURCE, SEQ, KEY)]
    rows = table.select(names).to_pylist()
    keys = table.column(KEY).to_pylist()
    return [
        (tuple(orjson.loads(key)), Output(emitted.sink, ts, row, source, seq))
        for row, key, ts, source, seq in zip(
            rows,
            keys,
            table.column(TS).to_pylist(),
            table.column(SOURCE).to_pylist(),
            table.column(SEQ).to_pylist(),
            strict=True,
        )
    ]


def outputs_table(outputs: list[Output], key: str) -> pa.Table:
    """One sink's :class:`Output` s as emitted rows."""
    names = list(dict.fromkeys(name for o in outputs for name in o.row))
    columns: dict[str, Any] = {n: [o.row.get(n) for o in outputs] for n in names}
    columns[TS] = pa.array([o.ts for o in outputs], pa.int64())
    columns[SOURCE] = pa.array([o.source for o in outputs], pa.string())
    columns[SEQ] = pa.array([o.seq for o in outputs], pa.int64())
    columns[KEY] = pa.array([key] * len(outputs), pa.string())
    return pa.table(columns)


class RowRunner:
    """One :class:`KeyedEvaluator` per key, driven row by row; an evaluator is advanced
    when it got rows or its ``next_wakeup`` is due (a heap of wakeups: idle keys cost
    nothing). Saves each touched evaluator's head and window chunks."""

    kind = "rows"

    def __init__(self, index: int, stage: Stage, owner: HasStore) -> None:
        self.index = index
        self.stage = stage
        self.owner = owner  # its store, read when an evaluator's chunks are needed
        self.evaluators: dict[Key, KeyedEvaluator] = {}
        self._stored: dict[Key, bytes] = {}  # saved evaluators not loaded yet: their heads
        self._heap: list[tuple[int, str, Key]] = []
        self._wakeups: dict[Key, int] = {}
        self._fed: set[Key] = set()
        self._touched: set[Key] = set()
        # The query's steps before its window (joins, WHERE) run over the batch's
        # columns when they can: row by row, a lookup join builds a dict per match.
        pre = stage.query.pre
        self._columnar_pre = bool(pre) and ops.vectorised(pre)

    def insert(self, rows: pa.Table) -> None:
        if not rows.num_rows:
            return
        if self._columnar_pre:
            self._insert_through_pre(rows)
            return
        key_columns = self.stage.key
        by_key: dict[Key, list[dict[str, Any]]] = {}
        for row in rows.to_pylist():
            by_key.setdefault(tuple(row.get(c) for c in key_columns), []).append(row)
        for key, mine in by_key.items():
            self._evaluator(key).insert_many(mine)
            self._fed.add(key)

    def _insert_through_pre(self, rows: pa.Table) -> None:
        """:meth:`insert` with the pre steps run over columns: each kept row keeps the
        key, event time and tie order of the input row it came from."""
        kept, parents = ops.apply(self.stage.query.pre, rows)
        if not kept.num_rows:
            return
        columns = [rows.column(c).to_pylist() for c in self.stage.key]
        keys = list(zip(*columns, strict=True)) if columns else [()] * rows.num_rows
        ts = rows.column(self.stage.timestamp).to_pylist()
        sources, seqs = rows.column("source").to_pylist(), rows.column("seq").to_pylist()
        by_key: dict[Key, list[tuple[int, str, int, dict[str, Any]]]] = {}
        for parent, row in zip(parents.tolist(), kept.to_pylist(), strict=True):
            entry = (ts[parent], sources[parent], seqs[parent], row)
            by_key.setdefault(keys[parent], []).append(entry)
        for key, entries in by_key.items():
            self._evaluator(key).insert_prepared(key, entries)
            self._fed.add(key)

    def advance(self, watermark: int) -> list[SinkRows]:
        due = self._fed
        self._fed = set()
        due.update(self._due(watermark))
        by_sink: dict[str, list[pa.Table]] = {}
        for key in sorted(due, key=key_json):
            evaluator = self._evaluator(key)
            emitted = output_rows(evaluator.advance_columns(max(watermark, evaluator.watermark)))
            if emitted:
                text = key_json(key)
                sinks: dict[str, list[Output]] = {}
                for output in emitted:
                    sinks.setdefault(output.sink, []).append(output)
                for sink, outputs in sinks.items():
                    by_sink.setdefault(sink, []).append(outputs_table(outputs, text))
            if self.owner.store is not None:
                self._touched.add(key)
            self._schedule(key, evaluator.next_wakeup())
        return [
            SinkRows(self.index, sink, pa.concat_tables(parts, promote_options="permissive"))
            for sink, parts in by_sink.items()
        ]

    def _due(self, watermark: int) -> list[Key]:
        heap, current = self._heap, self._wakeups
        due = []
        while heap and heap[0][0] <= watermark:
            wakeup, _, key = heapq.heappop(heap)
            if current.get(key) == wakeup:
                del current[key]
                due.append(key)
        return due

    def _schedule(self, key: Key, wakeup: int | None) -> None:
        if wakeup is None:
            self._wakeups.pop(key, None)
        elif self._wakeups.get(key) != wakeup:
            self._wakeups[key] = wakeup
            heapq.heappush(self._heap, (wakeup, key_json(key), key))

    def _evaluator(self, key: Key) -> KeyedEvaluator:
        found = self.evaluators.get(key)
        if found is not None:
            return found
        head = self._stored.pop(key, None)
        if head is None:
            evaluator = KeyedEvaluator(self.stage)
        else:
            name, text = self.stage.name, key_json(key)

            def read_chunk(number: int) -> bytes:
                # The store at the time of reading: a runtime may hand the pipeline a
                # new one for each batch (`store` is reassigned), chunks stay valid.
                store = self.owner.store
                assert store is not None
                data = store.get(("chunk", name, text, number))
                if data is None:
                    raise KeyError(f"state chunk {number} of {name} {text} missing")
                return data

            evaluator = KeyedEvaluator.load(self.stage, head, read_chunk)
        self.evaluators[key] = evaluator
        return evaluator

    def save(self, store: StateStore) -> None:
        name, definition = self.stage.name, self.stage.query.definition
        for key in sorted(self._touched, key=key_json):
            evaluator = self.evaluators[key]
            saved = evaluator.save()
            text = key_json(key)
            record = (definition, self.kind, evaluator.next_wakeup(), saved.head)
            store.put(("head", name, text, 0), pickle.dumps(record, _PICKLE))
            for number in saved.deletes:
                store.delete(("chunk", name, text, number))
            for number, data in saved.writes.items():
                store.put(("chunk", name, text, number), data)
        self._touched.clear()

    def restore(self, saved: Saved) -> list[StateKey]:
        stale: set[str] = set()
        for (_, _, text, _), data in saved.get("head", []):
            definition, kind, wakeup, head = pickle.loads(data)
            if definition != self.stage.query.definition or kind != self.kind:
                stale.add(text)
                continue
            key = tuple(orjson.loads(text))
            self._stored[key] = head
            self._schedule(key, wakeup)
        return [entry for entries in saved.values() for entry, _ in entries if entry[2] in stale]

    def live_keys(self) -> int:
        return len(self.evaluators.keys() | self._stored.keys())


STAGE_STATE_KINDS = ("head", "cstate")
"""The kinds of store entries a stage runner restores from (each entry names its stage)."""
STAGE_PIECE_KINDS = ("chunk", "slice")
"""The kinds of entries a runner reads only when it needs them (a window's stored
pieces): at restore only their keys are listed, to drop those of stale state."""
