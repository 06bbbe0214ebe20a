"""Rule stages on Structured Streaming: a thin adapter around the pure engine core.

All stages that read one stream share one streaming query (one read of the stream):

    readStream(Delta table of the stream) + its heartbeats   # timestamps as epoch ms
      .mapInArrow(Router)                  # per Arrow batch: one packed row per
                                           # stateful group holding its rows (packing.py)
      .withWatermark(latest event time, slack + 1 ms)
      .groupBy(group, bucket)              # the evaluators of the stations whose
                                           # keys hash to one bucket, say
      .transformWithState(StageProcessor)         # a KeyedEvaluator per (stage, key),
                                                  # saved in the RocksDB state store:
                                                  # the group's heads in one value, and
                                                  # RANGE frames' tuples in chunks
      .foreachBatch(OutputWriter)                 # exactly-once Delta appends

Spark drops rows at or below its watermark; the pin keeps `ts == max - slack` on time,
hence the extra millisecond, and the watermark over packed rows is the one over their
rows (each packed row's event time is its latest). The processor advances its evaluator
to the higher of `spark_watermark + 1` (every row still to come has ts > spark_watermark)
and the landing's `arrival_watermark` stamps on the rows it got: Spark's watermark is the
previous batch's, the stamps are this batch's, so most rows are final in the batch that
brings them instead of being pickled into the state store until the next one. It keeps
one event-time timer per group at its evaluators' earliest `next_wakeup`, which is how
expirations and time slides fire in a batch with no input for that key.

A derived stream's readers need its producer's event time, not only its rows: when the
producer's input goes quiet (or a final heartbeat arrives), the rows still pending in
the readers would otherwise wait for a next row that never comes. So a query whose
stages feed a stream other stages read runs one more group, the *clock*: heartbeats are
routed to it, and it keeps a timer one millisecond past the watermark, so it ticks in
every batch that moves the watermark. `OutputWriter` turns a tick into a heartbeat of
each fed stream (after that batch's rows), and the reading query unions those
heartbeats in. With several producers (UNION ALL) each producer's rows and heartbeats
get their own watermark and Spark keeps the lowest (`multipleWatermarkPolicy=min`),
the watermark `engine.core.replay` gives a union sink.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from functools import reduce
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from engine import tables
from engine.alerts import AlertSpec, alert_rows, format_key
from engine.core.evaluator import KeyedEvaluator, Output, OutputColumns, output_rows
from engine.core.plan import ColumnType, Plan, SinkKind, Stage, StreamSchema
from engine.spark.packing import (
    ARRIVAL_WM,
    BUCKET,
    CLOCK,
    EVENT_TIME,
    GROUP,
    GROUP_KEY,
    HEARTBEAT,
    PACKED_DDL,
    ROWS,
    Route,
    Router,
    evaluator_keys,
    ipc_bytes,
    read_ipc,
    routes,
    unpack,
)
from engine.spark.worker_gc import collector_paused, freeze_worker_heap
from lookout.config import Config
from lookout.storage import lakehouse_options

# What the processor emits: per group advance and sink, that sink's outputs as one Arrow
# IPC payload (`stream_rows` for a derived stream, `RAW_OUTPUTS` for an alert or the
# clock), so Spark carries a row per group rather than per output.
OUTPUT_SCHEMA = "sink STRING, outputs BINARY"
RAW_OUTPUTS = pa.schema(
    [
        pa.field("ts", pa.int64()),
        pa.field("key", pa.string()),
        pa.field("row", pa.string()),
        pa.field("source", pa.string()),
        pa.field("seq", pa.int64()),
    ]
)
# Files of a readings or derived table per micro-batch: the landing writes one file per
# stream and landing batch (about a second of readings).
MAX_FILES_PER_BATCH = 20
# A group's state: its evaluators' heads and wakeups, pickled as one value (one read
# and one write per group and batch), and their RANGE frames' chunks.
_STATE = T.StructType([T.StructField("evaluators", T.BinaryType())])
_CHUNK_KEY = T.StructType(
    [
        T.StructField("stage", T.StringType()),
        T.StructField("key", T.StringType()),
        T.StructField("number", T.LongType()),
    ]
)
_CHUNK = T.StructType([T.StructField("data", T.BinaryType())])

Saved = dict[tuple[str, str], tuple[bytes, int | None, str]]
"""A group's evaluators as stored: (stage name, key as JSON) -> (head, next wakeup, the
stage's `Query.definition` when saved)."""


