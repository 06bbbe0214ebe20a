"""One batch of one component of the engine query, in a Python worker: the work of
the stateful step, whose skin Spark holds (`engine.spark.processor`; every decision is
the pipeline's, `engine.core.pipeline`).

Spark groups a batch's landing files by component (one group per connected part: the
exact, global arrival order of each stream meets in one task; parts run in parallel on
the state store's partitions) and calls the processor once per batch and component
with one row per file. :func:`run`:

1. reads the files (a thread per core) and parses each stream's together (DuckDB's
   JSON reader, on every core), in landing order;
2. runs the pipeline over them, and saves what changed into Spark's state store
   (`SparkStore`: bytes under (kind, name, key, number) in two maps, so a batch
   writes only the evaluators it touched, through a `JournaledStore`: one write per
   batch, as each write is a round trip to the JVM);
3. writes every table's new rows as Parquet files into the table's folder
   (`engine.outputs`, `engine.tables.write_data_file`), notes them on the processor and
   yields one small row per file, plus one row of health figures. The admitted
   readings' files are written on a thread while the stages evaluate: Arrow's Parquet
   writer releases the GIL, so the batch's one task keeps a second core busy (a
   million readings' file takes ~0.2 s).

When the task has run each of its components, :func:`commit` adds the files to their
tables (`engine.spark.commit`), before Spark commits the task's state: only the file
rows and figures reach the driver, never readings.

**A pipeline stays in memory between batches** (`_PIPELINES`, per Python worker and
component):
reading every evaluator back from the state store each batch would cost far more than
the batch's readings. Each batch stores a fresh token beside the state; a worker uses
its pipeline only when it last saved exactly the state Spark hands this batch (same
token), and otherwise (another worker ran the last batch, a batch is re-run after a
failure) rebuilds it from the state store, which is always complete. A pipeline is
taken out of the memo while a batch runs, so a batch that fails half-way leaves nothing
half-changed behind.
"""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, TypeVar

import orjson
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import MapState

from engine import tables
from engine.core.pipeline import Pipeline
from engine.core.runners import STAGE_PIECE_KINDS
from engine.core.state import JournaledStore, StateKey
from engine.landed_files import read_landed
from engine.outputs import admitted_tables, batch_tables, evaluated_tables
from engine.python_gc import collect_frozen, collector_paused, freeze_batch_survivors
from engine.spark import state_client
from engine.spark.commit import TaskCommits, table_schemas
from engine.spark.landing_source import folder_filesystem
from engine.spark.processor import (
    QUERY_NAME,
    STATE_KEY,
    STATE_VALUE,
    Component,
    EngineProcessor,
)
from engine.spark.state_client import PIPELINED, send_pipelined
from engine.warm_start import WarmStart, warm_start
from lookout.config import Config, S3Config

# Listed as plain tuples (`engine.spark.state_client`): no field may need conversion.
assert state_client.plain_schema(STATE_KEY) and state_client.plain_schema(STATE_VALUE)
_TOKEN: StateKey = ("token", "", "", 0)

_PIPELINES: dict[str, tuple[str, Pipeline]] = {}
"""Per query and component: (the token of the state it saved last, the pipeline)."""

_CODEC = pa.Codec("lz4")

_COMMITS: dict[S3Config, TaskCommits] = {}
"""Per storage (S3 settings): how the worker's tasks commit (open tables, threads)."""

_COMMITTED_MS: dict[int, float] = {}
"""Per state-store partition: how long this worker's last task's commits took, told by
the next batch's first component (a task's commits end it, after its rows)."""


def pack_value(value: bytes) -> bytes:
    """A value as stored: its length, then its LZ4 frame. Pickled windows and held rows
    shrink about 3.6 times for ~1 ms per MB; every byte written crosses the socket to
    the JVM, RocksDB and the checkpoint's changelog, and a rebuild reads it back."""
    return len(value).to_bytes(8, "little") + _CODEC.compress(value, asbytes=True)


def unpack_value(stored: bytes) -> bytes:
    """A value as :func:`pack_value` stored it, unpacked."""
    size = int.from_bytes(stored[:8], "little")
    return _CODEC.decompress(stored[8:], decompressed_size=size, asbytes=True)


