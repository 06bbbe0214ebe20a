"""The engine's Prometheus metrics, its per-batch progress log, and its memory.

Served at `http://<address>:<metrics_port>/metrics` (`[engine]` in lookout.toml) in
Prometheus' text format, so a Prometheus or Grafana setup can watch the pipeline beside
the dashboard's Health page:

* `lookout_engine_batch_seconds{query, phase}`: where a batch's time goes. Spark's own
  phases come from its progress reports (`trigger` is the whole batch; `plan`,
  `offsets`, `source`, `add_batch`, `wal`, `commit_offsets` its parts); the stateful
  step reports `read` (its files read and parsed), `restore`, `evaluate` (which
  includes `save`: the state written to the state store), `write` (on the executor),
  and the state store its `state_commit`, all inside `job` (the batch's Spark job,
  itself inside `add_batch`);
  then the driver's Delta commits take `commit`;
* `lookout_stream_*_total{stream}`: readings, late, duplicates, conflicts, capped
  (readings of new keys quarantined by the stream's cap on live keys), heartbeats;
  `lookout_quarantined_total`;
* `lookout_stream_event_time_seconds`, `lookout_stream_watermark_seconds`,
  `lookout_stream_lag_seconds` (wall clock minus the newest event time);
* `lookout_engine_state_restores_total{query}`: batches that rebuilt their pipeline
  from the state store (another Python worker ran the one before);
* `lookout_engine_live_keys{query, rule}`: keys each rule holds state for, as of the last
  batch of its part of the rules; `lookout_stream_live_keys{stream}` (the most any rule
  reading the stream holds) and `lookout_stream_max_live_keys{stream}` (its cap, 0: none);
* `lookout_engine_resident_bytes{process}` (the driver's Python, its JVM, the Python
  workers, the table maintenance's process);
* `lookout_incidents_firing{rule}`: the alert rule's incidents open now (firing, or
  within KEEP FIRING FOR), as of the last batch of the rule's part of the rules;
* `lookout_state_store_memory_bytes{query}` (RocksDB's memory: memtables, block
  cache, table readers) and `lookout_state_store_files_bytes{query}` (its SST files),
  summed over the query's state stores, as of its last batch.

Metrics are process-wide (Prometheus' default registry): one engine per process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import orjson
import psutil
from prometheus_client import Counter, Gauge, Histogram, start_http_server
from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger("lookout.engine")

_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
BATCH_SECONDS = Histogram(
    "lookout_engine_batch_seconds",
    "Time a batch spent in each phase",
    ["query", "phase"],
    buckets=_BUCKETS,
)
INPUT_FILES = Counter(
    "lookout_engine_input_files_total", "Landing files the engine's batches read", ["query"]
)
STREAM_COUNTS = {
    what: Counter(f"lookout_stream_{what}_total", f"{what.capitalize()} per stream", ["stream"])
    for what in ("readings", "late", "duplicates", "conflicts", "capped", "heartbeats")
}
QUARANTINED = Counter("lookout_quarantined_total", "Landed lines the engine quarantined")
EVENT_TIME = Gauge("lookout_stream_event_time_seconds", "Newest event time seen", ["stream"])
WATERMARK = Gauge("lookout_stream_watermark_seconds", "The stream's watermark", ["stream"])
LAG = Gauge("lookout_stream_lag_seconds", "Wall clock minus the newest event time", ["stream"])
RESTORES = Counter(
    "lookout_engine_state_restores_total",
    "Batches whose pipeline was rebuilt from the state store (not in the worker's memory)",
    ["query"],
)
LIVE_KEYS = Gauge("lookout_engine_live_keys", "Keys a rule holds state for", ["query", "rule"])
STREAM_LIVE_KEYS = Gauge(
    "lookout_stream_live_keys", "The most keys a rule reading the stream holds", ["stream"]
)
MAX_LIVE_KEYS = Gauge(
    "lookout_stream_max_live_keys", "The stream's cap on live keys per rule (0: none)", ["stream"]
)
RESIDENT = Gauge("lookout_engine_resident_bytes", "Resident memory", ["process"])
INCIDENTS_FIRING = Gauge("lookout_incidents_firing", "Incidents open now, per alert rule", ["rule"])
STATE_MEMORY = Gauge(
    "lookout_state_store_memory_bytes", "The query's state stores' RocksDB memory", ["query"]
)
STATE_FILES = Gauge(
    "lookout_state_store_files_bytes", "The query's state stores' SST files", ["query"]
)

# Spark's progress phases (durationMs keys) under shorter names.
_SPARK_PHASES = {
    "triggerExecution": "trigger",
    "queryPlanning": "plan",
    "latestOffset": "offsets",
    "getBatch": "source",
    "addBatch": "add_batch",
    "walCommit": "wal",
    "commitOffsets": "commit_offsets",
}
_STEP_PHASES = ("read", "restore", "evaluate", "save", "write", "commit")


SLOW_BATCH_MS = 5_000
"""A batch at least this long is logged with Spark's phases (a restart's first batch,
a backlog, a stall): the 30-second progress line shows only its length."""


def slow_batch(progress: Mapping[str, Any]) -> str:
    """A slow batch's line: its length and Spark's phases of it, longest first (the
    stateful step and the driver's Delta commits are inside `addBatch`; the engine logs
    a part's rebuild apart)."""
    durations = progress.get("durationMs") or {}
    phases = {
        phase: durations[key]
        for key, phase in _SPARK_PHASES.items()
        if key in durations and phase != "trigger"
    }
    phases["state_commit"] = sum(
        op.get("commitTimeMs", 0) for op in progress.get("stateOperators") or ()
    )
    said = ", ".join(
        f"{phase} {ms / 1000:.1f} s" for phase, ms in sorted(phases.items(), key=lambda p: -p[1])
        if ms >= 100
    )  # fmt: skip
    return (
        f"{progress.get('name')}: batch {progress.get('batchId')} took "
        f"{durations.get('triggerExecution', 0) / 1000:.1f} s for "
        f"{progress.get('numInputRows') or 0:,} landing files: {said or 'no phase over 0.1 s'}"
    )


def serve(address: str, port: int) -> None:
    """Serve /metrics on `address:port` (a thread of this process)."""
    start_http_server(port, addr=address)
    log.info("metrics on http://%s:%d/metrics", address, port)


def observe_step(query: str, figures: Mapping[str, Any], job_s: float) -> None:
    """Count one batch's figures (from the stateful step) and the time its job took (the
    source, the shuffle, the stateful step, the tasks' commits). ``commit`` is a task's
    Delta commits, reported with its next batch (they end the task). ``before_step`` is how
    long into the job the first stateful step began (`waited_ms`: the tasks' start, the
    source's listing of the files and the shuffle, the state store's load)."""
    for phase in _STEP_PHASES:
        if (ms := figures.get(f"{phase}_ms")) is not None:
            BATCH_SECONDS.labels(query, phase).observe(ms / 1000)
    if (waited := figures.get("waited_ms")) is not None:  # hosts' clocks may differ a little
        BATCH_SECONDS.labels(query, "before_step").observe(max(waited, 0) / 1000)
    BATCH_SECONDS.labels(query, "job").observe(job_s)
    for stream, counts in (figures.get("streams") or {}).items():
        for what, counter in STREAM_COUNTS.items():
            counter.labels(stream).inc(counts.get(what, 0))
        if (live := counts.get("live_keys")) is not None:
            STREAM_LIVE_KEYS.labels(stream).set(live)
            MAX_LIVE_KEYS.labels(stream).set(counts.get("max_live_keys", 0))
        if (max_ms := counts.get("max_event_ms")) is not None:
            EVENT_TIME.labels(stream).set(max_ms / 1000)
            WATERMARK.labels(stream).set(counts.get("watermark_ms", max_ms) / 1000)
    QUARANTINED.inc(figures.get("quarantined", 0))
    if figures.get("reused") is False:
        RESTORES.labels(query).inc()
    # Only the parts of the rules that ran this batch report; the others' keys and
    # incidents cannot have changed (their watermarks stood still), so their gauges
    # stand (one gauge per query summed only the parts of the last batch).
    for rule, count in (figures.get("keys") or {}).items():
        LIVE_KEYS.labels(query, rule).set(count)
    for rule, count in (figures.get("firing") or {}).items():
        INCIDENTS_FIRING.labels(rule).set(count)


def refresh(now_s: float | None = None) -> dict[str, int]:
    """Update the gauges that move with the wall clock: lag, and resident memory
    (returned too, in bytes per process kind)."""
    now_s = time.time() if now_s is None else now_s
    for labels, value in _samples(EVENT_TIME):
        LAG.labels(*labels).set(now_s - value)
    memory = resident_memory()
    for process, size in memory.items():
        RESIDENT.labels(process).set(size)
    return memory


def _samples(gauge: Gauge) -> list[tuple[tuple[str, ...], float]]:
    return [
        (tuple(sample.labels.values()), sample.value)
        for metric in gauge.collect()
        for sample in metric.samples
    ]


def resident_memory() -> dict[str, int]:
    """Resident bytes of this process (the driver's Python), its JVM, the Python
    workers Spark started (the JVM's descendants) and the table maintenance's process
    (the driver's other child)."""
    me = psutil.Process()
    sizes = {"driver": me.memory_info().rss, "jvm": 0, "python_workers": 0, "maintenance": 0}
    for child in me.children(recursive=True):
        try:
            rss = child.memory_info().rss
            if child.name() == "java":
                kind = "jvm"
            else:
                kind = "maintenance" if child.ppid() == me.pid else "python_workers"
        except psutil.Error:  # it ended meanwhile
            continue
        sizes[kind] += rss
    return sizes


class ProgressListener(StreamingQueryListener):
    """Spark's progress reports into `lookout_engine_batch_seconds`, and each query's
    batch durations since it was last asked (:meth:`take_durations`), for the log.

    Each report reaches it as one JSON document (:class:`_ProgressJson`), not through
    PySpark's own bridge: that one reads a report field by field over py4j, and each map
    it reads ends in a Java exception, which PySpark classifies by asking the JVM for
    classes that are not on its class path, each ask a scan of every jar (a third of the
    JVM's samples in a profile at one batch a second)."""

    def __init__(self, queries: set[str]) -> None:
        self.queries = queries
        self._durations: dict[str, list[float]] = {}
        self._lock = threading.Lock()  # Spark calls from its own thread
        self._bridge: Any = None

    @property
    def _jlistener(self) -> Any:
        """What `spark.streams.addListener` registers (and removeListener removes)."""
        if self._bridge is None:
            from pyspark import SparkContext

            jvm: Any = SparkContext._jvm
            self._bridge = jvm.PythonStreamingQueryListenerWrapper(_ProgressJson(self))
        return self._bridge

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        self.take_progress(orjson.loads(event.progress.json))

    def take_progress(self, progress: Mapping[str, Any]) -> None:
        """Record one progress report, as Spark's JSON of it."""
        name = progress.get("name")
        if name not in self.queries:
            return
        durations = progress.get("durationMs") or {}
        for key, phase in _SPARK_PHASES.items():
            if key in durations:
                BATCH_SECONDS.labels(name, phase).observe(durations[key] / 1000)
        operators = progress.get("stateOperators") or ()
        for operator in operators:
            # The state store's commit (RocksDB's write batch, flush, changelog).
            BATCH_SECONDS.labels(name, "state_commit").observe(
                operator.get("commitTimeMs", 0) / 1000
            )
        if operators:
            custom = [op.get("customMetrics") or {} for op in operators]
            STATE_MEMORY.labels(name).set(sum(op.get("memoryUsedBytes", 0) for op in operators))
            STATE_FILES.labels(name).set(sum(c.get("rocksdbSstFileSize", 0) for c in custom))
        rows = progress.get("numInputRows") or 0
        INPUT_FILES.labels(name).inc(rows)
        if durations.get("triggerExecution", 0) >= SLOW_BATCH_MS:
            log.info("%s", slow_batch(progress))
        if "triggerExecution" in durations and rows:
            with self._lock:
                self._durations.setdefault(name, []).append(durations["triggerExecution"] / 1000)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def take_durations(self, query: str) -> list[float]:
        """The seconds each batch of `query` with input took since the last call."""
        with self._lock:
            return self._durations.pop(query, [])


class _ProgressJson:
    """The py4j callback Spark's listener bus calls: hands the listener each progress
    report as the JSON Spark makes of it (two calls to the JVM per report)."""

    def __init__(self, listener: ProgressListener) -> None:
        self.listener = listener

    def onQueryStarted(self, jevent: Any) -> None:
        pass

    def onQueryProgress(self, jevent: Any) -> None:
        self.listener.take_progress(orjson.loads(jevent.progress().json()))

    def onQueryIdle(self, jevent: Any) -> None:
        pass

    def onQueryTerminated(self, jevent: Any) -> None:
        pass

    class Java:
        implements: ClassVar[list[str]] = [
            "org.apache.spark.sql.streaming.PythonStreamingQueryListener"
        ]
