"""Readings packed per stateful group before they reach it (pure; no Spark).

PySpark hands a stateful group its rows one at a time: `transformWithStateInPandas`
iterated each Arrow batch row by row into a new DataFrame per group (about 10 µs per row
here, more than the engine core spends on it), and the Row-based `transformWithState`
that the rules query runs converts every cell to a Python object. So the rules query packs
rows first, in a stateless `mapInArrow` step where Arrow arrives whole: each batch of
input rows becomes one row per stateful group found in it, holding that group's rows as
an Arrow IPC stream (sorting, slicing and serialising stay in Arrow). The stateful step
then sees a few packed rows per batch instead of every reading, and Spark shuffles
fewer, larger rows.

**Groups.** Spark's stateful step pays per group and batch: a round trip to its state
server to set the group's key, each state read and write, each timer call. So a stage
whose key starts with another stage's key shares that stage's groups (`routes`): every
stage keyed by station, and `(station, lane)`, of one station together, ≈ 41 groups a
batch for the traffic library's 40 stations instead of ≈ 360, and a reading is packed
once per group rather than once per stage. A stage keyed by no other stage's key
prefix keeps a group per key (grouping an expressway's positions together would make
one group of all of them), and a stage with no key is a group of its own.

**Buckets.** Spark's stateful groups are not the keys themselves but (group name,
bucket): a group key's bucket is a stable hash of it modulo `BUCKETS`. With one Spark
group per station, 500 stations cost ≈ 0.4 s of every batch in round trips alone;
with buckets a batch pays for at most `BUCKETS` groups per group name however many
keys there are, and a bucket's state holds the evaluators of each of its keys.
`BUCKETS` is part of the checkpoint layout (a key's state is found by its bucket) and
bounds a query's parallelism per group name, which 64 leaves ample for a few workers.

A packed row: the group's name, bucket and key (a JSON array of its key values), the latest
event time of its rows (the column the watermark is set on), the highest landing stamp
of its rows (`arrival_watermark`, or null), and the rows; the stateful step splits
them among the group's stages and keys (`evaluator_keys`).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engine.spark.worker_gc import freeze_worker_heap

GROUP = "lookout_group"
GROUP_KEY = "lookout_group_key"
BUCKET = "lookout_bucket"
EVENT_TIME = "lookout_event_time"
ARRIVAL_WM = "lookout_arrival_watermark"
ROWS = "lookout_rows"
# Input columns the router reads besides the stream's own (the event time in ms, whether
# a row is a heartbeat); the stream's timestamp arrives under its own name, in ms.
HEARTBEAT = "lookout_heartbeat"
# The group (and output sink) of a query's clock: no stage is named with this prefix.
CLOCK = "lookout_clock"
# How many Spark groups a group name's keys are hashed into (module docstring).
BUCKETS = 64

PACKED_SCHEMA = pa.schema(
    [
        pa.field(GROUP, pa.string()),
        pa.field(BUCKET, pa.int32()),
        pa.field(GROUP_KEY, pa.string()),
        pa.field(EVENT_TIME, pa.timestamp("us", tz="UTC")),
        pa.field(ARRIVAL_WM, pa.int64()),
        pa.field(ROWS, pa.binary()),
    ]
)
PACKED_DDL = (
    f"{GROUP} STRING, {BUCKET} INT, {GROUP_KEY} STRING, {EVENT_TIME} TIMESTAMP, "
    f"{ARRIVAL_WM} LONG, {ROWS} BINARY"
)


@dataclass(frozen=True)
class Route:
    """A stage reading the stream, and the columns that partition it."""

    stage: str
    key: tuple[str, ...]
    shared: int = 0
    """How many leading key columns name the stage's stateful group (`routes`)."""

    @property
    def group(self) -> str:
        """The stateful group's name: ``by:<its key columns>``, or the stage's own name
        for a stage with no key (no stage name holds a colon)."""
        return f"by:{','.join(self.group_key)}" if self.shared else self.stage

    @property
    def group_key(self) -> tuple[str, ...]:
        """The columns whose values tell the stage's groups apart."""
        return self.key[: self.shared]


def routes(keys: dict[str, tuple[str, ...]]) -> tuple[Route, ...]:
    """The routes of stages (name -> key) read by one query: each stage's group is keyed
    by the shortest stage key that starts its own (module docstring)."""

    def shared(key: tuple[str, ...]) -> int:
        return min((len(k) for k in keys.values() if k and key[: len(k)] == k), default=0)

    return tuple(Route(stage, key, shared(key)) for stage, key in keys.items())