def earliest_wakeup(saved: Saved) -> int | None:
    """The earliest next wakeup of a group's evaluators: where its one timer goes."""
    return min((w for _, w, _ in saved.values() if w is not None), default=None)


class StageProcessor(StatefulProcessor):
    """Runs the `KeyedEvaluator` of each (stage, partition key) inside Spark.

    One processor serves every stage that reads the same table. Spark groups the packed
    rows (`engine.spark.packing`) by group name and bucket: the evaluators whose keys
    start with a value of a shared key (a station's, for every stage keyed by station
    first) that hashes to the bucket, or a key-less stage's one evaluator. A group's
    state holds its evaluators by (stage name, key), so a stage keeps its state across
    restarts when other rules are added.
    """

    def __init__(
        self,
        stages: Mapping[str, Stage],
        streams: Mapping[str, StreamSchema],
        stage_routes: Sequence[Route],
    ) -> None:
        self.stages = dict(stages)
        self.streams = dict(streams)  # the derived streams the stages write, by name
        # Each group's stages: the routes the query's router packs by.
        self.groups: dict[str, list[Route]] = {}
        for route in stage_routes:
            self.groups.setdefault(route.group, []).append(route)

    def init(self, handle: StatefulProcessorHandle) -> None:
        freeze_worker_heap()
        self.handle = handle
        self.state = handle.getValueState("evaluators", _STATE)
        # A RANGE frame's tuples, in chunks (`KeyedEvaluator.save`): a batch reads and
        # writes the window's ends, not the whole window.
        self.chunks = handle.getMapState("chunks", _CHUNK_KEY, _CHUNK)

    def _saved(self) -> tuple[Saved, int | None]:
        """The group's evaluators of stages still in the rules as they were saved, and
        the wakeup its timer was armed at (by every evaluator it had, see `_store`).

        An evaluator of a stage removed from the rules, or whose rule has been edited
        since (`Query.definition`), is deleted with its chunks: its state was built
        by another rule, and a stage that comes back has missed readings meanwhile."""
        found = self.state.get()  # one round trip to the state server, not two
        saved: Saved = {} if found is None else pickle.loads(found[0])
        armed = earliest_wakeup(saved)
        stale = {
            name_key
            for name_key, (_, _, definition) in saved.items()
            if name_key[0] not in self.stages
            or self.stages[name_key[0]].query.definition != definition
        }
        if stale:
            for name_key in stale:
                del saved[name_key]
            for chunk in list(self.chunks.keys()):
                if (chunk[0], chunk[1]) in stale:
                    self.chunks.removeKey(chunk)
        return saved, armed

    def _load(self, saved: Saved, stage: Stage, key: str) -> KeyedEvaluator:
        entry = saved.get((stage.name, key))
        if entry is None:
            return KeyedEvaluator(stage)

        def read_chunk(number: int) -> bytes:
            found = self.chunks.getValue((stage.name, key, number))
            if found is None:
                raise KeyError(f"state chunk {number} of {stage.name} {key} missing")
            return found[0]

        return KeyedEvaluator.load(stage, entry[0], read_chunk)

    def handleInputRows(
        self, key: Any, rows: Iterator[Row], timerValues: TimerValues
    ) -> Iterator[Row]:
        if key[0] in (CLOCK, HEARTBEAT):
            for _ in rows:  # heartbeats: only their arrival matters
                pass
            if key[0] == CLOCK:
                yield from self._tick(timerValues)
            return
        with collector_paused():
            saved, armed = self._saved()
            # Spark's watermark is the previous batch's; the landing's stamps are this
            # one's (and the stream's: valid for every evaluator), so this batch's rows
            # are final now rather than pickled until the next.
            watermark = timerValues.getCurrentWatermarkInMs() + 1
            # The bucket's rows by group key (a key can come in several packed rows).
            readings: dict[str, list[dict[str, Any]]] = {}
            for row in rows:
                if row[ARRIVAL_WM] is not None:
                    watermark = max(watermark, row[ARRIVAL_WM])
                readings.setdefault(row[GROUP_KEY], []).extend(unpack(row[ROWS]))
            outputs: list[Row] = []
            for route in self.groups[key[0]]:
                stage = self.stages[route.stage]
                for group_key, members in readings.items():
                    for evaluator_key, mine in evaluator_keys(route, group_key, members).items():
                        evaluator = self._load(saved, stage, evaluator_key)
                        evaluator.insert_many(mine)
                        outputs += self._advance(saved, stage, evaluator_key, evaluator, watermark)
            self._store(saved, armed)
        yield from outputs

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        if key[0] == CLOCK:
            yield from self._tick(timerValues)
            return
        watermark = timerValues.getCurrentWatermarkInMs() + 1
        with collector_paused():
            saved, _ = self._saved()
            outputs: list[Row] = []
            for (name, evaluator_key), (_, wakeup, _) in list(saved.items()):
                if wakeup is None or wakeup > watermark:
                    continue  # not due
                stage = self.stages[name]
                evaluator = self._load(saved, stage, evaluator_key)
                outputs += self._advance(saved, stage, evaluator_key, evaluator, watermark)
            # The expiring timer was the group's only one; Spark deletes it after this.
            self._store(saved, None)
        yield from outputs

    def _tick(self, timer_values: TimerValues) -> Iterator[Row]:
        """The clock group: report the watermark every stage of this batch advanced to."""
        watermark = timer_values.getCurrentWatermarkInMs()
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        # Expires in the next batch whose watermark is higher: one tick per advance.
        self.handle.registerTimer(watermark + 1)
        yield from packed_outputs([Output(CLOCK, watermark + 1, {})], "", {})

    def _advance(
        self, saved: Saved, stage: Stage, key: str, evaluator: KeyedEvaluator, watermark: int
    ) -> list[Row]:
        """Advance to `watermark` (never back: the landing's stamps may have taken the
        evaluator past Spark's watermark), note it in `saved` (its chunks are written
        now), and return its outputs packed."""
        outputs = evaluator.advance_columns(max(watermark, evaluator.watermark))
        state = evaluator.save()
        saved[(stage.name, key)] = (state.head, evaluator.next_wakeup(), stage.query.definition)
        for number in state.deletes:
            self.chunks.removeKey((stage.name, key, number))
        for number, data in state.writes.items():
            self.chunks.updateValue((stage.name, key, number), (data,))
        if not outputs:
            return []
        key_text = format_key(stage.key, tuple(orjson.loads(key)))
        return packed_outputs(outputs, key_text, self.streams)

    def _store(self, saved: Saved, armed: int | None) -> None:
        """Write the group's evaluators, and re-arm its timer.

        A group has at most one timer, at its evaluators' earliest wakeup - 1 as last
        stored: `armed` is that wakeup (None if no timer is set), so the timer moves only
        when the wakeup does, without listing timers (each call is a round trip to the
        JVM's state server, per group and batch)."""
        self.state.update((pickle.dumps(saved, protocol=pickle.HIGHEST_PROTOCOL),))
        wakeup = earliest_wakeup(saved)
        if wakeup != armed:
            if armed is not None:
                self.handle.deleteTimer(armed - 1)
            if wakeup is not None:
                # Fires once the Spark watermark reaches wakeup - 1, i.e. advance(wakeup).
                self.handle.registerTimer(wakeup - 1)

    def close(self) -> None:
        pass


def packed_outputs(
    outputs: Sequence[Output | OutputColumns], key: str, streams: Mapping[str, StreamSchema]
) -> list[Row]:
    """`OUTPUT_SCHEMA` rows for one group's outputs (`key` as alerts show it): one per
    sink, typed as the derived stream's table in `streams`, else as `RAW_OUTPUTS`."""
    by_sink: dict[str, list[Output | OutputColumns]] = {}
    for output in outputs:
        by_sink.setdefault(output.sink, []).append(output)
    return [
        Row(
            sink=sink,
            outputs=ipc_bytes(
                stream_rows(streams[sink], part)
                if sink in streams
                else raw_outputs(output_rows(part), key)
            ),
        )
        for sink, part in by_sink.items()
    ]


def raw_outputs(outputs: list[Output], key: str) -> pa.Table:
    """Outputs as `RAW_OUTPUTS` rows: the row as JSON, for the driver's alert rows."""
    return pa.Table.from_arrays(
        [
            pa.array([o.ts for o in outputs], pa.int64()),
            pa.array([key] * len(outputs), pa.string()),
            pa.array([orjson.dumps(o.row).decode() for o in outputs], pa.string()),
            pa.array([o.source for o in outputs], pa.string()),
            pa.array([o.seq for o in outputs], pa.int64()),
        ],
        schema=RAW_OUTPUTS,
    )


