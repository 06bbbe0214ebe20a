"""The driver's part of a batch: commit the files the executors wrote, exactly once.

The stateful step writes each table's new rows as Parquet files in the table's folder
and returns only their names and sizes (`engine.spark.step`). `Committer` is the
query's `foreachBatch`: it adds each table's files in one Delta commit tagged with the
query's writer id and the batch id (Delta's transaction identifiers), so a batch that
runs again after a crash finds its commits done and deletes the copies it wrote
instead. The incidents table is merged by incident id in the same way (one commit with
the writer's version): its rows are whole states, so the table holds each incident's
latest. Tables commit side by side (delta-rs works outside the GIL). It also keeps
the batch's health figures for the engine's health record and metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql import DataFrame

from engine import tables
from engine.core.plan import Plan
from engine.spark.metrics import observe_step
from lookout.config import Config

log = logging.getLogger("lookout.engine")


def table_schemas(plan: Plan, sources: tuple[str, ...]) -> dict[str, pa.Schema]:
    """Every table an engine query over `sources` may append to, with its schema."""
    schemas = dict(tables.SHARED)
    for name in sources:
        schemas[tables.readings_table(name)] = tables.readings_schema(plan.streams[name])
    for query in plan.queries:
        if query.sink.name in plan.streams:
            schemas[query.sink.name] = tables.derived_schema(plan.streams[query.sink.name])
    return schemas


def writer_id(query: str, table: str) -> str:
    """The Delta transaction app id of `query`'s commits to `table` (its version: the
    batch id)."""
    return f"lookout-{query}-{table}"


_TIMINGS = ("read_ms", "restore_ms", "evaluate_ms", "save_ms", "write_ms")


def _timings(figures: Mapping[str, Any]) -> dict[str, Any]:
    return {k: figures[k] for k in (*_TIMINGS, "reused") if k in figures}


def merge_figures(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures of several components' steps as one: streams, keys and open
    incidents per alert side by side, counts and durations summed (the steps' work),
    `reused` only if every part's was, `waited_ms` the least (when the first began)."""
    merged: dict[str, Any] = {"streams": {}, "keys": {}, "firing": {}, "quarantined": 0}
    merged["dropped"], merged["warmed"] = [], []
    for part in parts:
        for name in ("streams", "keys", "firing"):
            merged[name].update(part.get(name, {}))
        merged["quarantined"] += part.get("quarantined", 0)
        merged["dropped"] += part.get("dropped", [])
        merged["warmed"] += [part["warmed"]] if part.get("warmed") else []
        merged["reused"] = merged.get("reused", True) and part.get("reused", False)
        for name in _TIMINGS:
            if name in part:
                merged[name] = round(merged.get(name, 0.0) + part[name], 1)
        if "waited_ms" in part:  # the first step's start: the parts' steps follow it
            merged["waited_ms"] = min(merged.get("waited_ms", part["waited_ms"]), part["waited_ms"])
    return merged


def rebuilt(part: Mapping[str, Any]) -> str:
    """The log's line on a component's batch that rebuilt its pipeline from the state
    store (a restart, or the task moved to another worker): how long the rebuild took,
    the keys it took up, the whole step's time and readings, and (`waited_ms`) how
    long after the batch's job started the step began."""
    keys = sum(part.get("keys", {}).values())
    readings = sum(s.get("readings", 0) for s in part.get("streams", {}).values())
    step_ms = sum(part.get(name, 0.0) for name in _TIMINGS)
    said = (
        f"part {part['component']} rebuilt from the state store in "
        f"{part.get('restore_ms', 0) / 1000:.1f} s ({keys:,} keys); its step took "
        f"{step_ms / 1000:.1f} s for {readings:,} readings"
    )
    if "waited_ms" in part:  # the task's start, the state store's load, the input read
        said += f", and began {part['waited_ms'] / 1000:.1f} s into the batch's job"
    return said


