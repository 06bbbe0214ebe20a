"""`lookout engine`: one Spark application running the landing query and every rule stage.

It also writes `<lakehouse>/_health/engine.json` every few seconds (per query: input
rate, batch duration, watermark, state rows), which the dashboard's health page reads.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from engine import tables
from engine.alerts import AlertSpec
from engine.core.plan import Plan
from engine.maintenance import TableMaintenance, read_floors
from engine.spark.checkpoint_layout import check_checkpoint_layout
from engine.spark.landing_job import LandingJob
from engine.spark.rule_changes import record_rule_changes
from engine.spark.rules_job import stages_by_input, start_rules_query
from engine.spark.session import build_session
from lookout.config import Config
from lookout.health import write_health
from lookout.storage import uses_object_store

log = logging.getLogger("lookout.engine")


class EngineJob:
    """All streaming queries of one rule set, started and stopped together."""

    def __init__(
        self,
        config: Config,
        plan: Plan,
        alerts: dict[str, AlertSpec],
        spark: SparkSession | None = None,
    ) -> None:
        self.config = config
        self.plan = plan
        self.alerts = alerts
        self.spark = spark or build_session(
            config.engine, s3=config.s3 if uses_object_store(config) else None
        )
        self.landing = LandingJob(self.spark, config, list(plan.sources()))
        self.queries: list[StreamingQuery] = []
        self.maintenance = TableMaintenance(
            [config.table(name) for name in tables.engine_tables(plan)],
            config.engine.compact_every_seconds,
            config.engine.compact_min_files,
            s3=config.s3,
            floors=self.read_floors,
        )

    def start(self) -> None:
        """Start the landing query, then one rules query per stream that stages read."""
        check_checkpoint_layout(self.config)
        for change in record_rule_changes(self.config, self.plan):
            log.warning(change)
        self.queries.append(self.landing.start(self.config.engine.trigger_seconds))
        for stream, stages in stages_by_input(self.plan).items():
            self.queries.append(
                start_rules_query(self.spark, self.config, self.plan, self.alerts, stream, stages)
            )
        self.maintenance.start()
        log.info("engine running %d queries", len(self.queries))

    def stop(self) -> None:
        """Stop every query (each finishes or abandons its batch; checkpoints stay valid).

        Spark may have shut down first: a signal sent to the whole process group (a
        terminal's Ctrl-C, `kill -- -PGID`) also reaches its JVM, whose shutdown hook
        stops the SparkContext. The queries are then gone with it, and their checkpoints
        are as valid as after a kill; that is said in one line, not a stack trace.

        A query stopped in the middle of a batch interrupts its `foreachBatch`, whose
        error py4j would log with two stack traces: the batch is abandoned, and runs
        again at the next start (its appends are idempotent), which is one line too."""
        self.maintenance.stop()
        logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
        for query in self.queries:
            try:
                if query.isActive and query.status["isTriggerActive"]:
                    log.info("stopping %s during a batch; it runs again at start", query.name)
                query.stop()
            except Py4JError as err:
                # py4j's message: "An error occurred while calling oN.stop.", then
                # ": <the Java exception>", then its stack.
                lines = str(err).splitlines()
                cause = next((x[2:] for x in lines if x.startswith(": ")), type(err).__name__)
                log.warning("query %s had stopped with Spark: %s", query.name, cause)
        self.queries.clear()

    def read_floors(self) -> dict[str, int] | None:
        """Per Delta table id, the lowest version a query may still read (for the log
        cleanup; None until every query has run a batch)."""
        if not self.queries:
            return None
        progresses = [query.lastProgress for query in list(self.queries)]
        return read_floors(None if p is None else json.loads(p.json) for p in progresses)

    def failed(self) -> str | None:
        """The error of the first query that died, if any."""
        for query in self.queries:
            error = query.exception()
            if error is not None:
                return f"{query.name}: {error}"
        return None

    def health(self) -> dict[str, Any]:
        """A snapshot of every query's progress for the dashboard."""
        queries = []
        for query in self.queries:
            progress = query.lastProgress or {}
            state = progress.get("stateOperators") or [{}]
            queries.append(
                {
                    "name": query.name,
                    "active": query.isActive,
                    "batch_id": progress.get("batchId"),
                    "input_rows_per_s": progress.get("inputRowsPerSecond"),
                    "processed_rows_per_s": progress.get("processedRowsPerSecond"),
                    "batch_ms": (progress.get("durationMs") or {}).get("triggerExecution"),
                    "watermark": (progress.get("eventTime") or {}).get("watermark"),
                    "state_rows": state[0].get("numRowsTotal"),
                    "state_bytes": state[0].get("memoryUsedBytes"),
                    "rows_dropped_by_watermark": state[0].get("numRowsDroppedByWatermark"),
                }
            )
        now_ms = int(time.time() * 1000)
        return {
            "updated_at_ms": now_ms,
            "queries": queries,
            "streams": self.landing.stream_health(now_ms),
            "quarantined": self.landing.totals["quarantined"],
            "heartbeats": self.landing.totals["heartbeats"],
            "maintenance": self.maintenance.health(),
        }

    def write_health(self) -> None:
        """Write `health()` where the dashboard reads it."""
        write_health(self.config.lakehouse, "engine", self.health(), self.config.s3)

    def run_until(self, stop: threading.Event, health_every_s: float = 2.0) -> None:
        """Run until `stop` is set or a query fails (then raise)."""
        self.start()
        try:
            while not stop.wait(health_every_s):
                self.write_health()
                error = self.failed()
                if error:
                    raise RuntimeError(f"a streaming query failed: {error}")
        finally:
            self.stop()
            self.write_health()