class OutputWriter:
    """foreachBatch sink of one rules query: derived streams to their tables, alerts to
    `alerts`, each append exactly once per batch (delta-rs, from the driver: a batch's
    outputs are few)."""

    def __init__(
        self,
        config: Config,
        plan: Plan,
        alerts: Mapping[str, AlertSpec],
        name: str,
        stages: tuple[Stage, ...],
    ) -> None:
        self.config = config
        self.plan = plan
        self.alerts = alerts
        self.name = name
        self.kinds = {sink: kind for stage in stages for sink, kind in _sinks(stage).items()}
        self.fed = fed_streams(plan, stages)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        packed = batch.toArrow()
        parts: dict[str, list[pa.Table]] = {}
        for sink, payload in zip(
            packed.column("sink").to_pylist(), packed.column("outputs").to_pylist(), strict=True
        ):
            parts.setdefault(sink, []).append(read_ipc(payload))
        alerts: list[dict[str, Any]] = []
        ticks: list[int] = []
        for sink in sorted(parts):
            part = pa.concat_tables(parts[sink])
            if sink == CLOCK:
                ticks = part.column("ts").to_pylist()
            elif self.kinds[sink] == SinkKind.ALERT:
                spec = self.alerts.get(sink, AlertSpec(sink, "warning"))
                alerts += alert_rows(spec, part.to_pylist())
            else:
                tables.append_once(
                    self.config.table(sink),
                    tables.derived_schema(self.plan.streams[sink]),
                    part,  # typed as the table by the processor (`stream_rows`)
                    f"lookout-{self.name}-{sink}",
                    batch_id,
                    self.config.s3,
                )
        tables.append_once(
            self.config.table("alerts"),
            tables.ALERTS,
            alerts,
            f"lookout-{self.name}-alerts",
            batch_id,
            self.config.s3,
        )
        if ticks:
            # After the rows: a reader that sees this heartbeat sees every row it covers.
            at = tables.to_timestamp(max(ticks))
            now = datetime.now(UTC)
            for stream in self.fed:
                tables.append_once(
                    self.config.table(tables.heartbeats_table(stream)),
                    tables.HEARTBEATS,
                    [{"stream": stream, "source": self.name, "ts": at, "received_at": now}],
                    f"lookout-{self.name}-clock",
                    batch_id,
                    self.config.s3,
                )


