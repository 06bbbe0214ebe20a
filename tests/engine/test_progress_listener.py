"""Spark's progress reports reach the engine's metrics (`engine.spark.metrics`).

The listener takes each report as Spark's JSON of it, through a py4j bridge of its own:
PySpark's bridge reads a report over dozens of py4j calls, and every map it reads ends
in a Java exception that costs the JVM a scan of its class path. The test runs a real
query, and requires each phase's histogram and the batch durations to be filled, and
that the reports cost the JVM no exception (py4j's log shows every command and its
answer; an exception's answer starts with "!x").
"""

from __future__ import annotations

import logging
import time

import pytest
from prometheus_client import REGISTRY

from engine.spark.metrics import ProgressListener

pytestmark = pytest.mark.spark


def samples(query: str, phase: str) -> float:
    value = REGISTRY.get_sample_value(
        "lookout_engine_batch_seconds_count", {"query": query, "phase": phase}
    )
    return value or 0.0


def test_progress_reports_fill_the_phases_without_java_exceptions(spark, caplog) -> None:  # type: ignore[no-untyped-def]
    listener = ProgressListener({"progress_probe"})
    spark.streams.addListener(listener)
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 50)
        .load()
        .writeStream.format("noop")
        .queryName("progress_probe")
        .trigger(processingTime="0.2 seconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while samples("progress_probe", "trigger") < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        # Every py4j logger the calls go through (an engine stopped earlier in the
        # session leaves `py4j.clientserver` at CRITICAL).
        with (
            caplog.at_level(logging.DEBUG, logger="py4j"),
            caplog.at_level(logging.DEBUG, logger="py4j.clientserver"),
            caplog.at_level(logging.DEBUG, logger="py4j.java_gateway"),
        ):
            seen = samples("progress_probe", "trigger")
            while samples("progress_probe", "trigger") < seen + 3 and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        query.stop()
        spark.streams.removeListener(listener)
    for phase in ("trigger", "add_batch", "wal", "commit_offsets"):
        assert samples("progress_probe", phase) >= 3, phase
    assert listener.take_durations("progress_probe"), "batches with input are timed"
    assert listener.take_durations("progress_probe") == [], "each duration is taken once"
    answers = [r.getMessage() for r in caplog.records if "Answer received" in r.getMessage()]
    assert answers, "py4j's log was read"
    assert not [a for a in answers if a.startswith("Answer received: !x")], answers[:5]