_Item = TypeVar("_Item")


class SparkStore:
    """A :class:`~engine.core.state.StateStore` over the group's two `MapState` s, its
    values LZ4-compressed.

    Listing a kind of ``entries`` reads the whole map once and keeps it, grouped by
    kind, until the next write: rebuilding a pipeline lists every kind in turn. Listing
    the keys of a kind of ``pieces`` reads all the map's keys once, the same way."""

    def __init__(self, entries: MapState, pieces: MapState) -> None:
        self.entries = entries
        self.pieces = pieces
        self._listed: dict[str, list[tuple[StateKey, bytes]]] | None = None
        self._piece_keys: dict[str, list[StateKey]] | None = None
        # Spark's state server, over a socket (PySpark's `TwsTester` keeps its state
        # in memory: no socket to send a pipeline of writes down).
        self._socket = hasattr(entries, "_mapStateClient")

    def _map(self, kind: str) -> MapState:
        return self.pieces if kind in STAGE_PIECE_KINDS else self.entries

    def get(self, key: StateKey) -> bytes | None:
        found = self._map(key[0]).getValue(key)
        return None if found is None else unpack_value(found[0])

    def get_many(self, keys: Sequence[StateKey]) -> list[bytes | None]:
        if not self._socket:
            return [self.get(key) for key in keys]
        found: dict[StateKey, bytes | None] = {}
        for state, run in self._runs(keys, lambda key: key):
            for key, value in zip(run, state_client.get_pipelined(state, run), strict=True):
                found[key] = None if value is None else unpack_value(value)
        return [found[key] for key in keys]

    def _runs(
        self, items: Sequence[_Item], key_of: Callable[[_Item], StateKey]
    ) -> Iterator[tuple[MapState, list[_Item]]]:
        """``items`` grouped by the map state their key is in, in runs of at most
        ``PIPELINED`` (one pipeline each)."""
        for state in (self.entries, self.pieces):
            mine = [item for item in items if self._map(key_of(item)[0]) is state]
            for start in range(0, len(mine), PIPELINED):
                yield state, mine[start : start + PIPELINED]

    def _changed(self) -> None:
        self._listed = self._piece_keys = None

    def put(self, key: StateKey, value: bytes) -> None:
        self._changed()
        self._map(key[0]).updateValue(key, (pack_value(value),))

    def delete(self, key: StateKey) -> None:
        self._changed()
        self._map(key[0]).removeKey(key)

    def write(self, changes: Sequence[tuple[StateKey, bytes | None]]) -> None:
        self._changed()
        if not self._socket:
            for key, value in changes:
                if value is None:
                    self.delete(key)
                else:
                    self.put(key, value)
            return
        packed = [(k, None if v is None else pack_value(v)) for k, v in changes]
        for state, run in self._runs(packed, lambda change: change[0]):
            send_pipelined(state, run)

    def _iterate(self, state: MapState) -> Iterator[tuple[Any, Any]]:
        return state_client.iterate(state) if self._socket else state.iterator()

    def scan(self, kind: str) -> Iterator[tuple[StateKey, bytes]]:
        if kind in STAGE_PIECE_KINDS:
            for key, value in self._iterate(self.pieces):
                if key[0] == kind:
                    yield tuple(key), unpack_value(value[0])
            return
        if self._listed is None:
            listed: dict[str, list[tuple[StateKey, bytes]]] = {}
            for key, value in self._iterate(self.entries):
                listed.setdefault(key[0], []).append((tuple(key), unpack_value(value[0])))
            self._listed = listed
        yield from self._listed.get(kind, [])

    def keys(self, kind: str) -> Iterator[StateKey]:
        if kind not in STAGE_PIECE_KINDS:
            yield from (key for key, _ in self.scan(kind))
            return
        if self._piece_keys is None:
            found: dict[str, list[StateKey]] = {}
            listing = state_client.keys(self.pieces) if self._socket else self.pieces.keys()
            for key in listing:
                found.setdefault(key[0], []).append(tuple(key))
            self._piece_keys = found
        yield from self._piece_keys.get(kind, [])

    def token(self) -> str | None:
        """The token the last batch stored beside the state."""
        found = self.get(_TOKEN)
        return None if found is None else found.decode()

    def set_token(self, token: str) -> None:
        """Store this batch's token (not through a journal: it is read every batch)."""
        self.put(_TOKEN, token.encode())


