"""A batch's failed or cancelled job as `foreachBatch` raises it to Spark
(`engine.spark.batch_figures`): the exceptions' lines, no stack frames, and none of the
text after which Spark's check for a stop recurses once per character."""

from __future__ import annotations

import re
import traceback

import pytest
from py4j.protocol import Py4JJavaError

from engine.spark.batch_figures import BatchFigures, BatchJobFailed, without_frames

GROUP = "80ed910a-cbfc-4cde-92bd-334c91dd91d1"
CANCELLED = (
    "An error occurred while calling o250.getResult.\n"
    ": org.apache.spark.SparkException: Exception thrown in awaitResult: \n"
    "\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:56)\n"
    "\tat org.apache.spark.util.ThreadUtils$.awaitResult(ThreadUtils.scala:310)\n"
    + "\tat py4j.GatewayConnection.run(GatewayConnection.java:238)\n"
    * 400
    + f"Caused by: org.apache.spark.SparkException: Job 12 cancelled part of cancelled "
    f"job group {GROUP}\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.failJob(DAGScheduler.scala:2935)\n"
    "\t... 3 more\n"
)

# Spark's own test (StreamExecution.isInterruptionException) of an error from Python.
SPARKS_STOP_CHECK = re.compile(
    r"py4j.protocol.Py4JJavaError: An error occurred while calling((.|\r\n|\r|\n)*)"
    r"(java.lang.InterruptedException|java.io.InterruptedIOException)"
)


class JavaError(Py4JJavaError):
    """py4j's error with the text its gateway would give (and its name in a traceback)."""

    __module__, __qualname__ = "py4j.protocol", "Py4JJavaError"

    def __init__(self, text: str) -> None:
        Exception.__init__(self, text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def test_a_java_error_keeps_its_exceptions_lines_only() -> None:
    assert without_frames(CANCELLED) == (
        "org.apache.spark.SparkException: Exception thrown in awaitResult: \n"
        "Caused by: org.apache.spark.SparkException: Job 12 cancelled part of cancelled "
        f"job group {GROUP}"
    )


def test_a_python_traceback_in_a_java_error_stays() -> None:
    text = (
        ": org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/lookout/engine/step.py", line 9, in run\n'
        "ValueError: no such stream\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(X.scala:1)\n"
    )
    assert without_frames(text) == "\n".join(text.removeprefix(": ").splitlines()[:3])


def cancelled_batch() -> tuple[BatchJobFailed, str]:
    """What `foreachBatch` raises for batch 12, whose job was cancelled, and the text
    py4j sends the JVM for it (an error in a callback: its formatted traceback)."""

    class Batch:
        def toArrow(self) -> None:
            raise JavaError(CANCELLED)

    with pytest.raises(BatchJobFailed) as raised:
        BatchFigures("engine")(Batch(), 12)  # type: ignore[arg-type]
    return raised.value, "".join(traceback.format_exception(raised.value))


def test_a_cancelled_batch_raises_what_spark_reads_as_a_stop_in_a_few_lines() -> None:
    error, sent = cancelled_batch()
    assert len(sent) < 1_000 and "\tat " not in sent
    assert SPARKS_STOP_CHECK.search(sent) is None  # nothing to recurse over
    # Spark's other test of it: a SparkException's text naming the query's job group.
    assert "org.apache.spark.SparkException" in sent
    assert "cancelled" in sent and GROUP in sent
    assert str(error).startswith("batch 12: org.apache.spark.SparkException")


@pytest.mark.spark
def test_spark_reads_a_cancelled_batchs_error_as_its_querys_stop(spark) -> None:  # type: ignore[no-untyped-def]
    """Spark's own check, on the text the JVM gets from py4j for the error raised."""
    _, sent = cancelled_batch()
    jvm, context = spark.sparkContext._jvm, spark.sparkContext
    stream_execution = jvm.org.apache.spark.sql.execution.streaming.runtime.StreamExecution
    returned = jvm.py4j.Py4JException(f"An exception was raised by the Python Proxy. {sent}")
    context.setJobGroup(GROUP, "the query's batch")  # as on a query's thread
    try:
        assert stream_execution.isInterruptionException(returned, context._jsc.sc())
        context.setJobGroup("another-query", "its batch")
        assert not stream_execution.isInterruptionException(returned, context._jsc.sc())
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
