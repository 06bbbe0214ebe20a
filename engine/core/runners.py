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

**Eviction.** A keyed stage's runner drops a key whose state is idle: nothing it holds
can make a later output differ from what a new key's state gives (per window form:
docs/engine.md, *Eviction*). What must survive, the key's output count (the ``_seq`` of
its next row, which alert ids hash) and the window's own (a row slide's place, a running
sum's total), is its residue: kept in :class:`Rests`, one small entry per evicted key,
and taken back if the key returns.

**Memory.** A runner that saves keeps in memory only the states a batch touched
lately: a key no batch has touched for :data:`SPILL_AFTER` saves is dropped from
memory (:class:`SpillOrder`) and loaded again, as a restored key is, when a row or its
wakeup comes. The per-row runner keeps a spilled evaluator's saved head as bytes (a few
hundred for a tag's window, against several KB for the evaluator); a columnar runner
keeps only the key, its state one store entry read back with the batch's others in one
call. Keys that come back seldom (RFID tags held for their 30-minute window) so cost
memory in proportion to their saved state, or less, not to the state's objects.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import orjson
import pyarrow as pa

from engine.core.columnar import ops
from engine.core.evaluator import KeyedEvaluator, Output, OutputColumns
from engine.core.key_index import KEY_INDEX, KEY_STATE
from engine.core.plan import END_OF_TIME, Stage
from engine.core.planner.operators import EvaluatorPieces, evaluator_pieces
from engine.core.state import StateKey, StateStore
from engine.core.wakeups import WakeupSchedule

Key = tuple[Any, ...]

TS, SOURCE, SEQ, KEY = "_ts", "_source", "_seq", "_key"
"""The engine's own columns of emitted rows (module docstring)."""

_PICKLE = pickle.HIGHEST_PROTOCOL

Saved = Mapping[str, list[tuple[StateKey, bytes]]]
"""A stage's saved state as a runner restores it: its store entries by kind."""


def key_json(key: Key) -> str:
    """An evaluator's key as stored and emitted: a JSON array of its values."""
    return orjson.dumps(list(key)).decode()


def key_of(text: str) -> Key:
    """A key from its stored text (:func:`key_json`)."""
    return tuple(orjson.loads(text))


@dataclass(frozen=True)
class SinkRows:
    """Rows one stage emitted to one sink (module docstring for the columns)."""

    stage: int
    sink: str
    table: pa.Table


class HasStore(Protocol):
    """What a runner is part of: its current store (a runtime may hand over a new one
    for every batch), and whether idle keys are evicted."""

    store: StateStore | None
    evict: bool


def earliest(*times: int | None) -> int | None:
    """The lowest of the times given (None: none given)."""
    return min((t for t in times if t is not None), default=None)


REST = "rest"
"""The kind of an evicted key's residue in the store: (rest, stage, key, 0)."""
RESTS = "rests"
"""The kind of a stage's count of stored residues: (rests, stage, "", 0)."""