def stream_rows(schema: StreamSchema, outputs: Sequence[Output | OutputColumns]) -> pa.Table:
    """A derived stream's outputs as its table stores them: the SELECT list and the
    (source, seq) tie order that stages reading the stream use. Built column by column
    (a batch can hold a million windows); timestamps are epoch ms in the rows."""
    target = tables.derived_schema(schema)
    fields = list(tables.stream_schema(schema))
    parts: list[pa.Table] = []
    rows: list[Output] = []
    for output in [*outputs, None]:
        if isinstance(output, Output):
            rows.append(output)
            continue
        if rows:  # a run of single outputs, ended
            columns = tables.ms_columns([o.row for o in rows], fields)
            sources = pa.array([o.source for o in rows], pa.string())
            seqs = pa.array([o.seq for o in rows], pa.int64())
            parts.append(pa.Table.from_arrays([*columns, sources, seqs], schema=target))
            rows = []
        if output is not None:
            count = len(output.ts)
            columns = [
                tables.ms_array(output.columns.get(f.name, [None] * count), f.type) for f in fields
            ]
            sources = pa.repeat(pa.scalar(output.source, pa.string()), count)
            seqs = pa.array(np.arange(output.seq, output.seq + count, dtype=np.int64))
            parts.append(pa.Table.from_arrays([*columns, sources, seqs], schema=target))
    return pa.concat_tables(parts) if parts else target.empty_table()


def _sinks(stage: Stage) -> dict[str, SinkKind]:
    return {q.sink.name: q.sink.kind for q in (stage.query, *stage.downstream)}


def query_name(stream: str) -> str:
    """The name of the rules query that runs the stages reading `stream`."""
    return f"rules-{stream}"


def fed_streams(plan: Plan, stages: tuple[Stage, ...]) -> tuple[str, ...]:
    """The derived streams `stages` write that some stage of `plan` reads."""
    read = {stage.input for stage in plan.stages()}
    written = {sink for stage in stages for sink in _sinks(stage)}
    return tuple(sorted(written & read))


def producers(plan: Plan, stream: str) -> dict[str, tuple[str, ...]]:
    """For a derived `stream`: each input stream whose query writes it, with the names
    of the stages (the first element of its rows' `source`) that do."""
    found: dict[str, list[str]] = {}
    for stage in plan.stages():
        if stream in _sinks(stage):
            found.setdefault(stage.input, []).append(stage.name)
    return {name: tuple(stages) for name, stages in found.items()}


def stages_by_input(plan: Plan) -> dict[str, tuple[Stage, ...]]:
    """The plan's stages grouped by the stream they read (one rules query per stream)."""
    grouped: dict[str, list[Stage]] = {}
    for stage in plan.stages():
        grouped.setdefault(stage.input, []).append(stage)
    return {stream: tuple(stages) for stream, stages in grouped.items()}


