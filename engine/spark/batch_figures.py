"""The driver's part of a batch: run its job and keep its figures.

`BatchFigures` is the engine query's `foreachBatch`. Collecting the batch runs its job
(the landing files read, the stateful step, each task's Delta commits:
`engine.spark.commit`), and what comes back is small: a row per file a task committed
(its table and row count) and a row of health figures per component. It keeps those
for the engine's health record, log and metrics; no reading reaches the driver.

A job that fails, or that a stopping query cancels, is raised as `BatchJobFailed`: its
Java error without the stack frames. Spark reads the error `foreachBatch` raised to
tell a stop from a failure, with a regular expression that recurses once per character
and overflows the thread's stack past about 1,500 of them: py4j's own error, frames
and all, would kill the query's thread instead of stopping it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame

from engine.spark.metrics import observe_step

log = logging.getLogger("lookout.engine")


_TIMINGS = ("read_ms", "restore_ms", "evaluate_ms", "save_ms", "write_ms")
_COMMIT = "commit_ms"  # a task's commits, reported by its next batch's first part


def _timings(figures: Mapping[str, Any]) -> dict[str, Any]:
    return {k: figures[k] for k in (*_TIMINGS, _COMMIT, "reused") if k in figures}


class BatchJobFailed(RuntimeError):
    """A batch's job failed or was cancelled (its Java error, the frames left out)."""


def without_frames(java_error: str) -> str:
    """A Java error's text (py4j's: the call, then the exception and its causes with
    their stacks) as the exceptions' own lines: the stack frames and py4j's line on the
    call left out."""
    lines = java_error.splitlines()
    if lines and lines[0].startswith("An error occurred while calling"):
        lines = lines[1:]
    kept = (x.removeprefix(": ") for x in lines if not _FRAME.match(x))
    return "\n".join(x for x in kept if x.strip())


_FRAME = re.compile(r"\s+(at |\.\.\. \d+ more)")


def merge_figures(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures of several components' steps as one: streams, keys and open
    incidents per alert side by side, counts and durations summed (the steps' work),
    `reused` only if every part's was, `waited_ms` the least (when the first began);
    `commit_ms` the tasks' commits of their previous batch."""
    merged: dict[str, Any] = {"streams": {}, "keys": {}, "firing": {}, "quarantined": 0}
    merged["dropped"], merged["warmed"] = [], []
    for part in parts:
        for name in ("streams", "keys", "firing"):
            merged[name].update(part.get(name, {}))
        merged["quarantined"] += part.get("quarantined", 0)
        merged["dropped"] += part.get("dropped", [])
        merged["warmed"] += [part["warmed"]] if part.get("warmed") else []
        merged["reused"] = merged.get("reused", True) and part.get("reused", False)
        for name in (*_TIMINGS, _COMMIT):
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


class BatchFigures:
    """`foreachBatch` of the engine query (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.figures: dict[str, Any] = {}
        self._latest: dict[str, dict[str, Any]] = {}  # per component
        self.totals: Counter[str] = Counter()
        self.batches = 0
        self.last_batch_at = 0.0

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started, started_ms = time.perf_counter(), time.time() * 1000
        try:
            rows = batch.toArrow().to_pylist()  # runs the batch's job: read, evaluate, commit
        except Py4JJavaError as error:
            raise BatchJobFailed(f"batch {batch_id}: {without_frames(str(error))}") from None
        job_s = time.perf_counter() - started
        parts: list[dict[str, Any]] = []  # each component's figures
        written: Counter[str] = Counter()
        for row in rows:
            if row["kind"] == "health":
                part = orjson.loads(row["stats"])
                part["waited_ms"] = round(part.pop("began_ms") - started_ms)
                parts.append(part)
            else:
                written[f"written.{row['table']}"] += row["records"]
        figures = merge_figures(parts)
        observe_step(self.name, figures, job_s)
        with self.lock:
            self.batches += 1
            self.last_batch_at = time.time()
            self.totals.update(written)
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

    def health(self) -> dict[str, Any]:
        """The latest batch's figures and the totals since this engine started."""
        with self.lock:
            return {
                "figures": dict(self.figures),
                "totals": dict(self.totals),
                "batches": self.batches,
                "last_batch_at": self.last_batch_at,
                "commit_ms": self.figures.get("commit_ms", 0.0),
            }
