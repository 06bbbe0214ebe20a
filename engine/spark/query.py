"""One engine query per connected part of the stream graph, from landing files to every
table it writes:

    readStream(lookout_landing)          # the component's stream folders: executors
                                         # read and parse each new file (Arrow)
      .groupBy("component")              # one group: each stream's arrival order
      .transformWithState(ComponentProcessor)   # sequencing and the whole rule DAG
                                                # (engine.core.pipeline), state in
                                                # RocksDB, Parquet files written
      .foreachBatch(Committer)           # the driver commits each table's files once

Derived streams that feed further rules are evaluated inside the same stateful step,
as `lookout replay` does in one process: no rule output travels through a Delta table
to another query on its way to an alert.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from engine.alerts import AlertSpec
from engine.core.pipeline import components
from engine.core.plan import Plan
from engine.spark.commit import Committer, table_schemas
from engine.spark.landing_source import NAME, LandingSource, source_options
from engine.spark.processor import OUTPUT_SCHEMA, Component, ComponentProcessor
from lookout.config import Config


def query_name(component: Component) -> str:
    """The streaming query's name (and its checkpoint folder's)."""
    return f"engine-{component.name}"


def engine_components(plan: Plan, alerts: Mapping[str, AlertSpec]) -> list[Component]:
    """The plan's connected parts as the engine runs them: named after their source
    streams; the first also lands the quarantine folder."""
    found = components(plan)
    return [
        Component("+".join(sources), sources, plan, dict(alerts), quarantine=i == 0)
        for i, sources in enumerate(found)
    ]


def start_query(
    spark: SparkSession, config: Config, component: Component
) -> tuple[StreamingQuery, Committer]:
    """Start the query of `component` (checkpointed in the lakehouse)."""
    spark.dataSource.register(LandingSource)
    plan = component.plan
    options = source_options(
        config.landing,
        config.engine.landing_archive,
        config.s3,
        component.name,
        [plan.streams[name] for name in component.sources],
        component.quarantine,
    )
    name = query_name(component)
    checkpoint = config.table(f"_checkpoints/{name}")
    processor = ComponentProcessor(component, config, memo_id=checkpoint)
    committer = Committer(config, name, table_schemas(plan, component.sources))
    query = (
        spark.readStream.format(NAME)
        .options(**options)
        .load()
        .groupBy("component")
        .transformWithState(processor, OUTPUT_SCHEMA, "Append", "None")
        .writeStream.foreachBatch(committer)
        .queryName(name)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{config.engine.trigger_seconds} seconds")
        .start()
    )
    return query, committer