@lru_cache(maxsize=4)
def unpacked(packed: bytes) -> tuple[dict[str, Component], Config]:
    """A processor's components (by name) and configuration: each task unpickles a new
    processor, so a worker unpickles what it carries once per rule set (the last few
    kept)."""
    components, config = pickle.loads(packed)
    return components, config


def run(processor: EngineProcessor, name: str, rows: Iterable[Row]) -> Iterator[Row]:
    """The batch of component `name` the processor is handed (its `rows`, one per landing
    file): the rows of the files it wrote, then one of health figures."""
    began_ms = int(time.time() * 1000)  # after the task's start, state load and input
    phases = _Phases()
    components, config = unpacked(processor.packed)
    component = components[name]
    memo_id = f"{processor.memo_id}#{component.name}"
    batch_id = _batch_id()
    with collector_paused():
        arrivals, quarantine = _arrivals(rows, config, component)
        phases.end("read")
        store = SparkStore(processor.entries, processor.pieces)
        pipeline, journal, reused = _pipeline(config, component, memo_id, store)
        warm = _warm_start(config, pipeline)
        phases.end("restore")
        result = pipeline.admit(arrivals)
        # Leaving the block waits for the thread, so a failed batch writes nothing after.
        with ThreadPoolExecutor(1, thread_name_prefix="write-admitted") as writer:
            admitted = admitted_tables(component.plan, result, quarantine)
            written_admitted = writer.submit(_write, config, admitted, batch_id)
            pipeline.evaluate(result)
            phases.end("evaluate")
            pipeline.save()
            journal.commit()
            phases.end("save")
            written = written_admitted.result()
        evaluated = evaluated_tables(component.plan, component.alerts, result)
        written += _write(config, evaluated, batch_id)
        if warm is not None:
            past = batch_tables(warm.plan, component.alerts, warm.past)
            written += _write(config, past, batch_id)
        for file in written:
            processor.pending.setdefault(file.table, []).append(file)
        token = uuid.uuid4().hex
        store.set_token(token)
        _PIPELINES[memo_id] = (token, pipeline)
        freeze_batch_survivors()
        phases.end("write")
    figures = {
        "component": component.name,
        "streams": {
            name: {
                "max_event_ms": pipeline.sequencers[name].clock.max_ts,
                "watermark_ms": result.watermarks[name],
                "readings": result.readings[name].num_rows if name in result.readings else 0,
                "late": sum(1 for x in result.late if x.stream == name),
                "duplicates": result.duplicates.get(name, 0),
                "conflicts": sum(1 for x in result.conflicts if x.stream == name),
                "heartbeats": result.heartbeats.get(name, 0),
                "capped": sum(1 for x in result.capped if x.stream == name),
                **pipeline.key_figures(name),
                "sources": pipeline.sequencers[name].sources(),
            }
            for name in pipeline.sources
        },
        "quarantined": len(quarantine),
        "keys": pipeline.live_keys(),
        "firing": pipeline.firing(),
        "dropped": pipeline.dropped if not reused else [],
        "warmed": warm.describe() if warm is not None else None,
        "reused": reused,
        "began_ms": began_ms,
        **phases.figures(),
    }
    if (committed_ms := _COMMITTED_MS.pop(_partition(), None)) is not None:
        figures["commit_ms"] = committed_ms
    for file in written:
        yield Row(
            kind="file",
            table=file.table,
            path=file.path,
            size=file.size,
            records=file.records,
            modified=file.modified_ms,
            stats=file.stats,
        )
    yield Row(
        kind="health",
        table=None,
        path=None,
        size=None,
        records=None,
        modified=None,
        stats=orjson.dumps(figures).decode(),
    )