def _branches(
    spark: SparkSession, config: Config, plan: Plan, stream: str, ts: str
) -> list[tuple[DataFrame, int]]:
    """The rows of `stream` and the heartbeats that move its time, each branch with the
    slack its watermark gets; every timestamp in epoch ms.

    A source stream is one branch: its accepted readings with its sensors' heartbeats,
    at its slack. A derived one has a branch per producing query: the rows that query's
    stages wrote, with its clock heartbeats, at no slack.
    """
    schema = plan.streams[stream]
    is_source = stream in {s.name for s in plan.sources()}
    table = tables.readings_table(stream) if is_source else stream
    # A bounded batch after a backlog (a restart, a burst): its outputs are collected on
    # the driver, and one batch of a whole day's readings does not fit there.
    rows = (
        spark.readStream.format("delta")
        .option("maxFilesPerTrigger", MAX_FILES_PER_BATCH)
        .load(config.table(table))
    )
    columns = [
        F.unix_millis(F.col(c.name)).alias(c.name)
        if c.type == ColumnType.TIMESTAMP
        else F.col(c.name)
        for c in schema.columns
    ]
    # Readings and derived rows alike carry their (source, seq) tie order.
    columns += [F.col("source"), F.col("seq")]
    columns.append(
        F.unix_millis(F.col("arrival_watermark")).alias(ARRIVAL_WM)
        if is_source
        else F.lit(None).cast("long").alias(ARRIVAL_WM)
    )
    rows = rows.select(*columns, F.lit(False).alias(HEARTBEAT))

    def with_beats(rows: DataFrame, producer: str | None = None) -> DataFrame:
        beats = spark.readStream.format("delta").load(config.table(tables.heartbeats_table(stream)))
        if producer is not None:  # a derived stream's table holds every producer's clock
            beats = beats.where(F.col("source") == query_name(producer))
        beats = beats.select(F.unix_millis(F.col("ts")).alias(ts), F.lit(True).alias(HEARTBEAT))
        # Heartbeats first: Spark reads its sources' offsets in plan order, and a
        # heartbeat is appended after the rows it covers, so seeing it means seeing them.
        return beats.unionByName(rows, allowMissingColumns=True)

    if is_source:
        return [(with_beats(rows), schema.slack_ms)]
    writers = producers(plan, stream)
    return [
        (
            with_beats(
                rows.where(F.get_json_object("source", "$[0]").isin(*names))
                if len(writers) > 1
                else rows,
                producer,
            ),
            0,
        )
        for producer, names in sorted(writers.items())
    ]


def start_rules_query(
    spark: SparkSession,
    config: Config,
    plan: Plan,
    alerts: Mapping[str, AlertSpec],
    stream: str,
    stages: tuple[Stage, ...],
) -> StreamingQuery:
    """Start the one streaming query that runs every stage reading `stream`."""
    ts = stages[0].timestamp
    written = {
        sink: plan.streams[sink]
        for stage in stages
        for sink, kind in _sinks(stage).items()
        if kind == SinkKind.STREAM
    }
    options = lakehouse_options(config)
    for sink in written.values():
        tables.ensure_table(config.table(sink.name), tables.derived_schema(sink), options)
    tables.ensure_table(config.table("alerts"), tables.ALERTS, options)
    for beats in (stream, *fed_streams(plan, stages)):
        tables.ensure_table(
            config.table(tables.heartbeats_table(beats)), tables.HEARTBEATS, options
        )
    stage_routes = routes({stage.name: stage.key for stage in stages})
    router = Router(
        stage_routes,
        ts,
        (*(c.name for c in plan.streams[stream].columns), "source", "seq"),
        # Heartbeats start the clock (its timer keeps it ticking afterwards).
        clock=bool(fed_streams(plan, stages)),
    )
    # The watermark is set on the packed rows' latest event time: Spark's watermark is
    # the max over them, the same as over the rows, and heartbeats count in it. Each
    # branch gets its own; Spark keeps the lowest (a UNION ALL sink waits for its
    # slowest producer; one that has seen nothing yet counts as 0).
    packed = [
        rows.mapInArrow(router, PACKED_DDL).withWatermark(
            EVENT_TIME, f"{slack_ms + 1} milliseconds"
        )
        for rows, slack_ms in _branches(spark, config, plan, stream, ts)
    ]
    name = query_name(stream)
    outputs = (
        reduce(DataFrame.unionByName, packed)
        .groupBy(GROUP, BUCKET)
        .transformWithState(
            StageProcessor({s.name: s for s in stages}, written, stage_routes),
            OUTPUT_SCHEMA,
            "Append",
            "EventTime",
        )
    )
    return (
        outputs.writeStream.foreachBatch(OutputWriter(config, plan, alerts, name, stages))
        .queryName(name)
        .option("checkpointLocation", config.table(f"_checkpoints/{name}"))
        .trigger(processingTime=f"{config.engine.trigger_seconds} seconds")
        .start()
    )