@dataclass(frozen=True)
class Router:
    """`mapInArrow` function: packs each batch of a stream's rows per stateful group.

    `timestamp` names the stream's event-time column (in ms); `columns` are the ones a
    stage's rows carry. A batch's heartbeats become one packed row (their time is all
    that matters): for the query's clock group with `clock`, else for a group that
    only counts them in the watermark.
    """

    routes: tuple[Route, ...]
    timestamp: str
    columns: tuple[str, ...]
    clock: bool

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_worker_heap()
        for batch in batches:
            if batch.num_rows:
                yield pack(batch, self)


def pack(batch: pa.RecordBatch, router: Router) -> pa.RecordBatch:
    """One packed row per stateful group of the batch's readings (plus one for its
    heartbeats). Sorting and converting run in Arrow; Python only slices lists."""
    beats = batch.column(HEARTBEAT).to_numpy(zero_copy_only=False)
    out: dict[str, list[Any]] = {f.name: [] for f in PACKED_SCHEMA}

    def emit(group: str, key: list[Any], times: np.ndarray, stamps: pa.Array, rows: bytes) -> None:
        key_text = key_json(key)
        out[GROUP].append(group)
        out[BUCKET].append(bucket(key_text))
        out[GROUP_KEY].append(key_text)
        out[EVENT_TIME].append(int(times.max()) * 1000)
        out[ARRIVAL_WM].append(pc.max(stamps).as_py())
        out[ROWS].append(rows)

    if beats.any():
        # Heartbeats carry only time; their packed row is what counts them in the
        # watermark, and the clock (if any) is where they go.
        times = batch.column(router.timestamp).to_numpy(zero_copy_only=False)[beats]
        emit(CLOCK if router.clock else HEARTBEAT, [], times, pa.array([], pa.int64()), b"")
    readings = batch.filter(pa.array(~beats)) if beats.any() else batch
    if not readings.num_rows:
        return pa.RecordBatch.from_pydict(out, schema=PACKED_SCHEMA)
    for group, columns in {route.group: route.group_key for route in router.routes}.items():
        rows = readings
        if columns:
            rows = readings.take(pc.sort_indices(readings, [(k, "ascending") for k in columns]))
        members = rows.select(list(router.columns))
        times = rows.column(router.timestamp).to_numpy(zero_copy_only=False)
        stamps = rows.column(ARRIVAL_WM)
        for start, end in itertools.pairwise(_cuts(rows, columns)):
            emit(
                group,
                [rows.column(name)[start].as_py() for name in columns],
                times[start:end],
                stamps.slice(start, end - start),
                ipc_bytes(members.slice(start, end - start)),
            )
    return pa.RecordBatch.from_pydict(out, schema=PACKED_SCHEMA)


def key_json(values: list[Any]) -> str:
    """A group's or an evaluator's key as text: a JSON array of its values. `pack` and
    `evaluator_keys` must write a key alike, as the state is found by this text."""
    return orjson.dumps(values).decode()


def bucket(group_key: str) -> int:
    """The bucket of a group key (as JSON): the same in every process, unlike `hash`."""
    return zlib.crc32(group_key.encode()) % BUCKETS


def evaluator_keys(
    route: Route, group_key: str, rows: list[dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """A group's `rows` (its key `group_key`, as packed) split by `route`'s stage key:
    each evaluator's key (`key_json`) to its rows in order."""
    if route.key == route.group_key:
        return {group_key: rows}  # `pack` cut them by this very key
    split: dict[str, list[dict[str, Any]]] = {}
    columns = route.key
    for row in rows:
        split.setdefault(key_json([row[c] for c in columns]), []).append(row)
    return split


def ipc_bytes(data: pa.RecordBatch | pa.Table) -> bytes:
    """`data` as an Arrow IPC stream: no Python object per row on either side."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return sink.getvalue().to_pybytes()


def read_ipc(payload: bytes) -> pa.Table:
    """The table an :func:`ipc_bytes` payload holds."""
    return pa.ipc.open_stream(payload).read_all()


def _cuts(rows: pa.RecordBatch, key: tuple[str, ...]) -> list[int]:
    """Where the key changes in rows sorted by it: [0, ..., n]. A cut where the key did
    not change (NaN, null) only splits a group in two, which grouping rejoins."""
    n = rows.num_rows
    change = np.zeros(max(n - 1, 0), dtype=bool)
    for name in key:
        values = rows.column(name).to_numpy(zero_copy_only=False)
        change |= values[1:] != values[:-1]
    return [0, *(np.flatnonzero(change) + 1).tolist(), n]


def unpack(payload: bytes) -> list[dict[str, Any]]:
    """The rows of a packed row, as the engine core takes them."""
    return read_ipc(payload).to_pylist()