class Rests:
    """What a stage's evicted keys left behind: per key its residue (plain data), taken
    back when the key returns. A residue waits in memory until the runner's next save
    writes it to the store (one small entry per key, read only when its key comes back);
    without a store, residues stay in memory. The store also keeps how many residues it
    holds, so that a stage none of whose keys left any never looks one up."""

    def __init__(self, stage: Stage, kind: str, owner: HasStore) -> None:
        self.name, self.definition, self.kind = stage.name, stage.query.definition, kind
        self.owner = owner
        self.waiting: dict[Key, Any] = {}  # not in the store (yet)
        self.taken: dict[Key, bool] = {}  # stored ones taken back: whether they counted
        self.fetched: dict[Key, bytes | None] = {}  # read ahead for this batch's takes
        self.stored = 0
        self._stored_saved = 0

    def __len__(self) -> int:
        return len(self.waiting) + self.stored

    def put(self, key: Key, residue: Any) -> None:
        """Keep ``key``'s residue (None: nothing to keep)."""
        if residue is not None:
            self.waiting[key] = residue

    def prefetch(self, keys: Iterable[Key]) -> None:
        """Read the stored residues of ``keys`` (keys about to come back) in one call of
        the store, for the :meth:`take` s that follow in this batch: a new key is looked
        up in the store once any residue is stored, and a round trip to Spark's state
        server for each new key was a tenth of a busy batch."""
        store = self.owner.store
        if store is None or not self.stored:
            return
        known = (self.waiting, self.taken, self.fetched)
        wanted = [key for key in keys if not any(key in found for found in known)]
        if wanted:
            found = store.get_many([self._entry(key) for key in wanted])
            self.fetched.update(zip(wanted, found, strict=True))

    def take(self, key: Key) -> Any:
        """The residue ``key`` left, if any; it is no longer kept."""
        if key in self.waiting:
            return self.waiting.pop(key)
        store = self.owner.store
        if store is None or not self.stored or key in self.taken:
            return None
        data = self.fetched.pop(key) if key in self.fetched else store.get(self._entry(key))
        if data is None:
            return None
        definition, kind, residue = pickle.loads(data)
        ours = definition == self.definition and kind == self.kind
        self.taken[key] = ours
        return residue if ours else None

    def save(self, store: StateStore) -> None:
        """Delete the residues taken back, write the new ones."""
        for key, counted in sorted(self.taken.items(), key=lambda item: key_json(item[0])):
            store.delete(self._entry(key))
            self.stored -= counted
        for key, residue in sorted(self.waiting.items(), key=lambda item: key_json(item[0])):
            record = (self.definition, self.kind, residue)
            store.put(self._entry(key), pickle.dumps(record, _PICKLE))
            self.stored += 1
        self.taken.clear()
        self.waiting.clear()
        self.fetched.clear()
        if self.stored != self._stored_saved:
            record = (self.definition, self.kind, self.stored)
            store.put((RESTS, self.name, "", 0), pickle.dumps(record, _PICKLE))
            self._stored_saved = self.stored

    def restore(self, saved: Saved) -> list[StateKey]:
        """Take up the stored count; returns it if another definition or kind wrote it
        (its residues are then dropped as their keys come back)."""
        stale = []
        for entry, data in saved.get(RESTS, []):
            definition, kind, count = pickle.loads(data)
            if definition != self.definition or kind != self.kind:
                stale.append(entry)
                continue
            self.stored = self._stored_saved = count
        return stale

    def _entry(self, key: Key) -> StateKey:
        return (REST, self.name, key_json(key), 0)


class StageRunner(Protocol):
    """Runs one stage for every key (see the module docstring)."""

    kind: str
    """Which runner (saved with its state: another kind's state is not resumed)."""

    @property
    def arrangement(self) -> tuple[str, ...] | None:
        """The columns this runner sorts its rows by before their tie order (its key),
        so that a source stream's released rows are sorted once for every runner of one
        arrangement; None: it takes rows as they come, with their ids."""
        ...

    def insert(self, rows: pa.Table, arranged: bool = False) -> None:
        """Buffer the stage's input rows (the stream's columns, timestamps as epoch ms,
        ``source`` and ``seq``), in arrival order; none below the last watermark.
        ``arranged``: the rows are sorted by :attr:`arrangement`, then (ts, source, seq),
        and come without ``source`` and ``seq``
        (:meth:`~engine.core.held.Released.arranged`)."""
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

    def is_live(self, key: Key) -> bool:
        """Whether ``key`` holds state."""
        ...

    def take_evicted(self) -> list[Key]:
        """The keys evicted since the last call."""
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
        (key_of(key), Output(emitted.sink, ts, row, source, seq))
        for row, key, ts, source, seq in zip(
            rows,
            keys,
            table.column(TS).to_pylist(),
            table.column(SOURCE).to_pylist(),
            table.column(SEQ).to_pylist(),
            strict=True,
        )
    ]


