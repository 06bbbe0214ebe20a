"""`lookout engine`: one Spark application running the engine query, which evaluates
every connected part of the rules' stream graph (`engine.spark.query`).

It also writes `<lakehouse>/_health/engine.json` every few seconds (per query: batch,
rate, durations; per stream: event time, watermark, lag, counts since the start and
over the last `[health] window_seconds`, how long its clock has stood still), which the
dashboard's health page and the demo's status line read. The record says `ready` once
every query of this run has finished a batch, and carries this run's start, so a record
an earlier run left is never taken for a running engine.

New rules are applied while it runs (`EngineJob.apply`, called by the rule watch of
`lookout.rule_watch`): the query stops and starts again from its checkpoint with the
new plan; the health record says which rule files run (`rules`).

A full or read-only disk (`engine.storage_faults`) does not end it: the query that
failed on it is given up (its batch never committed, so Spark's offsets stay before it
and the landing files stay in their folder), the fault is logged and put on the health
record, and once a probe finds the disk writable again (tried after 1 s, doubling to
16 s) what the failed writes left is deleted and the query starts again from its
checkpoint in this process: the failed batch runs again and commits once. Any other
failure of a query ends the job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from engine import tables
from engine.alerts import AlertSpec, iso_utc
from engine.core.pipeline import fed_stages
from engine.core.plan import Plan
from engine.maintenance import MaintenanceProcess, TableMaintenance
from engine.spark.batch_figures import BatchFigures
from engine.spark.checkpoint_layout import check_checkpoint_layout, checkpoint_partitions
from engine.spark.commit import single_writer_id, table_schemas, writer_id
from engine.spark.metrics import ProgressListener, refresh
from engine.spark.processor import QUERY_NAME
from engine.spark.query import engine_components, start_query
from engine.spark.rule_changes import record_rule_changes
from engine.spark.session import build_session
from engine.storage_faults import (
    DISK_FULL,
    RETRY_MAX_S,
    StorageFault,
    fault_line,
    fault_of,
    keep_reserve,
    probe,
    release_reserve,
    remove_temporaries,
)
from lookout.config import Config, ConfigError
from lookout.health import ARRIVALS, HEALTH_FOLDER, RecentFigures, write_health
from lookout.storage import lakehouse_options, uses_object_store

log = logging.getLogger("lookout.engine")


_CLOCK_APART_MS = 86_400_000
"""A watermark further than this from the machine's clock is given as a time, not a lag:
its readings carry a clock of their own (a recording, a simulation of another day)."""


def watermark_lag(stream: str, watermark_ms: float, now_ms: float) -> str:
    """How far ``stream``'s watermark is behind this machine's clock, for the progress
    log; as a time when the two are more than a day apart."""
    lag_ms = now_ms - watermark_ms
    if abs(lag_ms) <= _CLOCK_APART_MS:
        return f"{stream} watermark {lag_ms / 1000:.1f} s behind"
    try:
        at = iso_utc(int(watermark_ms))
    except (OverflowError, ValueError, OSError):  # beyond the calendar (a far heartbeat)
        at = f"{int(watermark_ms)} ms"
    return f"{stream} watermark at {at} (a clock a day or more apart)"


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
        self.spark = spark or build_session(
            config.engine, s3=config.s3 if uses_object_store(config) else None
        )
        self.queries: list[tuple[StreamingQuery, BatchFigures]] = []
        # Queries given up on a full or read-only disk, until they start again (their
        # last figures stay on the health record), and that fault.
        self.stopped: list[tuple[StreamingQuery, BatchFigures]] = []
        self.fault: StorageFault | None = None
        self._started = False
        self._listening = False
        self._health_error = ""  # why the last health write failed (logged once)
        self._reserve_kept = False
        self.started_at_ms = int(time.time() * 1000)
        self.rules_status: Callable[[], dict[str, Any]] | None = None
        """What the health record says of the rules (set by whoever watches them)."""
        self.listener = ProgressListener({QUERY_NAME})
        self._logged: tuple[float, dict[str, int]] = (time.monotonic(), {})
        self.recent = RecentFigures(int(config.health.window_seconds * 1000))
        self.maintenance_process = MaintenanceProcess()
        self.maintenance = TableMaintenance(
            [],
            config.engine.compact_every_seconds,
            config.engine.compact_min_files,
            s3=config.s3,
            run_round=self.maintenance_process,
        )
        self.use(plan, alerts)

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
        self._remove_leftovers()
        if not self._listening:  # start runs again when a full disk failed it
            self.spark.streams.addListener(self.listener)
            self._listening = True
        self._start_queries()
        self._started = True
        self._log_parts()
        self.maintenance.start()
        log.info("engine running (%d parts of the rules)", len(self.components))

    def _log_parts(self) -> None:
        for component in self.components:
            rules = [stage.name for _, stage in fed_stages(self.plan, component.sources)]
            log.info(
                "streams %s: rules %s",
                ", ".join(component.sources),
                ", ".join(rules) or "none",
            )

    def _start_queries(self) -> None:
        """Start the query (again, after a storage fault: from its checkpoint, with the
        counts it had)."""
        kept = [figures for _, figures in self.stopped]
        self.stopped.clear()
        if self.components:
            figures = kept[0] if kept else None
            self.queries.append(start_query(self.spark, self.config, self.components, figures))

    def apply(self, plan: Plan, alerts: Mapping[str, AlertSpec]) -> None:
        """Run `plan` from now on, without a restart of the engine: the query stops (a
        batch in flight is abandoned and runs again: its commits are idempotent) and
        starts again from its checkpoint with the new rules. The rules left as they were
        carry on with their state; a new or edited one starts with its windows filled
        from the stored readings (`engine.warm_start`, in its first batch)."""
        began = time.monotonic()
        self.stop_queries()
        stopped = time.monotonic()
        self.use(plan, alerts)
        for change in record_rule_changes(self.config, plan):
            log.info(change)
        self.ensure_tables()
        if self.fault is None:
            self._start_queries()
        self._log_parts()
        log.info(
            "the query runs the new rules: %.1f s stopping, %.1f s starting",
            stopped - began,
            time.monotonic() - stopped,
        )

    def use(self, plan: Plan, alerts: Mapping[str, AlertSpec]) -> None:
        """Take `plan` as the rules to run (its parts, the tables to maintain); the
        query runs them from its next start."""
        self.plan = plan
        self.components = engine_components(plan, alerts)
        self.maintenance.paths = [self.config.table(name) for name in tables.engine_tables(plan)]

    def stop_queries(self) -> None:
        """Stop the queries, keeping their figures (and counts) for the next start."""
        # A batch stopped half-way makes py4j log its interrupted foreachBatch (`stop`).
        logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
        for query, figures in self.queries:
            with contextlib.suppress(Py4JError):
                query.stop()
            self.stopped.append((query, figures))
        self.queries.clear()

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
        self.maintenance_process.close()
        logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
        with contextlib.suppress(Py4JError):
            self.spark.streams.removeListener(self.listener)
        for query, _ in self.queries:
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
        self.stopped.clear()
        # A task of a query given up on a failing disk may have left its temporary
        # files after the cleanup at the restart; none runs now.
        if self._started:
            self._remove_leftovers()

    def failed(self) -> str | None:
        """The error of the first query that died, if any (one that died of an error
        Spark could not report has none; a failed batch's is `BatchJobFailed`'s)."""
        for query, _ in self.queries:
            error = query.exception()
            if error is not None:
                return f"{query.name}: {error}"
            if not query.isActive:
                return f"{query.name}: stopped, and Spark reported no error"
        return None

    def ready(self) -> bool:
        """Whether every query of this run is running: active and past its start (it
        then runs a batch as soon as a landing file comes), and no storage fault holds."""
        return (
            bool(self.queries)
            and self.fault is None
            and all(
                query.isActive and not query.status["message"].startswith("Initializing")
                for query, _ in self.queries
            )
        )

    def health(self) -> dict[str, Any]:
        """A snapshot of every query's progress and every stream's time for the dashboard;
        each call is also a sample of the recent figures (`RecentFigures`)."""
        now_ms = int(time.time() * 1000)
        queries: list[dict[str, Any]] = []
        streams: list[dict[str, Any]] = []
        totals: dict[str, int] = {"quarantined": 0}
        heartbeats = 0
        for query, recorder in [*self.queries, *self.stopped]:
            progress: dict[str, Any] = query.lastProgress or {}
            seen = recorder.health()
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
            # A full or read-only disk the engine waits out (None: it writes).
            "storage": None if self.fault is None else self.fault.record(),
            # The rule files running, and the last change refused (lookout.rule_watch).
            "rules": self.rules_status() if self.rules_status is not None else None,
        }

    def write_health(self) -> None:
        """Write `health()` where the dashboard reads it.

        Best effort: it never raises, and a failure is logged once. The disk that is
        full is the one that holds the record, so the engine keeps a little room beside
        it (`_health/.engine.reserve`, local disks only): on a full disk that room is
        given up for the record that says so, and kept again once the disk works."""
        record = self.health()
        try:
            write_health(self.config.lakehouse, "engine", record, self.config.s3)
        except OSError as err:
            failed: OSError | None = err
            if fault_of(err) == DISK_FULL and release_reserve(self._reserve, self.config.s3):
                self._reserve_kept = False
                try:
                    write_health(self.config.lakehouse, "engine", record, self.config.s3)
                    failed = None
                except OSError as again:
                    failed = again
            if failed is not None:
                if not self._health_error:
                    log.warning("cannot write the health record: %s", failed)
                self._health_error = str(failed)
                return
        if self._health_error:
            log.info("the health record is written again")
            self._health_error = ""
        if self.fault is None and not self._reserve_kept:
            self._reserve_kept = keep_reserve(self._reserve, self.config.s3)

    @property
    def _reserve(self) -> str:
        return f"{self.config.lakehouse.rstrip('/')}/{HEALTH_FOLDER}/.engine.reserve"

    def watch(self) -> None:
        """Raise if a query failed, unless for a full or read-only disk: then the query
        is given up and started again once the disk takes writes (`_recover`)."""
        error = self.failed()
        if error is not None:
            problem = fault_of(error)
            if problem is None:  # the error may not say it: a disk that refuses a probe does
                failing = self._failing_disk()
                problem = None if failing is None else fault_of(failing[1])
            if problem is None:
                raise RuntimeError(f"a streaming query failed: {error}")
            self._given_up(problem, error)
        if self.fault is not None:
            self._recover()

    def _given_up(self, problem: str, error: str) -> None:
        """The queries failed on a full or read-only disk: no batch runs until it works."""
        self.stop_queries()  # they have stopped already; this only unregisters them
        self.maintenance.pause()
        failing = self._failing_disk()
        path = failing[0] if failing is not None else self.config.lakehouse
        said = error if fault_of(error) is not None or failing is None else str(failing[1])
        line = fault_line(said)
        if self.fault is None:
            self.fault = StorageFault(problem, path, line)
            log.error(
                "the engine cannot write: %s; no new batch until it can (the landing files "
                "wait, Spark's offsets stay before them: nothing is lost); trying again "
                "after %.0f s, then every %.0f s at most",
                self.fault.describe(),
                self.fault.delay_s,
                RETRY_MAX_S,
            )
        else:  # the query started again and failed again
            self.fault.problem, self.fault.path, self.fault.error = problem, path, line
            self.fault.restarted_at = None
        self.fault.wait_longer()

    def _recover(self) -> None:
        """While a storage fault holds: when due, probe the disks, and once they take
        writes remove what the failed writes left and start the query again; the fault
        is over when the query has run a batch (or has none to run)."""
        fault = self.fault
        assert fault is not None
        if fault.restarted_at is not None:
            if self._through(fault):
                log.info(
                    "the engine writes again after %.0f s (%d tries); batches go on",
                    time.time() - fault.since_ms / 1000,
                    fault.tries,
                )
                self.fault = None
                self.maintenance.resume()
            return
        if time.monotonic() < fault.retry_at:
            return
        failing = self._failing_disk()
        if failing is not None:
            fault.path, err = failing
            fault.problem = fault_of(err) or fault.problem
            fault.error = fault_line(str(err))
            fault.wait_longer()
            return
        fault.tries += 1
        try:
            if self._started:
                self._remove_leftovers()
                self._start_queries()
            else:
                self.start()
        except Exception as err:  # the disk failed again as the query started
            problem = fault_of(err)
            if problem is None:
                raise
            fault.problem, fault.error = problem, fault_line(str(err))
            fault.wait_longer()
            return
        fault.restarted_at = time.monotonic()
        fault.batches_at_restart = sum(c.health()["batches"] for _, c in self.queries)
        log.info("the disk takes writes again: the query starts again from its checkpoint")

    def _through(self, fault: StorageFault) -> bool:
        """Whether the queries started again have committed a batch, or wait for data
        with none to run."""
        if not self.queries or not all(query.isActive for query, _ in self.queries):
            return False
        if sum(c.health()["batches"] for _, c in self.queries) > fault.batches_at_restart:
            return True
        return all(
            not query.status["isDataAvailable"]
            and not query.status["isTriggerActive"]
            and not query.status["message"].startswith("Initializing")
            for query, _ in self.queries
        )

    def _failing_disk(self) -> tuple[str, OSError] | None:
        """The first place the engine writes (the lakehouse, the landing archive, Spark's
        local folder in local mode) that refuses a probe, and its error; None if none."""
        places = [(self.config.lakehouse, self.config.table("_checkpoints"))]
        if self.config.engine.landing_archive:
            places.append((self.config.engine.landing_archive,) * 2)
        if self.config.engine.master.startswith("local"):
            local = self.spark.conf.get("spark.local.dir", None) or os.environ.get(
                "SPARK_LOCAL_DIRS", "/tmp"
            )
            places.append((local.split(",")[0],) * 2)
        for path, folder in places:
            err = probe(folder, self.config.s3)
            if err is not None:
                return path, err
        return None

    def _remove_leftovers(self) -> None:
        """Delete what failed writes (or a kill) left, while no query runs: Spark's
        temporary checkpoint files, and the data files of batches that never committed.
        Best effort; what was deleted is logged."""
        removed = []
        checkpoint = self.config.table(f"_checkpoints/{QUERY_NAME}")
        with contextlib.suppress(Exception):
            removed += remove_temporaries(checkpoint, self.config.s3)
        partitions = (
            checkpoint_partitions(checkpoint, self.config.s3)
            or self.config.engine.shuffle_partitions
        )
        for name in tables.engine_tables(self.plan):
            location = self.config.table(name)
            writers = [writer_id(QUERY_NAME, name, partition) for partition in range(partitions)]
            with contextlib.suppress(Exception):
                found = tables.remove_orphans(
                    location, writers, self.config.s3, single_writer_id(QUERY_NAME, name)
                )
                removed += [f"{location}/{file}" for file in found]
        if removed:
            log.info("removed what failed writes left: %s", ", ".join(removed))

    def log_progress(self) -> None:
        """One line per query: its batches, readings and lag since the last line."""
        since, before = self._logged
        now = time.monotonic()
        counts: dict[str, int] = {}
        for query, figures in self.queries:
            seen = figures.health()
            streams = (seen["figures"].get("streams") or {}).items()
            readings = sum(v for k, v in seen["totals"].items() if k.startswith("readings."))
            counts[query.name] = readings
            durations = sorted(self.listener.take_durations(query.name))
            if not durations:
                continue
            lag = ", ".join(
                watermark_lag(name, f["watermark_ms"], time.time() * 1000)
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
        self,
        stop: threading.Event,
        health_every_s: float = 2.0,
        log_every_s: float = 30.0,
        tick: Callable[[], None] | None = None,
        tick_every_s: float = 1.0,
    ) -> None:
        """Run until `stop` is set or a query fails for another reason than a full or
        read-only disk (then raise; such a disk is waited out: `watch`); health every
        `health_every_s`, a progress line per query every `log_every_s`, and `tick`
        (the rule watch) every `tick_every_s`."""
        try:
            self.start()
        except Exception as err:  # a full or read-only disk at the start: waited out too
            problem = fault_of(err)
            if problem is None:
                raise
            self._given_up(problem, str(err))
        logged = written = time.monotonic()
        every = min(health_every_s, tick_every_s) if tick is not None else health_every_s
        try:
            while not stop.wait(self._pause(every)):
                self.watch()
                if tick is not None:
                    tick()
                if time.monotonic() - written < health_every_s - 0.01:
                    continue
                written = time.monotonic()
                self.write_health()
                if time.monotonic() - logged >= log_every_s:
                    logged = time.monotonic()
                    self.log_progress()
        finally:
            self.stop()
            self.write_health()

    def _pause(self, health_every_s: float) -> float:
        """Until the next health record, or the next try while a storage fault holds."""
        if self.fault is None or self.fault.restarted_at is not None:
            return health_every_s
        return min(health_every_s, max(self.fault.retry_at - time.monotonic(), 0.05))
