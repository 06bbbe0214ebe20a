"""The Delta tables of the lakehouse: their schemas and exactly-once appends.

Every write from a streaming micro-batch goes through :func:`append_once`, which uses
Delta's idempotent-write options (`txnAppId`, `txnVersion`): when a batch is re-run after
a crash, the append it already committed is skipped, so a restart never duplicates a row.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from engine.core.plan import ColumnType, StreamSchema

SPARK_TYPES: dict[ColumnType, T.DataType] = {
    ColumnType.INT: T.IntegerType(),
    ColumnType.BIGINT: T.LongType(),
    ColumnType.DOUBLE: T.DoubleType(),
    ColumnType.STRING: T.StringType(),
    ColumnType.BOOLEAN: T.BooleanType(),
    ColumnType.TIMESTAMP: T.TimestampType(),
}

LATE_READINGS = T.StructType(
    [
        T.StructField("stream", T.StringType()),
        T.StructField("source", T.StringType()),
        T.StructField("seq", T.LongType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("watermark", T.TimestampType()),
        T.StructField("late_by_ms", T.LongType()),
        T.StructField("reading", T.StringType()),
        T.StructField("topic", T.StringType()),
        T.StructField("received_at", T.TimestampType()),
    ]
)

QUARANTINE = T.StructType(
    [
        T.StructField("topic", T.StringType()),
        T.StructField("reason", T.StringType()),
        T.StructField("payload", T.StringType()),
        T.StructField("payload_b64", T.StringType()),
        T.StructField("received_at", T.TimestampType()),
    ]
)

HEARTBEATS = T.StructType(
    [
        T.StructField("stream", T.StringType()),
        T.StructField("source", T.StringType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("received_at", T.TimestampType()),
    ]
)

ALERTS = T.StructType(
    [
        T.StructField("alert_id", T.StringType()),
        T.StructField("rule", T.StringType()),
        T.StructField("severity", T.StringType()),
        T.StructField("key", T.StringType()),
        T.StructField("event_time", T.TimestampType()),
        T.StructField("detected_at", T.TimestampType()),
        T.StructField("message", T.StringType()),
        T.StructField("payload", T.StringType()),
    ]
)

# Internal: the highest event time each stream had seen after each landing batch.
STREAM_PROGRESS = T.StructType(
    [
        T.StructField("stream", T.StringType()),
        T.StructField("batch_id", T.LongType()),
        T.StructField("max_event_ms", T.LongType()),
    ]
)


def readings_table(stream: str) -> str:
    """Name of the table holding the accepted readings of a source stream."""
    return f"readings_{stream}"


def stream_struct(schema: StreamSchema) -> T.StructType:
    """Spark schema of a stream's rows (its declared columns, timestamps as TIMESTAMP)."""
    return T.StructType([T.StructField(c.name, SPARK_TYPES[c.type]) for c in schema.columns])


def readings_struct(schema: StreamSchema) -> T.StructType:
    """Schema of `readings_<stream>`: the declared columns plus provenance."""
    extra = [
        T.StructField("source", T.StringType()),
        T.StructField("seq", T.LongType()),
        T.StructField("topic", T.StringType()),
        T.StructField("received_at", T.TimestampType()),
    ]
    return T.StructType(list(stream_struct(schema).fields) + extra)


def ensure_table(spark: SparkSession, path: str, schema: T.StructType) -> None:
    """Create an empty Delta table at `path` if none is there (readers may start first)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        spark.createDataFrame([], schema).write.format("delta").mode("append").save(path)


def append_once(df: DataFrame, path: str, writer_id: str, batch_id: int) -> None:
    """Append `df` to the Delta table at `path` exactly once for (writer_id, batch_id)."""
    (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", writer_id)
        .option("txnVersion", batch_id)
        .option("mergeSchema", "false")
        .save(path)
    )