class SinkColumns:
    """One sink's emitted rows, gathered over a batch's keys and built as one table at
    the end: a table per key (and a concatenation of thousands of small tables) cost
    more than the rows' evaluation. A run of :class:`OutputColumns` keeps its columns
    as they are; no dict per row is made for it."""

    def __init__(self) -> None:
        self._parts: list[tuple[list[Output] | OutputColumns, str]] = []

    def add(self, outputs: list[Output] | OutputColumns, key: str) -> None:
        """Rows of the evaluator whose key (as JSON) is ``key``, after those added."""
        self._parts.append((outputs, key))

    def add_row(self, output: Output, key: str) -> None:
        """One row of the evaluator keyed ``key``, after those added."""
        if self._parts:
            last, last_key = self._parts[-1]
            if last_key == key and isinstance(last, list):
                last.append(output)
                return
        self._parts.append(([output], key))

    def table(self) -> pa.Table:
        """Every row added, in order, as one table (a column a row lacks is null)."""
        names: dict[str, None] = {}
        ts: list[int] = []
        sources: list[str] = []
        seqs: list[int] = []
        keys: list[str] = []
        for part, key in self._parts:
            if isinstance(part, OutputColumns):
                names.update(dict.fromkeys(part.columns))
                ts += part.ts
                sources += [part.source] * len(part.ts)
                seqs += range(part.seq, part.seq + len(part.ts))
                keys += [key] * len(part.ts)
            else:
                for o in part:
                    names.update(dict.fromkeys(o.row))
                ts += [o.ts for o in part]
                sources += [o.source for o in part]
                seqs += [o.seq for o in part]
                keys += [key] * len(part)
        columns: dict[str, Any] = {name: [] for name in names}
        for part, _ in self._parts:
            if isinstance(part, OutputColumns):
                for name, values in columns.items():
                    found = part.columns.get(name)
                    values += found if found is not None else [None] * len(part.ts)
            else:
                for name, values in columns.items():
                    values += [o.row.get(name) for o in part]
        columns[TS] = pa.array(ts, pa.int64())
        columns[SOURCE] = pa.array(sources, pa.string())
        columns[SEQ] = pa.array(seqs, pa.int64())
        columns[KEY] = pa.array(keys, pa.string())
        return pa.table(columns)


SPILL_AFTER = 16
"""Saves after which a key's state no batch touched leaves memory (module docstring)."""

V = TypeVar("V")


class SpillOrder(Generic[V]):
    """The keys a runner's saves wrote, least lately written first, each with what it
    leaves in memory once its state does (``V``): the state of a key no save of the
    last :data:`SPILL_AFTER` wrote is in the store and no batch has touched it since, so
    the runner drops it from memory and loads it again when a row or its wakeup
    comes."""

    def __init__(self) -> None:
        self._saves = 0  # the number of the last save
        self._written: OrderedDict[Key, tuple[int, V]] = OrderedDict()

    def next_save(self) -> None:
        """A save begins: what it writes is :meth:`written` under its number."""
        self._saves += 1

    def written(self, key: Key, left: V) -> None:
        """This save wrote ``key``'s state; ``left`` is what stays when it spills."""
        self._written[key] = (self._saves, left)
        self._written.move_to_end(key)

    def discard(self, key: Key) -> None:
        """``key`` left (evicted): it spills no more."""
        self._written.pop(key, None)

    def spilled(self) -> list[tuple[Key, V]]:
        """The keys whose state leaves memory now, no longer followed."""
        written, last_spilled = self._written, self._saves - SPILL_AFTER
        out = []
        while written:
            key, (number, left) = next(iter(written.items()))
            if number > last_spilled:
                break
            del written[key]
            out.append((key, left))
        return out