def _pipeline(
    config: Config, component: Component, memo_id: str, store: SparkStore
) -> tuple[Pipeline, JournaledStore, bool]:
    """The pipeline this batch starts from, its store, and whether it was still in
    memory."""
    memo = _PIPELINES.pop(memo_id, None)
    if memo is not None and memo[0] == store.token():
        pipeline = memo[1]
        assert isinstance(pipeline.store, JournaledStore)
        pipeline.store.inner = store
        return pipeline, pipeline.store, True
    if memo is not None:
        del memo
        collect_frozen()
    journal = JournaledStore.open(store)
    caps = config.engine.live_key_caps(component.sources)
    return Pipeline(component.plan, component.sources, journal, caps=caps), journal, False


def _warm_start(config: Config, pipeline: Pipeline) -> WarmStart | None:
    """Fill the windows of the pipeline's new or edited rules from the stored
    readings (`engine.warm_start`), once: the state it adopts is saved with the
    batch, and a pipeline resumed from it has no fresh rule."""
    engine = config.engine
    warm = warm_start(
        pipeline,
        config.lakehouse,
        int(engine.backfill_minutes * 60_000),
        engine.backfill_alerts,
        config.s3,
    )
    if warm is not None:
        pipeline.adopt(warm.entries)
    return warm


def _write(
    config: Config, new_rows: Mapping[str, pa.Table], batch_id: int | None
) -> list[tables.DataFile]:
    """Each table's new rows as a Parquet file in its folder, named after the batch
    (so that the files of a batch that never commits can be told:
    `engine.tables.remove_orphans`)."""
    return [
        tables.write_data_file(name, config.table(name), data, config.s3, batch_id)
        for name, data in new_rows.items()
    ]


def commit(processor: EngineProcessor) -> None:
    """Commit the files the task's components wrote (`processor.pending`), each table
    once, exactly once for this batch and the task's partition (`engine.spark.commit`)."""
    pending, processor.pending = processor.pending, {}
    batch_id = _batch_id()
    if batch_id is None:
        raise RuntimeError("the engine's files are committed by a streaming batch's task")
    started = time.perf_counter()
    _, config = unpacked(processor.packed)
    if config.s3 not in _COMMITS:
        _COMMITS[config.s3] = TaskCommits(config.s3)
    writer = (QUERY_NAME, _partition())
    _COMMITS[config.s3].commit(config, _schemas(processor.packed), pending, writer, batch_id)
    _COMMITTED_MS[writer[1]] = round((time.perf_counter() - started) * 1000, 1)


@lru_cache(maxsize=4)
def _schemas(packed: bytes) -> dict[str, pa.Schema]:
    """The schema of every table the processor's components may write."""
    components, _ = unpacked(packed)
    schemas: dict[str, pa.Schema] = {}
    for component in components.values():
        schemas.update(table_schemas(component.plan, component.sources))
    return schemas


def _partition() -> int:
    """The state-store partition this task runs (0 outside a Spark task)."""
    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


class _Phases:
    """The stateful step's phases, one after another: each one's time in ms, as the
    health figures name them (``read_ms``, ``restore_ms``, ...)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self._ms: dict[str, float] = {}

    def end(self, phase: str) -> None:
        """The phase running since the last ended (or since the step began) ends now."""
        now = time.perf_counter()
        self._ms[f"{phase}_ms"] = round((now - self._last) * 1000, 1)
        self._last = now

    def figures(self) -> dict[str, float]:
        return dict(self._ms)


def _batch_id() -> int | None:
    """The id of the micro-batch this task runs (Spark hands it to every task of a
    streaming batch), None outside one."""
    context = TaskContext.get()
    value = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
    return int(value) if value else None


def _arrivals(
    rows: Iterable[Row], config: Config, component: Component
) -> tuple[dict[str, pa.Table], list[dict[str, Any]]]:
    """The batch's files (one row each) read and parsed in landing order: each stream's
    arrivals, and the quarantine lines."""
    files = sorted((row["file"], row["stream"]) for row in rows)
    fs, root = folder_filesystem(config.landing, config.s3)
    schemas = {name: component.plan.streams[name] for name in component.sources}
    return read_landed(fs, root, files, schemas)
