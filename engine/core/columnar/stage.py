"""What every columnar runner shares: buffering a stage's input, cutting a batch by key,
the query's steps after the window, and numbering the rows emitted.

A subclass supplies the window (:meth:`ColumnarRunner.window`): given a key's final
rows of the batch (sorted in (ts, source, seq) order) it returns that key's window rows
(the columns the query's ``post`` steps read, and ``_ts``), or names them as rows of
the batch (:class:`Picked`) for :meth:`ColumnarRunner.assemble` to build for all keys
at once, and it may say when a key must run again without new rows
(:meth:`ColumnarRunner.wakeup`). The rest is here:

* ``pre`` steps run as rows arrive; rows wait until the watermark passes them;
* ``post`` steps, then the stateless queries fed by the stage's sink (``downstream``,
  depth first), run on all keys' window rows at once;
* **numbering** gives every emitted row the tie order the per-row runner gives it:
  ``_source`` names the stage and key, ``_seq`` counts the key's outputs, a row's own
  number first, then its consumers' rows and theirs, in plan order (the order in which
  :class:`~engine.core.evaluator.KeyedEvaluator` delivers them).

State per key is one pickled record, written when the key changed, and read back only
when a batch touches or wakes the key: the stage's :class:`~engine.core.key_index.KeyIndex`
says which keys have one and when each wakes. A key no batch touched for
:data:`~engine.core.runners.SPILL_AFTER` saves leaves memory until then. The stage's
own record (``cstate``) holds the rows not yet final and what a window keeps for all
keys (:meth:`ColumnarRunner.shared`). A key whose window says it is idle
(:meth:`ColumnarRunner.idle`) is evicted after the advance that made it so; its output
count and the window's :meth:`ColumnarRunner.residue` stay behind
(:class:`~engine.core.runners.Rests`).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.core.columnar import ops
from engine.core.evaluator import derived_source
from engine.core.key_index import KEY_INDEX, KeyIndex
from engine.core.plan import END_OF_TIME, Query, Stage
from engine.core.runners import (
    KEY,
    SEQ,
    SOURCE,
    TS,
    HasStore,
    Key,
    Rests,
    Saved,
    SinkRows,
    SpillOrder,
    earliest,
    key_json,
    key_of,
)
from engine.core.state import StateKey, StateStore, dumps
from engine.core.wakeups import WakeupSchedule

_PICKLE = pickle.HIGHEST_PROTOCOL


@dataclass
class Picked:
    """A key's window rows as rows ``index`` of the advance's final rows (what
    :meth:`ColumnarRunner.begin` got) with what the window computed for them
    (``values``, the runner's own form), after the table ``before`` (rows of earlier
    batches, or None). Building one table per key costs more than the key's rows do;
    :meth:`ColumnarRunner.assemble` builds all keys' at once."""

    index: np.ndarray
    values: Any
    before: pa.Table | None = None


@dataclass
class Emitting:
    """One sink's rows of a batch before numbering: the rows, their key (index into the
    batch's keys) and, for a consumer's rows, the row of its parent query they came
    from; ``size`` is each row's count with every row descended from it."""

    sink: str
    rows: pa.Table
    keys: np.ndarray
    parents: np.ndarray | None
    ts: np.ndarray
    size: np.ndarray
    children: list[Emitting]


