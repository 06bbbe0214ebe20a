"""The engine's SparkSession keeps the JVM's memory flat (`engine.spark.session`): its heap
is resident from the start, and Spark keeps few records of finished work for its UI
(with Spark's defaults, 1,000 jobs, stages and SQL executions, every micro-batch adding
several, grew the driver's heap for many minutes)."""

from __future__ import annotations

import time

import pytest

from engine.spark.session import INITIAL_HEAP_MB, driver_jvm_options


@pytest.mark.spark
def test_the_jvm_touches_its_whole_heap_at_its_start(spark) -> None:  # type: ignore[no-untyped-def]
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert "-XX:+AlwaysPreTouch" in arguments
    assert not any(a.startswith("-XX:TieredStopAtLevel") for a in arguments)  # C2 too
    assert f"-Xms{INITIAL_HEAP_MB}m" in arguments  # it grows in no pause of a first backlog


def test_the_initial_heap_is_at_most_the_whole_heap() -> None:
    assert driver_jvm_options("4g").split() == ["-XX:+AlwaysPreTouch", "-Xms1024m"]
    assert driver_jvm_options("512m").split() == ["-XX:+AlwaysPreTouch", "-Xms512m"]


@pytest.mark.spark
def test_spark_keeps_at_most_fifty_finished_jobs(spark) -> None:  # type: ignore[no-untyped-def]
    context = spark.sparkContext
    for _ in range(60):
        context.parallelize([1]).count()
    kept = context.statusTracker().getJobIdsForGroup()
    deadline = time.monotonic() + 30  # Spark's listener bus records the jobs' ends apart
    while len(kept) > 50 and time.monotonic() < deadline:
        time.sleep(0.2)
        kept = context.statusTracker().getJobIdsForGroup()
    assert 0 < len(kept) <= 50
