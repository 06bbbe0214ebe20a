"""The engine query, from landing files to every table it writes:

    readStream(lookout_landing)          # every source stream's folder: a row per
                                         # new file (its part, stream and name)
      .groupBy("component")              # a group per connected part of the rules:
                                         # each stream's arrival order meets in one task
      .transformWithState(EngineProcessor)   # the part's files read and parsed,
                                             # sequencing and the whole rule DAG
                                             # (engine.core.pipeline), state in RocksDB,
                                             # Parquet files written, and committed to
                                             # Delta once per batch (engine.spark.commit)
      .foreachBatch(BatchFigures)        # the batch's figures: no reading reaches the
                                         # driver, the tasks commit their files

Derived streams that feed further rules are evaluated inside the same stateful step,
as `lookout replay` does in one process: no rule output travels through a Delta table
to another query on its way to an alert. One query for every part of the rules pays
Spark's per-batch costs (planning, the state store's commit, the Delta commits) once
per batch, not once per part; each part's group goes to the state-store partition its
name hashes to (docs/runtime.md: the shipped rules' parts share one).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from engine.alerts import AlertSpec
from engine.core.pipeline import components
from engine.core.plan import Plan
from engine.spark.batch_figures import BatchFigures
from engine.spark.landing_source import NAME, LandingSource, source_options
from engine.spark.processor import OUTPUT_SCHEMA, QUERY_NAME, Component, EngineProcessor
from lookout.config import Config


def engine_components(plan: Plan, alerts: Mapping[str, AlertSpec]) -> list[Component]:
    """The plan's connected parts as the engine runs them, named after their source
    streams."""
    return [
        Component("+".join(sources), sources, plan, dict(alerts)) for sources in components(plan)
    ]


def start_query(
    spark: SparkSession,
    config: Config,
    parts: list[Component],
    figures: BatchFigures | None = None,
) -> tuple[StreamingQuery, BatchFigures]:
    """Start the engine query over `parts` (checkpointed in the lakehouse); the first
    part also takes the quarantine folder. `figures`: those a failed run of the query
    had (its counts go on), else new ones."""
    spark.dataSource.register(LandingSource)
    plan = parts[0].plan
    options = source_options(
        config.landing,
        config.engine.landing_archive,
        config.s3,
        {part.name: [plan.streams[name] for name in part.sources] for part in parts},
        parts[0].name,
    )
    checkpoint = config.table(f"_checkpoints/{QUERY_NAME}")
    processor = EngineProcessor(parts, config, memo_id=checkpoint)
    if figures is None:
        figures = BatchFigures(QUERY_NAME)
    query = (
        spark.readStream.format(NAME)
        .options(**options)
        .load()
        .groupBy("component")
        .transformWithState(processor, OUTPUT_SCHEMA, "Append", "None")
        .writeStream.foreachBatch(figures)
        .queryName(QUERY_NAME)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{config.engine.trigger_seconds} seconds")
        .start()
    )
    return query, figures