class Committer:
    """`foreachBatch` of one engine query (see the module docstring)."""

    def __init__(self, config: Config, name: str, schemas: Mapping[str, pa.Schema]) -> None:
        self.config = config
        self.name = name
        self.schemas = dict(schemas)
        self.lock = threading.Lock()
        self.figures: dict[str, Any] = {}
        self._latest: dict[str, dict[str, Any]] = {}  # per component
        self.totals: Counter[str] = Counter()
        self.batches = 0
        self.last_batch_at = 0.0
        self.commit_ms = 0.0
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"commit-{name}")
        # Each table stays open between batches: a commit reads only the log since.
        self._tables = tables.OpenTables(config.s3)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started, started_ms = time.perf_counter(), time.time() * 1000
        rows = batch.toArrow().to_pylist()  # runs the batch's job: read, evaluate, write
        collected = time.perf_counter()
        files: dict[str, list[tables.DataFile]] = {}
        parts: list[dict[str, Any]] = []  # each component's figures
        for row in rows:
            if row["kind"] == "health":
                part = orjson.loads(row["stats"])
                part["waited_ms"] = round(part.pop("began_ms") - started_ms)
                parts.append(part)
                continue
            file = tables.DataFile(
                row["table"],
                row["path"],
                row["size"],
                row["records"],
                row["modified"],
                row["stats"],
            )
            files.setdefault(file.table, []).append(file)
        jobs = [
            self._pool.submit(self._commit, table, found, batch_id)
            for table, found in sorted(files.items())
        ]
        for job in jobs:
            job.result()  # raises the first failure: the batch fails and runs again
        commit_s = time.perf_counter() - collected
        figures = merge_figures(parts)
        observe_step(self.name, figures, collected - started, commit_s)
        with self.lock:
            self.batches += 1
            self.last_batch_at = time.time()
            self.commit_ms = commit_s * 1000
            if parts:
                self._latest.update((part["component"], part) for part in parts)
                # Streams and keys as each component last reported them; durations this
                # batch's.
                self.figures = {**merge_figures(self._latest.values()), **_timings(figures)}
                for stream, counts in figures.get("streams", {}).items():
                    for what in (
                        "readings",
                        "late",
                        "duplicates",
                        "conflicts",
                        "capped",
                        "heartbeats",
                    ):
                        self.totals[f"{what}.{stream}"] += counts.get(what, 0)
                self.totals["quarantined"] += figures.get("quarantined", 0)
                for part in parts:
                    if part.get("reused") is False:
                        log.info("%s: batch %d: %s", self.name, batch_id, rebuilt(part))
                for said in figures.get("warmed", []):
                    log.info("%s: %s", self.name, said)
                for name in figures.get("dropped", []):
                    log.warning(
                        "%s: the saved state of %r was built by another version of the rule "
                        "(or a rule since removed): dropped",
                        self.name,
                        name,
                    )

    def _commit(self, table: str, files: list[tables.DataFile], batch_id: int) -> bool:
        """Add the batch's files to `table`, or merge them into it (incidents)."""
        location, writer = self.config.table(table), writer_id(self.name, table)
        if table in tables.MERGED:
            key, update = tables.MERGED[table]
            return tables.merge_files(
                location,
                self.schemas[table],
                files,
                key,
                update,
                writer,
                batch_id,
                self.config.s3,
                self._tables,
            )
        return tables.commit_files(
            location, self.schemas[table], files, writer, batch_id, self.config.s3, self._tables
        )

    def health(self) -> dict[str, Any]:
        """The latest batch's figures and the totals since this engine started."""
        with self.lock:
            return {
                "figures": dict(self.figures),
                "totals": dict(self.totals),
                "batches": self.batches,
                "last_batch_at": self.last_batch_at,
                "commit_ms": round(self.commit_ms, 1),
            }

    def close(self) -> None:
        """Stop the commit threads (after the query stopped)."""
        self._pool.shutdown(wait=True)
