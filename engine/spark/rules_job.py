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
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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
        stage = self.stages[key[0]]
        evaluator = self._load(stage)
        for frame in rows:
            columns = {
                name: frame[name].tolist() for name in frame.columns if name not in (_STAGE, _KEY)
            }
            columns[stage.timestamp] = columns.pop(_TS_MS)
            names = list(columns)
            for values in zip(*columns.values(), strict=True):
                evaluator.insert(dict(zip(names, values, strict=True)))
        yield from self._advance(key, stage, evaluator, timerValues)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        stage = self.stages[key[0]]
        yield from self._advance(key, stage, self._load(stage), timerValues)

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
        self.kinds = {
            q.sink.name: q.sink.kind for stage in stages for q in (stage.query, *stage.downstream)
        }

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        by_sink: dict[str, list[dict[str, Any]]] = {}
        for record in batch.toArrow().to_pylist():
            by_sink.setdefault(record["sink"], []).append(record)
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


def stages_by_input(plan: Plan) -> dict[str, tuple[Stage, ...]]:
    """The plan's stages grouped by the stream they read (one rules query per stream)."""
    grouped: dict[str, list[Stage]] = {}
    for stage in plan.stages():
        grouped.setdefault(stage.input, []).append(stage)
    return {stream: tuple(stages) for stream, stages in grouped.items()}


def start_rules_query(
    spark: SparkSession,
    config: Config,
    plan: Plan,
    alerts: Mapping[str, AlertSpec],
    stream: str,
    stages: tuple[Stage, ...],
) -> StreamingQuery:
    """Start the one streaming query that runs every stage reading `stream`."""
    schema = plan.streams[stream]
    ts = stages[0].timestamp
    for stage in stages:
        for q in (stage.query, *stage.downstream):
            if q.sink.kind == SinkKind.STREAM:
                sink = plan.streams[q.sink.name]
                tables.ensure_table(config.table(sink.name), tables.derived_schema(sink))
    tables.ensure_table(config.table("alerts"), tables.ALERTS)
    is_source = stream in {s.name for s in plan.sources()}
    # A source stream is read from its accepted readings, a derived one from its own table.
    table = tables.readings_table(stream) if is_source else stream
    rows = spark.readStream.format("delta").load(config.table(table))
    columns = [
        F.unix_millis(F.col(c.name)).alias(c.name)
        if c.type == ColumnType.TIMESTAMP and c.name != ts
        else F.col(c.name)
        for c in schema.columns
    ]
    # Readings and derived rows alike carry their (source, seq) tie order.
    columns += [F.col("source"), F.col("seq")]
    rows = rows.select(*columns, F.lit(False).alias(_HEARTBEAT))
    if is_source:
        # Heartbeats join the stream only to move Spark's watermark when readings pause;
        # they are routed to no stage below.
        beats = (
            spark.readStream.format("delta")
            .load(config.table("heartbeats"))
            .where(F.col("stream") == stream)
            .select(F.col("ts").alias(ts), F.lit(True).alias(_HEARTBEAT))
        )
        rows = rows.unionByName(beats, allowMissingColumns=True)
    # One row per (stage, row): each stage groups by its own key columns.
    routes = F.explode(
        F.when(
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
    ).alias("route")
    slack = schema.slack_ms if is_source else 0
    name = f"rules-{stream}"
    # The watermark is set before the routing, so heartbeats count in it.
    prepared = (
        rows.withWatermark(ts, f"{slack + 1} milliseconds")
        .select(*rows.columns, F.unix_millis(F.col(ts)).alias(_TS_MS), routes)
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
