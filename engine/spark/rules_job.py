"""Rule stages on Structured Streaming: a thin adapter around the pure engine core.

Each plan `Stage` becomes one streaming query:

    readStream(Delta table of the stage's input)
      .withWatermark(ts, slack + 1 ms)           # Spark drops ts <= watermark; our pin
                                                 # keeps ts == max - slack on time
      .groupBy(partition key)
      .transformWithStateInPandas(StageProcessor) # one KeyedEvaluator per key, its
                                                  # snapshot in the RocksDB state store
      .foreachBatch(OutputWriter)                 # exactly-once Delta appends

The processor calls `advance(spark_watermark + 1)`: every row still to come has
ts > spark_watermark, so instants up to the watermark are final. It keeps one event-time
timer per key at the evaluator's `next_wakeup`, which is how expirations and time slides
fire in a batch with no input for that key.
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

from engine.alerts import AlertSpec, alert_id, format_key, render_message
from engine.core.evaluator import KeyedEvaluator, Output
from engine.core.plan import ColumnType, Plan, SinkKind, Stage, StreamSchema
from engine.spark import tables
from lookout.config import Config

OUTPUT_SCHEMA = "sink STRING, ts LONG, key STRING, row STRING"
# Spark hands pandas positional names (`_3`) for columns whose name starts with `_`.
_TS_MS = "lookout_event_ms"
_STATE = T.StructType([T.StructField("snapshot", T.BinaryType())])


class StageProcessor(StatefulProcessor):
    """Runs one stage's `KeyedEvaluator` per partition key inside Spark."""

    def __init__(self, stage: Stage) -> None:
        self.stage = stage

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("evaluator", _STATE)

    def _load(self) -> KeyedEvaluator:
        if self.state.exists():
            return KeyedEvaluator.restore(self.stage, self.state.get()[0])
        return KeyedEvaluator(self.stage)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        evaluator = self._load()
        ts = self.stage.timestamp
        for frame in rows:
            columns = {name: frame[name].tolist() for name in frame.columns}
            columns[ts] = columns.pop(_TS_MS)
            names = list(columns)
            for values in zip(*columns.values(), strict=True):
                evaluator.insert(dict(zip(names, values, strict=True)))
        yield from self._advance(key, evaluator, timerValues)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        yield from self._advance(key, self._load(), timerValues)

    def _advance(
        self, key: Any, evaluator: KeyedEvaluator, timer_values: TimerValues
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
            yield _frame(outputs, format_key(self.stage.key, tuple(key)))

    def close(self) -> None:
        pass


def _frame(outputs: list[Output], key: str) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "sink": [o.sink for o in outputs],
            "ts": [o.ts for o in outputs],
            "key": [key] * len(outputs),
            "row": [orjson.dumps(o.row).decode() for o in outputs],
        }
    )


def _row_struct(schema: StreamSchema) -> T.StructType:
    """How a stage's output rows are encoded in JSON: timestamps as epoch ms."""
    return T.StructType(
        [
            T.StructField(
                c.name,
                T.LongType() if c.type == ColumnType.TIMESTAMP else tables.SPARK_TYPES[c.type],
            )
            for c in schema.columns
        ]
    )