class RowRunner:
    """One :class:`KeyedEvaluator` per key, driven row by row; an evaluator is advanced
    when it got rows or its ``next_wakeup`` is due (a schedule of wakeups: idle keys cost
    nothing). Saves each touched evaluator's head and window chunks, and keeps in
    memory only the evaluators touched in the last :data:`SPILL_AFTER` saves."""

    kind = "rows"

    def __init__(self, index: int, stage: Stage, owner: HasStore) -> None:
        self.index = index
        self.stage = stage
        self.owner = owner  # its store, read when an evaluator's chunks are needed
        self.evaluators: dict[Key, KeyedEvaluator] = {}
        self._stored: dict[Key, bytes] = {}  # saved evaluators not loaded yet: their heads
        # Loaded evaluators' last saved heads: what a spilled evaluator leaves in `_stored`.
        self._heads: SpillOrder[bytes] = SpillOrder()
        self._wakeups: WakeupSchedule[Key] = WakeupSchedule()
        self._fed: set[Key] = set()
        self._touched: set[Key] = set()
        # Eviction (module docstring): an unkeyed stage has one key, kept.
        self.evicts = bool(stage.key) and owner.evict
        self.rests = Rests(stage, self.kind, owner)
        self._saved: set[Key] = set()  # keys with a head in the store
        self._gone: dict[Key, list[int]] = {}  # evicted keys' stored chunks, to delete
        self._evicted: list[Key] = []
        # The query's steps before its window (joins, WHERE) run over the batch's
        # columns when they can: row by row, a lookup join builds a dict per match.
        pre = stage.query.pre
        self._columnar_pre = bool(pre) and ops.vectorised(pre)
        self._pieces: EvaluatorPieces | None = None  # planned with the first key

    def _planned(self) -> EvaluatorPieces:
        """What the stage's evaluators are made of, chosen once."""
        if self._pieces is None:
            self._pieces = evaluator_pieces(self.stage)
        return self._pieces

    @property
    def arrangement(self) -> None:
        return None  # an evaluator orders its own rows, by their ids too

    def insert(self, rows: pa.Table, arranged: bool = False) -> None:
        if not rows.num_rows:
            return
        if self._columnar_pre:
            self._insert_through_pre(rows)
            return
        key_columns = self.stage.key
        by_key: dict[Key, list[dict[str, Any]]] = {}
        for row in rows.to_pylist():
            by_key.setdefault(tuple(row.get(c) for c in key_columns), []).append(row)
        self._prefetch(by_key)
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
        self._prefetch(by_key)
        for key, entries in by_key.items():
            self._evaluator(key).insert_prepared(key, entries)
            self._fed.add(key)

    def _prefetch(self, keys: Iterable[Key]) -> None:
        """Read at once the residues the keys among ``keys`` that hold no state may have
        left (each is made an evaluator next)."""
        if self.evicts:
            live = (self.evaluators, self._stored)
            self.rests.prefetch(key for key in keys if not any(key in found for found in live))

    def advance(self, watermark: int) -> list[SinkRows]:
        due = self._fed
        self._fed = set()
        due.update(self._wakeups.due(watermark))
        by_sink: dict[str, SinkColumns] = {}
        for text, key in sorted((key_json(key), key) for key in due):
            evaluator = self._evaluator(key)
            for emitted in evaluator.advance_columns(max(watermark, evaluator.watermark)):
                sink = by_sink.get(emitted.sink)
                if sink is None:
                    sink = by_sink[emitted.sink] = SinkColumns()
                if isinstance(emitted, OutputColumns):
                    sink.add(emitted, text)
                else:
                    sink.add_row(emitted, text)
            if self.owner.store is not None:
                self._touched.add(key)
            if self.evicts and evaluator.idle(watermark):
                self._evict(key, evaluator)
            else:
                wakeup = earliest(evaluator.next_wakeup(), evaluator.idle_wakeup())
                self._wakeups.set(key, wakeup)
        return [SinkRows(self.index, sink, built.table()) for sink, built in by_sink.items()]

    def _evict(self, key: Key, evaluator: KeyedEvaluator) -> None:
        """Drop an idle key: its residue is kept, its stored state deleted at save."""
        del self.evaluators[key]
        self._heads.discard(key)
        self._wakeups.discard(key)
        self._touched.discard(key)
        self.rests.put(key, evaluator.residue())
        if key in self._saved:
            self._saved.discard(key)
            self._gone.setdefault(key, []).extend(evaluator.stored_chunks())
        self._evicted.append(key)

    def _evaluator(self, key: Key) -> KeyedEvaluator:
        found = self.evaluators.get(key)
        if found is not None:
            return found
        head = self._stored.pop(key, None)
        if head is None:
            evaluator = KeyedEvaluator(self.stage, self._planned())
            residue = self.rests.take(key) if self.evicts else None
            if residue is not None:
                evaluator.resume(residue)
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

            evaluator = KeyedEvaluator.load(self.stage, head, read_chunk, self._planned())
        self.evaluators[key] = evaluator
        return evaluator

    def save(self, store: StateStore) -> None:
        name, definition = self.stage.name, self.stage.query.definition
        self._heads.next_save()
        # The evicted first: a key back in the same batch writes its state afresh.
        for key in sorted(self._gone, key=key_json):
            text = key_json(key)
            store.delete(("head", name, text, 0))
            for number in self._gone[key]:
                store.delete(("chunk", name, text, number))
        self._gone.clear()
        self.rests.save(store)
        for key in sorted(self._touched, key=key_json):
            evaluator = self.evaluators[key]
            saved = evaluator.save()
            text = key_json(key)
            wakeup = earliest(evaluator.next_wakeup(), evaluator.idle_wakeup())
            record = (definition, self.kind, wakeup, saved.head, _WAKEUPS)
            store.put(("head", name, text, 0), pickle.dumps(record, _PICKLE))
            for number in saved.deletes:
                store.delete(("chunk", name, text, number))
            for number, data in saved.writes.items():
                store.put(("chunk", name, text, number), data)
            self._saved.add(key)
            self._heads.written(key, saved.head)
        self._touched.clear()
        self._spill()

    def _spill(self) -> None:
        """Drop from memory the evaluators no save of the last :data:`SPILL_AFTER` wrote
        (none touched them since): their last saved heads go to ``_stored``."""
        for key, head in self._heads.spilled():
            del self.evaluators[key]
            self._stored[key] = head

    def restore(self, saved: Saved) -> list[StateKey]:
        # A columnar runner's keys (the stage ran per column): another kind's state.
        stale = {text for (_, _, text, _), _ in saved.get("cstate", [])}
        scheduled = []
        for (_, _, text, _), data in saved.get("head", []):
            definition, kind, wakeup, head, *since = pickle.loads(data)
            if definition != self.stage.query.definition or kind != self.kind:
                stale.add(text)
                continue
            key = key_of(text)
            self._stored[key] = head
            self._saved.add(key)
            if not since and self.evicts:
                # Saved before eviction: its wakeup does not say when it turns idle, so
                # it is looked at in the next advance.
                wakeup = -END_OF_TIME
            scheduled.append((key, wakeup))
        self._wakeups.load(scheduled)
        doomed = self.rests.restore(saved)
        doomed += [e for kind, found in saved.items() if kind != RESTS for e, _ in found
                   if e[2] in stale]  # fmt: skip
        return doomed

    def live_keys(self) -> int:
        return len(self.evaluators) + len(self._stored)  # a loaded key leaves _stored

    def is_live(self, key: Key) -> bool:
        return key in self.evaluators or key in self._stored

    def take_evicted(self) -> list[Key]:
        evicted, self._evicted = self._evicted, []
        return evicted


_WAKEUPS = 1
"""Marks a head saved with its eviction wakeup (a fifth field; older heads have four)."""

STAGE_STATE_KINDS = ("head", "cstate", RESTS, KEY_INDEX)
"""The kinds of store entries a stage runner restores from (each entry names its stage)."""
SLICE_PAGE = "slicepage"
"""The kind of a page of a RANGE or long ROWS frame's slice descriptions:
(slicepage, stage, key, page number)."""
STAGE_PIECE_KINDS = ("chunk", "slice", SLICE_PAGE, REST, KEY_STATE)
"""The kinds of entries a runner reads only when it needs them (a window's stored
pieces, an evicted key's residue, an indexed key's state)."""
LISTED_PIECE_KINDS = ("chunk", "slice", SLICE_PAGE)
"""The piece kinds whose keys are listed when a restore finds stale state, to drop
those of the stale keys. A stale residue is dropped when its key comes back instead
(there may be one per key ever evicted), and a stale index names its keys' states."""