class ColumnarRunner:
    """The shared half of a columnar runner (see the module docstring)."""

    kind = "columnar"

    def __init__(self, index: int, stage: Stage, owner: HasStore) -> None:
        self.index = index
        self.stage = stage
        self.owner = owner
        self.query = stage.query
        self.pending: list[pa.Table] = []
        self._arranged = False  # whether ``pending`` is one table in :attr:`arrangement`
        self._pending_saved = True  # whether the store may hold pending rows
        self._shared_saved: Any = None  # the shared() object last saved
        self.states: dict[Key, Any] = {}
        self.emitted: dict[Key, int] = {}  # each key's outputs so far: the next _seq
        self._touched: dict[Key, str] = {}  # keys changed since the last save: their texts
        self._wakeups: WakeupSchedule[Key] = WakeupSchedule()
        self._consumers: dict[str, list[Query]] = {}
        for query in stage.downstream:
            self._consumers.setdefault(query.input, []).append(query)
        # Eviction (module docstring): an unkeyed stage has one key, kept.
        self.evicts = bool(stage.key) and owner.evict
        self.rests = Rests(stage, self.kind, owner)
        self.key_index: KeyIndex[Key] = self._new_index()
        self._stored: set[Key] = set()  # indexed keys whose state is not loaded yet
        self._spill_order: SpillOrder[None] = SpillOrder()  # loaded keys, as saved
        self._gone: dict[Key, list[StateKey]] = {}  # evicted keys' entries, to delete
        self._evicted: list[Key] = []
        self._batch = self.empty_rows  # during an advance: its final rows, sorted

    # -- what a window supplies ------------------------------------------------------------
    def new_state(self, key: Key) -> Any:
        """A key's state before its first row."""
        raise NotImplementedError

    def begin(self, final: pa.Table) -> None:
        """Called once per advance before the keys, with all keys' final rows (sorted by
        key, then tie order): what a window computes for all rows at once."""

    def window(
        self, key: Key, state: Any, watermark: int, span: tuple[int, int]
    ) -> pa.Table | Picked | None:
        """The key's window rows for this advance: its final rows are rows ``span`` of
        what :meth:`begin` got (:meth:`rows_in` slices them out)."""
        raise NotImplementedError

    def rows_in(self, span: tuple[int, int]) -> pa.Table:
        """Rows ``span`` of the advance's final rows (sorted by key, then tie order); a
        window asks for them only if it reads them as a table, since a slice per key
        costs more than many windows' work."""
        start, end = span
        return self._batch.slice(start, end - start)

    def assemble(self, final: pa.Table, picked: list[Picked]) -> pa.Table:
        """The window rows of the keys whose :meth:`window` gave :class:`Picked` s, in
        their order, as one table (a runner that gives them says how)."""
        raise NotImplementedError

    def wakeup(self, state: Any) -> int | None:
        """The watermark at which the key must run again with no new rows, if any."""
        return None

    def idle(self, state: Any, watermark: int) -> bool:
        """Whether the key's state, advanced to ``watermark``, gives every later row what
        a new key's state given :meth:`residue` would (then it is evicted); never by
        default."""
        return False

    def idle_wakeup(self, state: Any) -> int | None:
        """The lowest watermark at which time alone can make the key idle, if any."""
        return None

    def residue(self, state: Any) -> Any:
        """What an idle key's window keeps for the key's return (None: nothing)."""
        return None

    def resume(self, state: Any, residue: Any) -> None:
        """Take back a :meth:`residue` into a new key's state."""

    def forget(self, key: Key, state: Any) -> list[StateKey]:
        """The store entries of its own an idle key's window leaves (its ``cstate`` aside),
        to delete."""
        return []

    def shared(self) -> Any:
        """What the window keeps for all its keys (None: nothing): saved with the pending
        rows whenever it is a new object, and given to :meth:`load_shared` at restore
        before any key's state is loaded."""
        return None

    def load_shared(self, data: Any) -> None:
        """Take back what :meth:`shared` gave."""

    # -- running ------------------------------------------------------------------------
    @property
    def arrangement(self) -> tuple[str, ...]:
        return tuple(self.stage.key)

    def insert(self, rows: pa.Table, arranged: bool = False) -> None:
        if rows.num_rows:
            # The pre steps (filters, lookups, projections) keep the rows' order.
            self._arranged = arranged and not self.pending
            self.pending.append(ops.apply(self.query.pre, rows)[0] if self.query.pre else rows)

    def advance(self, watermark: int) -> list[SinkRows]:
        ts_name = self.stage.timestamp
        final = None
        if self.pending:
            rows = pa.concat_tables(self.pending, promote_options="permissive")
            ts = rows.column(ts_name)
            top = pc.max(ts).as_py()
            if not ts.null_count and (top is None or top < watermark):  # as released: all
                final, self.pending = rows, []
            else:
                below = pc.less(ts, watermark)
                final, rest = rows.filter(below), rows.filter(pc.invert(below))
                self.pending = [rest] if rest.num_rows else []
        key_names = self.stage.key
        batches: list[tuple[Key, tuple[int, int]]] = []
        self._batch = self.empty_rows
        if final is not None and final.num_rows:
            if not self._arranged:
                # As :meth:`~engine.core.held.Released.arranged` arranges a source stream's
                # rows: the sort is the last reader of the rows' ids.
                order = ops.sort_order(final, [*key_names, ts_name, "source", "seq"])
                final = final.drop_columns(["source", "seq"]).take(order)
            self._batch = final
            self.begin(final)
            batches = ops.keyed_segments(final, key_names)
        seen = {key for key, _ in batches}
        batches += [(key, (0, 0)) for key in self._wakeups.due(watermark) if key not in seen]
        self._load([key for key, _ in batches if key in self._stored])
        if self.evicts:
            self.rests.prefetch(key for key, _ in batches if key not in self.states)
        keys: list[Key] = []
        windows = _Windows()
        idle: list[Key] = []
        texts = {key: key_json(key) for key, _ in batches}
        for key, span in sorted(batches, key=lambda b: texts[b[0]]):
            if key in self.states:
                state = self.states[key]
            else:
                state = self.states[key] = self._new_state(key)
            out = self.window(key, state, watermark, span)
            self._touched[key] = texts[key]
            state = self.states[key]  # a window may replace it
            if self.evicts and self.idle(state, watermark):
                idle.append(key)  # once its rows are numbered
            else:
                wakeup = earliest(self.wakeup(state), self.idle_wakeup(state))
                self._wakeups.set(key, wakeup)
            if windows.add(len(keys), out):
                keys.append(key)
        emitted = []
        if windows.sizes:
            batch = self._batch
            window_rows, row_keys = windows.table(lambda picked: self.assemble(batch, picked))
            emitted = self._emit(keys, window_rows, row_keys)
        self._batch = self.empty_rows  # the batch is not kept past its advance
        for key in idle:
            self._evict(key)
        return emitted

    def _new_index(self) -> KeyIndex[Key]:
        return KeyIndex(self.stage.name, self.query.definition, self.kind, key_of, key_json)

    def _load(self, keys: list[Key]) -> None:
        """Read the stored states of ``keys`` (indexed, not loaded) in one call."""
        if not keys:
            return
        store = self.owner.store
        assert store is not None, "indexed keys without a store"
        texts = [key_json(key) for key in keys]
        found = store.get_many([self.key_index.state_entry(text) for text in texts])
        for key, text, data in zip(keys, texts, found, strict=True):
            if data is None:
                raise KeyError(f"stored state of {self.stage.name} {text} missing")
            emitted, saved = pickle.loads(data)
            if emitted:
                self.emitted[key] = emitted
            self.states[key] = self.load(key, saved)
            self._stored.discard(key)

    def _new_state(self, key: Key) -> Any:
        """A key's state: a new one, given back what the key left if it was evicted."""
        state = self.new_state(key)
        residue = self.rests.take(key) if self.evicts else None
        if residue is not None:
            emitted, kept = residue
            if emitted:
                self.emitted[key] = emitted
            self.resume(state, kept)
        return state

    def _evict(self, key: Key) -> None:
        """Drop an idle key: its residue is kept, its stored state deleted at save."""
        state = self.states.pop(key)
        emitted, kept = self.emitted.pop(key, 0), self.residue(state)
        self.rests.put(key, None if not emitted and kept is None else (emitted, kept))
        self._wakeups.discard(key)
        self._touched.pop(key, None)
        self._spill_order.discard(key)
        doomed = self.forget(key, state)
        if key in self.key_index:
            doomed.append(self.key_index.state_entry(key_json(key)))
        if doomed:
            self._gone.setdefault(key, []).extend(doomed)
        self._evicted.append(key)

    @cached_property
    def empty_rows(self) -> pa.Table:
        """No rows (a key run by its wakeup): one table, made once (a batch may wake
        hundreds of thousands of keys)."""
        return pa.table({self.stage.timestamp: pa.array([], pa.int64())})

    def _emit(self, keys: list[Key], window_rows: pa.Table, row_keys: np.ndarray) -> list[SinkRows]:
        """The query's post steps and the consumers on the window rows, numbered."""
        ts = np.asarray(window_rows.column(TS).to_numpy(zero_copy_only=False), dtype=np.int64)
        rows, parents = ops.apply(self.query.post, window_rows.drop_columns([TS]))
        root = self._tree(self.query.sink.name, rows, row_keys[parents], ts[parents])
        # The root rows of each key are numbered on from the key's count.
        starts = np.array([self.emitted.get(k, 0) for k in keys], dtype=np.int64)
        totals = np.bincount(root.keys, weights=root.size, minlength=len(keys)).astype(np.int64)
        for i, key in enumerate(keys):
            self.emitted[key] = int(starts[i] + totals[i])
        before = _exclusive_cumsum_by(root.size, root.keys)
        seq = starts[root.keys] + before
        sources = [derived_source(self.stage.name, key) for key in keys]
        texts = [key_json(key) for key in keys]
        out: list[SinkRows] = []
        self._number(root, seq, sources, texts, out)
        return out

    def _tree(self, sink: str, rows: pa.Table, keys: np.ndarray, ts: np.ndarray) -> Emitting:
        """``rows`` of ``sink`` and, recursively, what the queries reading ``sink`` in
        this stage make of them."""
        children = []
        size = np.ones(rows.num_rows, dtype=np.int64)
        for consumer in self._consumers.get(sink, ()):
            taken, parents = ops.apply((*consumer.pre, *consumer.post), rows)
            child = self._tree(consumer.sink.name, taken, keys[parents], ts[parents])
            child.parents = parents
            children.append(child)
            size += np.bincount(parents, weights=child.size, minlength=rows.num_rows).astype(
                np.int64
            )
        return Emitting(sink, rows, keys, None, ts, size, children)

    def _number(
        self,
        node: Emitting,
        seq: np.ndarray,
        sources: list[str],
        texts: list[str],
        out: list[SinkRows],
    ) -> None:
        """Emit ``node``'s rows numbered ``seq``, then its consumers' rows: each after
        its parent row and the rows of the consumers before it."""
        if node.rows.num_rows:
            table = node.rows
            table = table.append_column(TS, pa.array(node.ts, pa.int64()))
            keys = pa.array(node.keys, pa.int64())
            table = table.append_column(SOURCE, pa.array(sources, pa.string()).take(keys))
            table = table.append_column(SEQ, pa.array(seq, pa.int64()))
            table = table.append_column(KEY, pa.array(texts, pa.string()).take(keys))
            out.append(SinkRows(self.index, node.sink, table))
        offset = seq + 1  # the next number after each row's own, per row of `node`
        for child in node.children:
            assert child.parents is not None
            before = _exclusive_cumsum_by(child.size, child.parents)
            self._number(child, offset[child.parents] + before, sources, texts, out)
            offset = offset + np.bincount(
                child.parents, weights=child.size, minlength=len(offset)
            ).astype(np.int64)

    # -- state ----------------------------------------------------------------------------
    def save(self, store: StateStore) -> None:
        name, definition = self.stage.name, self.stage.query.definition
        if self.pending:  # rows not yet final belong to the state too
            self.pending = [pa.concat_tables(self.pending, promote_options="permissive")]
        pending = self.pending[0] if self.pending else None
        # The evicted first: a key back in the same batch writes its state afresh.
        gone = _by_text(self._gone)
        for key, _ in gone:
            for entry in self._gone[key]:
                store.delete(entry)
        self._gone.clear()
        self.rests.save(store)
        # The texts the advance made, not made again.
        changed = sorted(self._touched.items(), key=lambda item: item[1])
        self._spill_order.next_save()
        for key, text in changed:
            record = (self.emitted.get(key, 0), self.dump(key, store))
            store.put(self.key_index.state_entry(text), dumps(record))
            self._spill_order.written(key, None)
        self.key_index.save(store, gone, changed, self._wakeups.times, self.evicts)
        shared = self.shared()
        # None, and none stored, and nothing new shared: no write.
        if pending is not None or self._pending_saved or shared is not self._shared_saved:
            record = (definition, self.kind, pending, *(() if shared is None else (shared,)))
            store.put(("cstate", name, "", -1), dumps(record))
            self._pending_saved = pending is not None
            self._shared_saved = shared
        self._touched.clear()
        # Keys no batch touched lately: their state is stored, read back when needed.
        for key, _ in self._spill_order.spilled():
            del self.states[key]
            self.emitted.pop(key, None)
            self._stored.add(key)

    def dump(self, key: Key, store: StateStore) -> Any:
        """A key's state as plain data (a window may also write entries of its own)."""
        return self.states[key]

    def load(self, key: Key, data: Any) -> Any:
        """A key's state from what :meth:`dump` gave."""
        return data

    def restore(self, saved: Saved) -> list[StateKey]:
        # The per-row runner's keys (the stage ran per row): another kind's state.
        stale: list[StateKey] = [entry for entry, _ in saved.get("head", [])]
        own = [(entry, pickle.loads(data)) for entry, data in saved.get("cstate", [])]
        indexed = self.key_index.restore(saved.get(KEY_INDEX, []))
        definition = self.stage.query.definition
        # Only the stage's own record (number -1) is a cstate entry: any other is a key's
        # state as an earlier layout stored it.
        if indexed is None or any(
            entry[3] != -1 or record[:2] != (definition, self.kind) for entry, record in own
        ):
            self.key_index = self._new_index()
            stale += [entry for entry, _ in own]
            stale += [entry for entry, _ in saved.get(KEY_INDEX, [])]
            return stale + self.rests.restore(saved)
        for _, (_, _, pending, *shared) in own:
            self.pending = [pending] if pending is not None else []
            self._arranged = False
            if shared:
                self.load_shared(shared[0])
                self._shared_saved = self.shared()
        self._stored.update(key for key, _, _ in indexed.keys)
        scheduled = [(key, at) for key, _, at in indexed.keys]
        if self.evicts and not indexed.evicting:
            # Saved by a stage that kept idle keys: those are evicted in the next advance.
            self._load([key for key, _ in scheduled])
            scheduled = [
                (key, -END_OF_TIME if self.idle(self.states[key], -END_OF_TIME) else at)
                for key, at in scheduled
            ]
        self._wakeups.load(scheduled)
        return stale + self.rests.restore(saved)

    def live_keys(self) -> int:
        return len(self.states) + len(self._stored)

    def is_live(self, key: Key) -> bool:
        return key in self.states or key in self._stored

    def take_evicted(self) -> list[Key]:
        evicted, self._evicted = self._evicted, []
        return evicted