class OutputWriter:
    """foreachBatch sink: each derived stream to its table, alerts to `alerts`."""

    def __init__(
        self, config: Config, plan: Plan, alerts: Mapping[str, AlertSpec], stage: Stage
    ) -> None:
        self.config = config
        self.plan = plan
        self.alerts = alerts
        self.stage = stage

    def sinks(self) -> list[tuple[str, SinkKind]]:
        return [(q.sink.name, q.sink.kind) for q in (self.stage.query, *self.stage.downstream)]

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        batch = batch.persist()
        try:
            for name, kind in self.sinks():
                rows = batch.where(F.col("sink") == name)
                if kind == SinkKind.ALERT:
                    self._write_alerts(rows, name, batch_id)
                else:
                    self._write_stream(rows, self.plan.streams[name], batch_id)
        finally:
            batch.unpersist()

    def _writer_id(self, table: str) -> str:
        return f"lookout-stage-{self.stage.name}-{table}"

    def _write_stream(self, rows: DataFrame, schema: StreamSchema, batch_id: int) -> None:
        parsed = rows.select(F.from_json("row", _row_struct(schema)).alias("r")).select(
            *[
                F.timestamp_millis(F.col(f"r.{c.name}")).alias(c.name)
                if c.type == ColumnType.TIMESTAMP
                else F.col(f"r.{c.name}")
                for c in schema.columns
            ]
        )
        if not parsed.isEmpty():
            tables.append_once(
                parsed, self.config.table(schema.name), self._writer_id(schema.name), batch_id
            )

    def _write_alerts(self, rows: DataFrame, name: str, batch_id: int) -> None:
        # Alerts are few; building them in Python keeps ids and messages identical to replay.
        collected = rows.collect()
        if not collected:
            return
        spec = self.alerts.get(name, AlertSpec(name, "warning"))
        detected = pd.Timestamp.now(tz="UTC").to_pydatetime()
        records = []
        for r in collected:
            row = orjson.loads(r["row"])
            records.append(
                (
                    alert_id(name, r["key"], r["ts"], row),
                    name,
                    spec.severity,
                    r["key"],
                    pd.Timestamp(r["ts"], unit="ms", tz="UTC").to_pydatetime(),
                    detected,
                    render_message(spec, row),
                    r["row"],
                )
            )
        df = rows.sparkSession.createDataFrame(records, tables.ALERTS)
        tables.append_once(df, self.config.table("alerts"), self._writer_id("alerts"), batch_id)


def stage_input_slack(plan: Plan, stage: Stage) -> int:
    """The slack of the stream a stage reads (derived streams are already in order)."""
    schema = plan.streams.get(stage.input)
    return schema.slack_ms if schema else 0


def input_table(plan: Plan, stage: Stage) -> str:
    """The Delta table a stage reads: `readings_<s>` for a source, else the derived stream."""
    sources = {s.name for s in plan.sources()}
    return tables.readings_table(stage.input) if stage.input in sources else stage.input


def start_stage(
    spark: SparkSession, config: Config, plan: Plan, alerts: Mapping[str, AlertSpec], stage: Stage
) -> StreamingQuery:
    """Start the streaming query of one stage."""
    schema = plan.streams[stage.input]
    ts = stage.timestamp
    for q in (stage.query, *stage.downstream):
        if q.sink.kind == SinkKind.STREAM:
            tables.ensure_table(
                spark, config.table(q.sink.name), tables.stream_struct(plan.streams[q.sink.name])
            )
    tables.ensure_table(spark, config.table("alerts"), tables.ALERTS)
    other_timestamps = [
        c.name for c in schema.columns if c.type == ColumnType.TIMESTAMP and c.name != ts
    ]
    source = spark.readStream.format("delta").load(config.table(input_table(plan, stage)))
    columns = [F.col(c.name) for c in schema.columns if c.name not in other_timestamps] + [
        F.unix_millis(F.col(c)).alias(c) for c in other_timestamps
    ]
    if "source" in source.columns:
        columns += [F.col("source"), F.col("seq")]
    else:  # a derived stream: tie order by nothing but time
        columns += [F.lit("").alias("source"), F.lit(0).cast("long").alias("seq")]
    prepared = source.select(*columns, F.unix_millis(F.col(ts)).alias(_TS_MS))
    processor = StageProcessor(stage)
    outputs = (
        prepared.withWatermark(ts, f"{stage_input_slack(plan, stage) + 1} milliseconds")
        .groupBy(*[F.col(k) for k in stage.key] or [F.lit(0).alias("_all")])
        .transformWithStateInPandas(processor, OUTPUT_SCHEMA, "Append", "EventTime")
    )
    return (
        outputs.writeStream.foreachBatch(OutputWriter(config, plan, alerts, stage))
        .queryName(f"stage-{stage.name}")
        .option("checkpointLocation", config.table(f"_checkpoints/stage-{stage.name}"))
        .trigger(processingTime=f"{config.engine.trigger_seconds} seconds")
        .start()
    )
