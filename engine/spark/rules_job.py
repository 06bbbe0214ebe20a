"""Rule stages on Structured Streaming: a thin adapter around the pure engine core.

All stages that read one stream share one streaming query (one read of the stream):

    readStream(Delta table of the stream)
      .withWatermark(ts, slack + 1 ms)           # Spark drops ts <= watermark; our pin
                                                 # keeps ts == max - slack on time
      explode: one row per (stage, row), tagged with the stage's name and key
      .groupBy(stage, key)
      .transformWithStateInPandas(StageProcessor) # one KeyedEvaluator per group, its
                                                  # snapshot in the RocksDB state store
      .foreachBatch(OutputWriter)                 # exactly-once Delta appends

The processor calls `advance(spark_watermark + 1)`: every row still to come has
ts > spark_watermark, so instants up to the watermark are final. It keeps one event-time
timer per group at the evaluator's `next_wakeup`, which is how expirations and time
slides fire in a batch with no input for that key.

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

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from functools import reduce
from typing import Any

import orjson
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
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
from engine.core.evaluator import KeyedEvaluator, Output
from engine.core.plan import ColumnType, Plan, SinkKind, Stage, StreamSchema
from lookout.config import Config

OUTPUT_SCHEMA = "sink STRING, ts LONG, key STRING, row STRING, source STRING, seq LONG"
# Spark hands pandas positional names (`_3`) for columns whose name starts with `_`,
# so the adapter's own columns are prefixed `lookout_` instead.
_TS_MS = "lookout_event_ms"
_STAGE = "lookout_stage"
_KEY = "lookout_key"
_HEARTBEAT = "lookout_heartbeat"
# Files of a readings or derived table per micro-batch: the landing writes one file per
# stream and landing batch (about a second of readings).
MAX_FILES_PER_BATCH = 20
# The group (and output sink) of a query's clock: no stage is named with this prefix.
CLOCK = "lookout_clock"
_STATE = T.StructType([T.StructField("snapshot", T.BinaryType())])


class StageProcessor(StatefulProcessor):
    """Runs the `KeyedEvaluator` of (stage, partition key) inside Spark.

    One processor serves every stage that reads the same table: Spark groups rows by
    (stage name, key as JSON), so each group is exactly one evaluator. Keying by name
    keeps a stage's state across restarts when other rules are added.
    """

    def __init__(self, stages: Mapping[str, Stage]) -> None:
        self.stages = dict(stages)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("evaluator", _STATE)

    def _load(self, stage: Stage) -> KeyedEvaluator:
        if self.state.exists():
            return KeyedEvaluator.restore(stage, self.state.get()[0])
        return KeyedEvaluator(stage)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        if key[0] == CLOCK:
            for _ in rows:  # heartbeats: only their arrival matters
                pass
            yield from self._tick(timerValues)
            return
        stage = self.stages[key[0]]
        evaluator = self._load(stage)
        # The timestamp comes as int ms (`_TS_MS`); its datetime column stays unread
        # (turning it into Python datetimes cost ~15 % of the worker's time).
        skip = (_STAGE, _KEY, stage.timestamp)
        for frame in rows:
            columns = {name: frame[name].tolist() for name in frame.columns if name not in skip}
            columns[stage.timestamp] = columns.pop(_TS_MS)
            names = list(columns)
            for values in zip(*columns.values(), strict=True):
                evaluator.insert(dict(zip(names, values, strict=True)))
        yield from self._advance(key, stage, evaluator, timerValues)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        if key[0] == CLOCK:
            yield from self._tick(timerValues)
            return
        stage = self.stages[key[0]]
        yield from self._advance(key, stage, self._load(stage), timerValues)

    def _tick(self, timer_values: TimerValues) -> Iterator[pd.DataFrame]:
        """The clock group: report the watermark every stage of this batch advanced to."""
        watermark = timer_values.getCurrentWatermarkInMs()
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        # Expires in the next batch whose watermark is higher: one tick per advance.
        self.handle.registerTimer(watermark + 1)
        yield pd.DataFrame(
            {
                "sink": [CLOCK],
                "ts": [watermark + 1],
                "key": [""],
                "row": ["{}"],
                "source": [""],
                "seq": [0],
            }
        )

    def _advance(
        self, key: Any, stage: Stage, evaluator: KeyedEvaluator, timer_values: TimerValues
    ) -> Iterator[pd.DataFrame]:
        outputs = evaluator.advance(timer_values.getCurrentWatermarkInMs() + 1)
        self.state.update((evaluator.snapshot(),))
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        wakeup = evaluator.next_wakeup()
        if wakeup is not None:
            # Fires once the Spark watermark reaches wakeup - 1, i.e. advance(wakeup).
            self.handle.registerTimer(wakeup - 1)
        if outputs:
            values = orjson.loads(key[1]) if stage.key else {}
            yield _frame(outputs, format_key(stage.key, tuple(values[k] for k in stage.key)))

    def close(self) -> None:
        pass


def _frame(outputs: list[Output], key: str) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "sink": [o.sink for o in outputs],
            "ts": [o.ts for o in outputs],
            "key": [key] * len(outputs),
            "row": [orjson.dumps(o.row).decode() for o in outputs],
            "source": [o.source for o in outputs],
            "seq": [o.seq for o in outputs],
        }
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
        by_sink: dict[str, list[dict[str, Any]]] = {}
        for record in batch.toArrow().to_pylist():
            by_sink.setdefault(record["sink"], []).append(record)
        ticks = by_sink.pop(CLOCK, [])
        alerts: list[dict[str, Any]] = []
        for sink, records in sorted(by_sink.items()):
            if self.kinds[sink] == SinkKind.ALERT:
                alerts += alert_rows(self.alerts.get(sink, AlertSpec(sink, "warning")), records)
            else:
                schema = self.plan.streams[sink]
                rows = [stream_row(schema, r) for r in records]
                tables.append_once(
                    self.config.table(sink),
                    tables.derived_schema(schema),
                    rows,
                    f"lookout-{self.name}-{sink}",
                    batch_id,
                )
        tables.append_once(
            self.config.table("alerts"),
            tables.ALERTS,
            alerts,
            f"lookout-{self.name}-alerts",
            batch_id,
        )
        if ticks:
            # After the rows: a reader that sees this heartbeat sees every row it covers.
            at = tables.to_timestamp(max(r["ts"] for r in ticks))
            now = datetime.now(UTC)
            beats = [
                {"stream": s, "source": self.name, "ts": at, "received_at": now} for s in self.fed
            ]
            tables.append_once(
                self.config.table("heartbeats"),
                tables.HEARTBEATS,
                beats,
                f"lookout-{self.name}-clock",
                batch_id,
            )


def stream_row(schema: StreamSchema, record: Mapping[str, Any]) -> dict[str, Any]:
    """A derived stream's output as its table stores it: the SELECT list (timestamps as
    datetimes) and the (source, seq) tie order that stages reading the stream use."""
    row = orjson.loads(record["row"])
    stored = {
        c.name: tables.to_timestamp(row.get(c.name))
        if c.type == ColumnType.TIMESTAMP
        else row.get(c.name)
        for c in schema.columns
    }
    stored.update(source=record["source"], seq=record["seq"])
    return stored


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


def _input_rows(spark: SparkSession, config: Config, plan: Plan, stream: str, ts: str) -> DataFrame:
    """The rows of `stream` and the heartbeats that move its time, watermarked.

    A source stream is read from its accepted readings with its sensors' heartbeats,
    watermarked at its slack. A derived one is read from its own table with its
    producers' clock heartbeats, one watermark per producing query.
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
        if c.type == ColumnType.TIMESTAMP and c.name != ts
        else F.col(c.name)
        for c in schema.columns
    ]
    # Readings and derived rows alike carry their (source, seq) tie order.
    columns += [F.col("source"), F.col("seq")]
    rows = rows.select(*columns, F.lit(False).alias(_HEARTBEAT))

    def with_beats(rows: DataFrame, which: Any, slack_ms: int) -> DataFrame:
        beats = (
            spark.readStream.format("delta")
            .load(config.table("heartbeats"))
            .where(which)
            .select(F.col("ts").alias(ts), F.lit(True).alias(_HEARTBEAT))
        )
        # Heartbeats first: Spark reads its sources' offsets in plan order, and a
        # heartbeat is appended after the rows it covers, so seeing it means seeing them.
        # The watermark is set before the routing, so heartbeats count in it.
        return beats.unionByName(rows, allowMissingColumns=True).withWatermark(
            ts, f"{slack_ms + 1} milliseconds"
        )

    if is_source:
        return with_beats(rows, F.col("stream") == stream, schema.slack_ms)
    writers = producers(plan, stream)
    branches = [
        with_beats(
            rows.where(F.get_json_object("source", "$[0]").isin(*names))
            if len(writers) > 1
            else rows,
            (F.col("stream") == stream) & (F.col("source") == query_name(producer)),
            0,
        )
        for producer, names in sorted(writers.items())
    ]
    # A UNION ALL sink: Spark's watermark is the lowest of the branches' (policy min).
    return reduce(DataFrame.unionByName, branches)


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
    for stage in stages:
        for q in (stage.query, *stage.downstream):
            if q.sink.kind == SinkKind.STREAM:
                sink = plan.streams[q.sink.name]
                tables.ensure_table(config.table(sink.name), tables.derived_schema(sink))
    tables.ensure_table(config.table("alerts"), tables.ALERTS)
    tables.ensure_table(config.table("heartbeats"), tables.HEARTBEATS)
    rows = _input_rows(spark, config, plan, stream, ts)
    # One row per (stage, row): each stage groups by its own key columns.
    to_stages = F.when(
        ~F.col(_HEARTBEAT),
        F.array(
            *[
                F.struct(
                    F.lit(stage.name).alias(_STAGE),
                    (F.to_json(F.struct(*stage.key)) if stage.key else F.lit("")).alias(_KEY),
                )
                for stage in stages
            ]
        ),
    )
    if fed_streams(plan, stages):
        # Heartbeats start the clock (its timer keeps it ticking afterwards).
        to_stages = to_stages.otherwise(
            F.array(F.struct(F.lit(CLOCK).alias(_STAGE), F.lit("").alias(_KEY)))
        )
    routes = F.explode(to_stages).alias("route")
    name = query_name(stream)
    prepared = (
        rows.select(*rows.columns, F.unix_millis(F.col(ts)).alias(_TS_MS), routes)
        .select("*", f"route.{_STAGE}", f"route.{_KEY}")
        .drop("route", _HEARTBEAT)
    )
    outputs = prepared.groupBy(_STAGE, _KEY).transformWithStateInPandas(
        StageProcessor({s.name: s for s in stages}), OUTPUT_SCHEMA, "Append", "EventTime"
    )
    return (
        outputs.writeStream.foreachBatch(OutputWriter(config, plan, alerts, name, stages))
        .queryName(name)
        .option("checkpointLocation", config.table(f"_checkpoints/{name}"))
        .trigger(processingTime=f"{config.engine.trigger_seconds} seconds")
        .start()
    )
