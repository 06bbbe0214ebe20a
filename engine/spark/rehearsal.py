"""A standby's rehearsal: the engine query run over a scratch lakehouse while the
standby waits to take over (`lookout engine --standby`).

A JVM that has never run the query pays, in its first batch, for loading and compiling
the classes of the landing source, `transformWithState`, the RocksDB state store and
Delta's commit, and Spark plans the query for the first time; a Python worker that has
never run the stateful step first imports the engine. All of that lands on the first
batch after a takeover, when the readings that arrived during the outage wait. The
rehearsal pays it beforehand: it starts the same rules' query on a lakehouse in a
temporary folder, lands a reading and a heartbeat of every source stream there (so every
part runs its stateful step and writes its tables), and then a heartbeat every
``every_s`` seconds (45), which keeps a Python worker from being stopped as idle (Spark
stops one idle for a minute). Between them its query looks for new files every 5 s, not
every ``trigger_seconds``: idle, a standby uses about 4 % of a core. At takeover it
stops and its folder is deleted.

Nothing of the real lakehouse is read or written. The rehearsal's own engine log lines
(its parts, its batches) are left out of the log below warnings, as nothing else of the
engine runs in the process meanwhile; its batches are counted in the process's metrics
like any other (one every ``every_s`` seconds). A standby killed while it waits leaves
its folder behind; the next rehearsal on the machine deletes the folders of standbys no
longer running (the process id is in the folder's name).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

from engine.alerts import AlertSpec
from engine.core.plan import ColumnType, Plan, StreamSchema
from engine.spark.job import EngineJob
from ingest.landing import LandingWriter
from lookout.config import Config

log = logging.getLogger("lookout")
ENGINE_LOG = logging.getLogger("lookout.engine")

PREFIX = "lookout-rehearsal-"
"""The scratch folders' names: this, the standby's process id, a dash, a random part."""

SOURCE = "standby-rehearsal"
"""The ``source`` of the rehearsal's readings and heartbeats."""

_VALUES: dict[ColumnType, Any] = {
    ColumnType.INT: 0,
    ColumnType.BIGINT: 0,
    ColumnType.DOUBLE: 0.0,
    ColumnType.STRING: SOURCE,
    ColumnType.BOOLEAN: False,
}


def rehearsal_reading(stream: StreamSchema, ts_ms: int, seq: int) -> dict[str, Any]:
    """A reading of ``stream`` as ingest lands it: every column a value of its type (the
    timestamp ``ts_ms``)."""
    reading: dict[str, Any] = {
        c.name: ts_ms if c.type == ColumnType.TIMESTAMP else _VALUES[c.type] for c in stream.columns
    }
    return {**reading, "source": SOURCE, "seq": seq, "epoch": SOURCE}


class Rehearsal:
    """The engine query of ``plan`` on a scratch lakehouse, in ``spark`` (see the module
    docstring); :meth:`start` it, :meth:`stop` it before the real query starts."""

    def __init__(
        self,
        spark: SparkSession,
        config: Config,
        plan: Plan,
        alerts: Mapping[str, AlertSpec],
        every_s: float = 45.0,
    ) -> None:
        self.spark = spark
        self.config = config
        self.plan = plan
        self.alerts = alerts
        self.every_s = every_s
        self.batches = 0
        """Batches of the rehearsal query run so far."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._folder: str | None = None
        self._job: EngineJob | None = None
        self._quiet = _BelowWarning()

    def scratch_config(self, folder: str) -> Config:
        """The configuration the rehearsal runs with: the lakehouse in ``folder``, the
        landing inside it, no metrics server, no table maintenance, a trigger every 5 s."""
        engine = dataclasses.replace(
            self.config.engine,
            metrics_port=0,
            compact_every_seconds=0.0,
            landing_archive="",
            trigger_seconds=5.0,
        )
        ingest = dataclasses.replace(self.config.ingest, landing_url="")
        return dataclasses.replace(self.config, lakehouse=folder, engine=engine, ingest=ingest)

    def start(self) -> None:
        """Start the rehearsal in a thread of its own: the query, its first readings, and a
        heartbeat every ``every_s`` seconds."""
        remove_abandoned(tempfile.gettempdir())
        self._folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
        ENGINE_LOG.addFilter(self._quiet)
        self._thread = threading.Thread(
            target=self._run, args=(self._folder,), name="standby-rehearsal", daemon=True
        )
        self._thread.start()

    def _run(self, folder: str) -> None:
        config = self.scratch_config(folder)
        landing = LandingWriter(config.landing, "rehearsal")
        sources = list(self.plan.sources())
        began = time.monotonic()
        job = self._job = EngineJob(config, self.plan, self.alerts, spark=self.spark)
        try:
            job.start()
            now = int(time.time() * 1000)
            for stream in sources:
                topic = stream.topic or stream.name
                landing.add_readings(stream.name, [rehearsal_reading(stream, now, 0)], topic, now)
            while not self._stop.is_set():
                now = int(time.time() * 1000)
                for stream in sources:
                    landing.add_heartbeat(stream.name, {"source": SOURCE, "ts": now}, now)
                landing.flush()
                for query, _ in job.queries:
                    query.processAllAvailable()
                if self.batches == 0:
                    log.info("standby: rehearsed the query in %.1f s", time.monotonic() - began)
                self.batches += 1
                self._stop.wait(self.every_s)
        except Exception as err:  # a rehearsal only saves time: the standby waits on
            if not self._stop.is_set():
                log.warning("standby: the rehearsal stopped: %s", str(err).splitlines()[0])
        finally:
            job.stop()

    @property
    def running(self) -> bool:
        """Whether the rehearsal runs: started, neither stopped nor given up."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def stop(self) -> None:
        """Stop the rehearsal query (a batch in flight is abandoned) and delete its
        lakehouse."""
        self._stop.set()
        if self._job is not None:
            self._job.stop_queries()  # ends a batch the thread may be waiting for
        if self._thread is not None:
            self._thread.join()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        ENGINE_LOG.removeFilter(self._quiet)


def remove_abandoned(folder: str) -> list[str]:
    """Delete the scratch folders in ``folder`` of rehearsals whose process no longer
    runs; return their paths."""
    removed = []
    for entry in os.scandir(folder):
        if not entry.name.startswith(PREFIX):
            continue
        owner = entry.name.removeprefix(PREFIX).split("-")[0]
        if not owner.isdigit() or _running(int(owner)):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, and is another user's
        pass
    return True


class _BelowWarning(logging.Filter):
    """Leaves out records below WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING
