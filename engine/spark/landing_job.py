"""Landing files -> Delta: arrival order, duplicates, slack and lateness (DESIGN §4).

Spark drops rows below its watermark before a stateful operator sees them and only counts
them (DESIGN §7), so lateness cannot be left to the rule queries. This streaming query
decides it first, exactly as the pin says: a reading's watermark is the highest event
time among the readings (and heartbeats) of its stream that arrived before it, minus the
stream's slack; below it the reading is late and goes to `late_readings` with how late
it was. Arrival order is the order ingest landed things: (file name, line).

Outputs per micro-batch, each an exactly-once append:
  readings_<stream>  on-time readings, duplicates (same source and seq) removed
  late_readings      the late ones
  heartbeats         what moves event time when a stream is quiet
  quarantine         what ingest rejected, with the reason
The rule queries read `readings_<stream>` with a Spark watermark one millisecond looser
than the slack, so Spark never drops a row this query let through.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from engine.core.plan import ColumnType, StreamSchema
from engine.spark import tables
from ingest.landing import QUARANTINE as QUARANTINE_FOLDER
from lookout.config import Config

log = logging.getLogger("lookout.engine")

_PROVENANCE = [
    T.StructField("source", T.StringType()),
    T.StructField("seq", T.LongType()),
    T.StructField("_topic", T.StringType()),
    T.StructField("_received_ms", T.LongType()),
    T.StructField("_kind", T.StringType()),
    T.StructField("_line", T.LongType()),
]


def _landed_struct(schema: StreamSchema) -> T.StructType:
    """Schema of a landed line: timestamps still as epoch ms."""
    fields = [
        T.StructField(
            c.name, T.LongType() if c.type == ColumnType.TIMESTAMP else tables.SPARK_TYPES[c.type]
        )
        for c in schema.columns
    ]
    return T.StructType(fields + _PROVENANCE)


def _millis_to_timestamp(column: str) -> Column:
    return F.timestamp_millis(F.col(column))


@dataclass
class BatchCounts:
    """What one landing batch did, per stream (for health and tests)."""

    readings: dict[str, int] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    heartbeats: dict[str, int] = field(default_factory=dict)
    quarantined: int = 0


class LandingJob:
    """The streaming query from the landing folder to the Delta tables."""

    WRITER = "lookout-landing"

    def __init__(
        self, spark: SparkSession, config: Config, sources: Sequence[StreamSchema]
    ) -> None:
        self.spark = spark
        self.config = config
        self.sources = list(sources)
        self.last_counts = BatchCounts()
        self._progress: dict[str, tuple[int, int | None]] = {}

    def ensure_tables(self) -> None:
        """Create every table this job writes, so readers and rule queries can start."""
        for schema in self.sources:
            tables.ensure_table(
                self.spark,
                self.config.table(tables.readings_table(schema.name)),
                tables.readings_struct(schema),
            )
        for name, struct in (
            ("late_readings", tables.LATE_READINGS),
            ("quarantine", tables.QUARANTINE),
            ("heartbeats", tables.HEARTBEATS),
            ("_stream_progress", tables.STREAM_PROGRESS),
        ):
            tables.ensure_table(self.spark, self.config.table(name), struct)

    def start(self, trigger_seconds: float) -> StreamingQuery:
        """Start the streaming query (checkpointed in the lakehouse)."""
        self.ensure_tables()
        if "://" not in self.config.landing:  # a local folder must exist before Spark lists it
            Path(self.config.landing).mkdir(parents=True, exist_ok=True)
        source = (
            self.spark.readStream.format("text")
            .schema("value STRING, stream STRING")
            .load(self.config.landing)
            .select("value", "stream", F.col("_metadata.file_name").alias("_file"))
        )
        return (
            source.writeStream.foreachBatch(self.process_batch)
            .queryName("landing")
            .option("checkpointLocation", self.config.table("_checkpoints/landing"))
            .trigger(processingTime=f"{trigger_seconds} seconds")
            .start()
        )

    # -- one micro-batch ---------------------------------------------------------------
    def process_batch(self, batch: DataFrame, batch_id: int) -> None:
        """Split one batch of landed lines into the tables (idempotent per batch_id)."""
        batch = batch.persist()
        counts = BatchCounts()
        try:
            for schema in self.sources:
                self._process_stream(batch, batch_id, schema, counts)
            quarantined = (
                batch.where(F.col("stream") == QUARANTINE_FOLDER)
                .select(
                    F.from_json(
                        "value",
                        "topic STRING, reason STRING, payload STRING, "
                        "payload_b64 STRING, received_ms LONG",
                    ).alias("q")
                )
                .select(
                    "q.topic",
                    "q.reason",
                    "q.payload",
                    "q.payload_b64",
                    _millis_to_timestamp("q.received_ms").alias("received_at"),
                )
            )
            counts.quarantined = self._append(quarantined, "quarantine", batch_id)
        finally:
            batch.unpersist()
        self.last_counts = counts

    def _append(self, df: DataFrame, table: str, batch_id: int) -> int:
        rows = df.count()
        if rows:
            tables.append_once(df, self.config.table(table), f"{self.WRITER}-{table}", batch_id)
        return rows

    def _prior_max(self, stream: str, batch_id: int) -> int | None:
        """Highest event time of `stream` after all batches before `batch_id`."""
        cached = self._progress.get(stream)
        if cached and cached[0] == batch_id - 1:
            return cached[1]
        rows = (
            self.spark.read.format("delta")
            .load(self.config.table("_stream_progress"))
            .where((F.col("stream") == stream) & (F.col("batch_id") < batch_id))
            .orderBy(F.col("batch_id").desc())
            .limit(1)
            .collect()
        )
        return rows[0]["max_event_ms"] if rows else None

    def _process_stream(
        self, batch: DataFrame, batch_id: int, schema: StreamSchema, counts: BatchCounts
    ) -> None:
        ts = schema.timestamp or "ts"
        landed = (
            batch.where(F.col("stream") == schema.name)
            .select(F.from_json("value", _landed_struct(schema)).alias("r"), "_file")
            .select("r.*", "_file")
        )
        arrival = Window.orderBy("_file", "_line")
        is_heartbeat = F.coalesce(F.col("_kind") == "heartbeat", F.lit(False))

        readings = landed.where(~is_heartbeat)
        # Duplicates: keep each (source, seq) once, at its first arrival, and drop those
        # already stored by an earlier batch (QoS 1 redelivery after a crash).
        first = Window.partitionBy("source", "seq").orderBy("_file", "_line")
        deduped = readings.withColumn("_n", F.row_number().over(first)).where("_n = 1").drop("_n")
        deduped = self._drop_already_stored(deduped, schema, ts).persist()
        arrived = deduped.unionByName(landed.where(is_heartbeat), allowMissingColumns=True)

        prior = self._prior_max(schema.name, batch_id)
        max_before = F.max(ts).over(arrival.rowsBetween(Window.unboundedPreceding, -1))
        if prior is not None:
            max_before = F.greatest(max_before, F.lit(prior))
        judged = (
            arrived.withColumn("_watermark", max_before - F.lit(schema.slack_ms))
            .withColumn("_late", F.coalesce(F.col(ts) < F.col("_watermark"), F.lit(False)))
            .persist()
        )
        batch_max = judged.agg(F.max(ts)).first()[0]
        seen = [v for v in (prior, batch_max) if v is not None]
        new_max = max(seen) if seen else None

        on_time = judged.where(~F.col("_late") & ~is_heartbeat)
        late = judged.where(F.col("_late") & ~is_heartbeat)
        beats = judged.where(is_heartbeat)
        readings_cols = [
            _millis_to_timestamp(c.name).alias(c.name)
            if c.type == ColumnType.TIMESTAMP
            else F.col(c.name)
            for c in schema.columns
        ] + [
            F.col("source"),
            F.col("seq"),
            F.col("_topic").alias("topic"),
            _millis_to_timestamp("_received_ms").alias("received_at"),
        ]
        stored = self._append(
            on_time.select(*readings_cols), tables.readings_table(schema.name), batch_id
        )
        late_rows = late.select(
            F.lit(schema.name).alias("stream"),
            "source",
            "seq",
            _millis_to_timestamp(ts).alias("ts"),
            _millis_to_timestamp("_watermark").alias("watermark"),
            (F.col("_watermark") - F.col(ts)).alias("late_by_ms"),
            F.to_json(F.struct(*[c.name for c in schema.columns], "source", "seq")).alias(
                "reading"
            ),
            F.col("_topic").alias("topic"),
            _millis_to_timestamp("_received_ms").alias("received_at"),
        )
        late_count = self._append(late_rows, "late_readings", batch_id)
        beat_rows = beats.select(
            F.lit(schema.name).alias("stream"),
            "source",
            _millis_to_timestamp(ts).alias("ts"),
            _millis_to_timestamp("_received_ms").alias("received_at"),
        )
        beat_count = self._append(beat_rows, "heartbeats", batch_id)
        if new_max is not None:
            progress = self.spark.createDataFrame(
                [(schema.name, batch_id, int(new_max))], tables.STREAM_PROGRESS
            )
            tables.append_once(
                progress,
                self.config.table("_stream_progress"),
                f"{self.WRITER}-progress-{schema.name}",
                batch_id,
            )
        self._progress[schema.name] = (batch_id, new_max)
        counts.readings[schema.name] = stored
        counts.late[schema.name] = late_count
        counts.heartbeats[schema.name] = beat_count
        counts.duplicates[schema.name] = readings.count() - deduped.count()
        judged.unpersist()
        deduped.unpersist()

    def _drop_already_stored(self, readings: DataFrame, schema: StreamSchema, ts: str) -> DataFrame:
        """Remove readings whose (source, seq) an earlier batch already stored."""
        bounds = readings.agg(F.min(ts), F.max(ts)).first()
        if bounds is None or bounds[0] is None:
            return readings
        low, high = F.timestamp_millis(F.lit(bounds[0])), F.timestamp_millis(F.lit(bounds[1]))
        stored = (
            self.spark.read.format("delta")
            .load(self.config.table(tables.readings_table(schema.name)))
            .where(F.col(ts).between(low, high))
            .select("source", "seq")
        )
        late = (
            self.spark.read.format("delta")
            .load(self.config.table("late_readings"))
            .where((F.col("stream") == schema.name) & F.col("ts").between(low, high))
            .select("source", "seq")
        )
        return readings.join(stored.unionByName(late), ["source", "seq"], "left_anti")