class _Windows:
    """An advance's window rows, key by key in order: tables, and :class:`Picked` rows
    assembled at the end; :meth:`table` puts them back in the keys' order."""

    def __init__(self) -> None:
        self.tables: list[pa.Table] = []
        self.picked: list[Picked] = []
        self.sizes: list[tuple[bool, int, int]] = []  # (picked?, rows, key number)

    def add(self, key: int, out: pa.Table | Picked | None) -> bool:
        """Take a key's window rows; whether it had any."""
        if isinstance(out, Picked):
            added = self._table(key, out.before)
            if len(out.index):
                self.picked.append(out)
                self.sizes.append((True, len(out.index), key))
                added = True
            return added
        return self._table(key, out)

    def _table(self, key: int, out: pa.Table | None) -> bool:
        if out is None or not out.num_rows:
            return False
        self.tables.append(out)
        self.sizes.append((False, out.num_rows, key))
        return True

    def table(self, assemble: Any) -> tuple[pa.Table, np.ndarray]:
        """All rows as one table in the keys' order, and each row's key number."""
        parts = [*self.tables, *([assemble(self.picked)] if self.picked else [])]
        rows = pa.concat_tables(parts, promote_options="permissive")
        row_keys = np.concatenate([np.full(n, key, dtype=np.int64) for _, n, key in self.sizes])
        if self.tables and self.picked:
            # The tables' rows come first in ``rows``, the picked rows after them.
            next_at = [0, sum(t.num_rows for t in self.tables)]
            order = []
            for picked, n, _ in self.sizes:
                order.append(np.arange(next_at[picked], next_at[picked] + n))
                next_at[picked] += n
            rows = rows.take(pa.array(np.concatenate(order), pa.int64()))
        return rows, row_keys


def _by_text(keys: Iterable[Key]) -> list[tuple[Key, str]]:
    """Each key with its text (:func:`~engine.core.runners.key_json`), in order of text."""
    return sorted(((key, key_json(key)) for key in keys), key=lambda item: item[1])


def _exclusive_cumsum_by(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """For each position, the sum of ``values`` at earlier positions of the same group
    (groups are contiguous runs)."""
    if not len(values):
        return values
    total = np.cumsum(values) - values
    starts = np.flatnonzero(np.concatenate([[True], groups[1:] != groups[:-1]]))
    lengths = np.diff(np.concatenate([starts, [len(values)]]))
    return total - np.repeat(total[starts], lengths)
