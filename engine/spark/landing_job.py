"""The landing query: new landing files (`engine/spark/landing_source.py`), judged by
`engine.landing` per batch.

Spark contributes what it is good at here: planning batches of new landing files and
checkpointing which ones were processed. Each micro-batch's lines are brought to the
driver (they are what ingest landed in the last second or so) and judged by the pure
`LandingSequencer` in arrival order; the resulting rows are appended to the Delta tables
with delta-rs, exactly once per batch. The rules queries read `readings_<stream>` with a
Spark watermark one millisecond looser than the slack, so Spark never drops a reading
this query let through.

After a restart the sequencer's state (each stream's highest event time, the recently
seen reading ids) is rebuilt from the tables themselves.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from engine import tables
from engine.core.plan import StreamSchema
from engine.landing import DEDUPE_HORIZON_MS, LandingOutput, LandingSequencer
from engine.spark.landing_source import LandingSource, source_options
from lookout.config import Config
from lookout.storage import lakehouse_options

log = logging.getLogger("lookout.engine")

WRITER = "lookout-landing"


class LandingJob:
    """The streaming query from the landing folder to the Delta tables."""

    def __init__(
        self, spark: SparkSession, config: Config, sources: Sequence[StreamSchema]
    ) -> None:
        self.spark = spark
        self.config = config
        self.sources = list(sources)
        self.options = lakehouse_options(config)  # delta-rs's, for an S3 lakehouse
        self.sequencer = LandingSequencer(self.sources)
        self.last_output = LandingOutput()
        # Counted since this process started (the tables hold the full history).
        self.totals: Counter[str] = Counter()

    def ensure_tables(self) -> None:
        """Create every table this job writes, so readers and rule queries can start."""
        for schema in self.sources:
            tables.ensure_table(
                self.config.table(tables.readings_table(schema.name)),
                tables.readings_schema(schema),
                self.options,
            )
            tables.ensure_table(
                self.config.table(tables.heartbeats_table(schema.name)),
                tables.HEARTBEATS,
                self.options,
            )
        for name, schema in tables.LANDING_SHARED.items():
            tables.ensure_table(self.config.table(name), schema, self.options)

    def restore(self) -> None:
        """Rebuild each stream's clock and recent ids from what the tables hold."""
        progress = self._query(
            "_stream_progress",
            "SELECT stream, max(max_event_ms) AS max_ms FROM t GROUP BY stream",
        )
        for row in progress:
            name, max_ms = row["stream"], row["max_ms"]
            sequencer = self.sequencer.streams.get(name)
            if sequencer is None or max_ms is None:
                continue
            sequencer.clock.max_ts = max_ms
            since = max_ms - sequencer.slack_ms - DEDUPE_HORIZON_MS
            ids = self._query(
                tables.readings_table(name),
                f"SELECT source, seq, CAST(ts AS BIGINT) AS ts_us FROM t "
                f"WHERE ts >= to_timestamp_millis({since})",
            ) + self._query(
                "late_readings",
                f"SELECT source, seq, CAST(ts AS BIGINT) AS ts_us FROM t "
                f"WHERE stream = '{name}' AND ts >= to_timestamp_millis({since})",
            )
            for r in ids:
                sequencer.remember(r["source"], r["seq"], r["ts_us"] // 1000)

    def _query(self, table: str, sql: str) -> list[dict]:
        delta = DeltaTable(self.config.table(table), storage_options=self.options)
        result = QueryBuilder().register("t", delta).execute(sql)
        return pa.table(result).to_pylist()

    def start(self, trigger_seconds: float) -> StreamingQuery:
        """Start the streaming query (checkpointed in the lakehouse)."""
        self.ensure_tables()
        self.restore()
        # Our own source, not Spark's file source, whose record of every file it read
        # grows without bound (engine/landing_offsets.py); it removes a committed
        # batch's files (deleted, or moved to the archive), so the folder holds only
        # the backlog that Spark lists every batch.
        self.spark.dataSource.register(LandingSource)
        options = source_options(
            self.config.landing, self.config.engine.landing_archive, self.config.s3
        )
        source = self.spark.readStream.format(LandingSource.name()).options(**options).load()
        return (
            source.writeStream.foreachBatch(self.process_batch)
            .queryName("landing")
            .option("checkpointLocation", self.config.table("_checkpoints/landing"))
            .trigger(processingTime=f"{trigger_seconds} seconds")
            .start()
        )

    def process_batch(self, batch: DataFrame, batch_id: int) -> None:
        """Judge one batch of landed lines and append the results (idempotent per batch)."""
        lines = batch.toArrow()
        out = self.sequencer.split(
            zip(
                lines.column("stream").to_pylist(),
                lines.column("file").to_pylist(),
                lines.column("value").to_pylist(),
                strict=True,
            )
        )
        schemas = {s.name: s for s in self.sources}
        for stream, rows in out.readings.items():
            schema = tables.readings_schema(schemas[stream])
            self._append(
                tables.readings_table(stream), schema, tables.ms_table(rows, schema), batch_id
            )
        self._append("late_readings", tables.LATE_READINGS, out.late, batch_id)
        beats: dict[str, list[dict]] = {}
        for beat in out.heartbeats:
            beats.setdefault(beat["stream"], []).append(beat)
        for stream, rows in beats.items():
            self._append(tables.heartbeats_table(stream), tables.HEARTBEATS, rows, batch_id)
        self._append("quarantine", tables.QUARANTINE, out.quarantine, batch_id)
        # Last: once a batch's progress row exists, every other append of it is done.
        progress = [
            {"stream": stream, "batch_id": batch_id, "max_event_ms": ms}
            for stream, ms in out.max_event_ms.items()
        ]
        self._append("_stream_progress", tables.STREAM_PROGRESS, progress, batch_id)
        self.last_output = out
        for stream, rows in out.readings.items():
            self.totals[f"readings.{stream}"] += len(rows)
        for stream, count in out.duplicates.items():
            self.totals[f"duplicates.{stream}"] += count
        for row in out.late:
            self.totals[f"late.{row['stream']}"] += 1
        self.totals["quarantined"] += len(out.quarantine)
        self.totals["heartbeats"] += len(out.heartbeats)

    def stream_health(self, now_ms: int) -> list[dict]:
        """Per stream: highest event time, slack watermark, lag behind the wall clock."""
        health = []
        for name, sequencer in self.sequencer.streams.items():
            max_ts = sequencer.clock.max_ts
            health.append(
                {
                    "stream": name,
                    "max_event_ms": max_ts,
                    "watermark_ms": None if max_ts is None else sequencer.clock.watermark,
                    "lag_ms": None if max_ts is None else now_ms - max_ts,
                    "readings": self.totals[f"readings.{name}"],
                    "late": self.totals[f"late.{name}"],
                    "duplicates": self.totals[f"duplicates.{name}"],
                }
            )
        return health

    def _append(
        self, table: str, schema: pa.Schema, rows: list[dict] | pa.Table, batch_id: int
    ) -> None:
        tables.append_once(
            self.config.table(table), schema, rows, f"{WRITER}-{table}", batch_id, self.config.s3
        )
