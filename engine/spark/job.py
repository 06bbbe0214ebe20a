"""`lookout engine`: one Spark application running the engine query, which evaluates
every connected part of the rules' stream graph (`engine.spark.query`).

It also writes `<lakehouse>/_health/engine.json` every few seconds (per query: batch,
rate, durations; per stream: event time, watermark, lag, counts since the start and
over the last `[health] window_seconds`, how long its clock has stood still), which the
dashboard's health page and the demo's status line read. The record says `ready` once
every query of this run has finished a batch, and carries this run's start, so a record
an earlier run left is never taken for a running engine.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from engine import tables
from engine.alerts import AlertSpec
from engine.core.pipeline import fed_stages
from engine.core.plan import Plan
from engine.maintenance import TableMaintenance
from engine.spark.checkpoint_layout import check_checkpoint_layout
from engine.spark.commit import Committer, table_schemas
from engine.spark.metrics import ProgressListener, refresh
from engine.spark.query import QUERY_NAME, engine_components, start_query
from engine.spark.rule_changes import record_rule_changes
from engine.spark.session import build_session
from lookout.config import Config, ConfigError
from lookout.health import ARRIVALS, RecentFigures, write_health
from lookout.storage import lakehouse_options, uses_object_store

log = logging.getLogger("lookout.engine")


class EngineJob:
    """All engine queries of one rule set, started and stopped together."""

    def __init__(
        self,
        config: Config,
        plan: Plan,
        alerts: Mapping[str, AlertSpec],
        spark: SparkSession | None = None,
    ) -> None:
        sources = sorted(s.name for s in plan.sources())
        unknown = sorted(set(config.engine.streams) - set(sources))
        if unknown:
            raise ConfigError(
                f"[engine.streams.{unknown[0]}]: the rules declare no such source stream "
                f"(known: {', '.join(sources)})"
            )
        self.config = config
        self.plan = plan
        self.components = engine_components(plan, alerts)
        self.spark = spark or build_session(
            config.engine, s3=config.s3 if uses_object_store(config) else None
        )
        self.queries: list[tuple[StreamingQuery, Committer]] = []
        self.started_at_ms = int(time.time() * 1000)
        self.listener = ProgressListener({QUERY_NAME})
        self._logged: tuple[float, dict[str, int]] = (time.monotonic(), {})
        self.recent = RecentFigures(int(config.health.window_seconds * 1000))
        self.maintenance = TableMaintenance(
            [config.table(name) for name in tables.engine_tables(plan)],
            config.engine.compact_every_seconds,
            config.engine.compact_min_files,
            s3=config.s3,
        )

    def ensure_tables(self) -> None:
        """Create every table the queries append to, so readers can start at once."""
        options = lakehouse_options(self.config)
        for component in self.components:
            for name, schema in table_schemas(self.plan, component.sources).items():
                tables.ensure_table(self.config.table(name), schema, options)

    def start(self) -> None:
        """Start the engine query, after checking the lakehouse's layout."""
        check_checkpoint_layout(self.config)
        for change in record_rule_changes(self.config, self.plan):
            log.warning(change)
        self.ensure_tables()
        self.spark.streams.addListener(self.listener)
        if self.components:
            self.queries.append(start_query(self.spark, self.config, self.components))
        for component in self.components:
            rules = [stage.name for _, stage in fed_stages(self.plan, component.sources)]
            log.info(
                "streams %s: rules %s",
                ", ".join(component.sources),
                ", ".join(rules) or "none",
            )
        self.maintenance.start()
        log.info("engine running (%d parts of the rules)", len(self.components))

    def stop(self) -> None:
        """Stop every query (each finishes or abandons its batch; checkpoints stay valid).

        Spark may have shut down first: a signal sent to the whole process group (a
        terminal's Ctrl-C, `kill -- -PGID`) also reaches its JVM, whose shutdown hook
        stops the SparkContext. The queries are then gone with it, and their checkpoints
        are as valid as after a kill; that is said in one line, not a stack trace.

        A query stopped in the middle of a batch interrupts its `foreachBatch`, whose
        error py4j would log with two stack traces: the batch is abandoned, and runs
        again at the next start (its commits are idempotent), which is one line too."""
        self.maintenance.stop()
        logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
        with contextlib.suppress(Py4JError):
            self.spark.streams.removeListener(self.listener)
        for query, committer in self.queries:
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
            committer.close()
        self.queries.clear()

    def failed(self) -> str | None:
        """The error of the first query that died, if any."""
        for query, _ in self.queries:
            error = query.exception()
            if error is not None:
                return f"{query.name}: {error}"
        return None

    def ready(self) -> bool:
        """Whether every query of this run is running: active and past its start (it
        then runs a batch as soon as a landing file comes)."""
        return bool(self.queries) and all(
            query.isActive and not query.status["message"].startswith("Initializing")
            for query, _ in self.queries
        )

    def health(self) -> dict[str, Any]:
        """A snapshot of every query's progress and every stream's time for the dashboard;
        each call is also a sample of the recent figures (`RecentFigures`)."""
        now_ms = int(time.time() * 1000)
        queries: list[dict[str, Any]] = []
        streams: list[dict[str, Any]] = []
        totals: dict[str, int] = {"quarantined": 0}
        heartbeats = 0
        for query, committer in self.queries:
            progress: dict[str, Any] = query.lastProgress or {}
            seen = committer.health()
            figures = seen["figures"]
            queries.append(
                {
                    "name": query.name,
                    "active": query.isActive,
                    "batch_id": progress.get("batchId"),
                    "batches": seen["batches"],
                    "input_rows_per_s": progress.get("inputRowsPerSecond"),
                    "processed_rows_per_s": progress.get("processedRowsPerSecond"),
                    "batch_ms": (progress.get("durationMs") or {}).get("triggerExecution"),
                    "read_ms": figures.get("read_ms"),
                    "evaluate_ms": figures.get("evaluate_ms"),
                    "write_ms": figures.get("write_ms"),
                    "commit_ms": seen["commit_ms"],
                    "keys": figures.get("keys", {}),
                    "reused": figures.get("reused"),
                    "restore_ms": figures.get("restore_ms"),
                }
            )
            counted = seen["totals"]
            totals["quarantined"] += counted.get("quarantined", 0)
            for name, now in (figures.get("streams") or {}).items():
                max_ts = now.get("max_event_ms")
                heartbeats += counted.get(f"heartbeats.{name}", 0)
                totals |= {f"{what}.{name}": counted.get(f"{what}.{name}", 0) for what in ARRIVALS}
                still_ms, arrived_while_still = self.recent.clock(
                    name, now_ms, max_ts, sum(totals[f"{what}.{name}"] for what in ARRIVALS)
                )
                streams.append(
                    {
                        "stream": name,
                        "max_event_ms": max_ts,
                        "watermark_ms": None if max_ts is None else now.get("watermark_ms"),
                        "lag_ms": None if max_ts is None else now_ms - max_ts,
                        "sources": now.get("sources"),
                        **{what: totals[f"{what}.{name}"] for what in ARRIVALS},
                        "max_live_keys": now.get("max_live_keys"),
                        "live_keys": now.get("live_keys"),
                        "clock_still_ms": still_ms,
                        "arrived_while_still": arrived_while_still,
                    }
                )
        window_ms, recent = self.recent.window(now_ms, totals)
        for stream in streams:
            stream["recent"] = {what: recent[f"{what}.{stream['stream']}"] for what in ARRIVALS}
        return {
            "updated_at_ms": now_ms,
            "started_at_ms": self.started_at_ms,
            "ready": self.ready(),
            "memory": refresh(now_ms / 1000),
            "queries": queries,
            "streams": streams,
            "quarantined": totals["quarantined"],
            "window_ms": window_ms,
            "recent_quarantined": recent["quarantined"],
            "heartbeats": heartbeats,
            "maintenance": self.maintenance.health(),
        }

    def write_health(self) -> None:
        """Write `health()` where the dashboard reads it."""
        write_health(self.config.lakehouse, "engine", self.health(), self.config.s3)

    def log_progress(self) -> None:
        """One line per query: its batches, readings and lag since the last line."""
        since, before = self._logged
        now = time.monotonic()
        counts: dict[str, int] = {}
        for query, committer in self.queries:
            seen = committer.health()
            streams = (seen["figures"].get("streams") or {}).items()
            readings = sum(v for k, v in seen["totals"].items() if k.startswith("readings."))
            counts[query.name] = readings
            durations = sorted(self.listener.take_durations(query.name))
            if not durations:
                continue
            lag = ", ".join(
                f"{name} watermark {(time.time() * 1000 - f['watermark_ms']) / 1000:.1f} s behind"
                for name, f in streams
                if f.get("watermark_ms") is not None
            )
            log.info(
                "%s: %d batches in %.0f s, %s readings (%.0f/s); batch median %.2f s, "
                "longest %.2f s; %s",
                query.name,
                len(durations),
                now - since,
                f"{readings - before.get(query.name, 0):,}",
                (readings - before.get(query.name, 0)) / max(now - since, 1e-9),
                durations[len(durations) // 2],
                durations[-1],
                lag or "no readings yet",
            )
        self._logged = (now, counts)

    def run_until(
        self, stop: threading.Event, health_every_s: float = 2.0, log_every_s: float = 30.0
    ) -> None:
        """Run until `stop` is set or a query fails (then raise); health every
        `health_every_s`, a progress line per query every `log_every_s`."""
        self.start()
        logged = time.monotonic()
        try:
            while not stop.wait(health_every_s):
                self.write_health()
                if time.monotonic() - logged >= log_every_s:
                    logged = time.monotonic()
                    self.log_progress()
                error = self.failed()
                if error:
                    raise RuntimeError(f"a streaming query failed: {error}")
        finally:
            self.stop()
            self.write_health()
