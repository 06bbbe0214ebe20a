"""The engine query, from landing files to every table it writes:

    readStream(lookout_landing)          # every source stream's folder: executors read
                                         # and parse each new file (Arrow)
      .groupBy("component")              # a group per connected part of the rules:
                                         # each stream's arrival order meets in one task
      .transformWithState(EngineProcessor)   # sequencing and the whole rule DAG
                                             # (engine.core.pipeline), state in RocksDB,
                                             # Parquet files written
      .foreachBatch(Committer)           # the driver commits each table's files once

Derived streams that feed further rules are evaluated inside the same stateful step,
as `lookout replay` does in one process: no rule output travels through a Delta table
to another query on its way to an alert. One query for every part of the rules pays
Spark's per-batch costs (planning, the state store's commit, the Delta commits) once
per batch, not once per part; the parts still run side by side, one task each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from engine.alerts import AlertSpec
from engine.core.pipeline import components, fed_stages
from engine.core.plan import Plan
from engine.spark.commit import Committer, table_schemas
from engine.spark.landing_source import NAME, LandingSource, source_options
from engine.spark.processor import OUTPUT_SCHEMA, Component, EngineProcessor
from lookout.config import Config

QUERY_NAME = "engine"
"""The streaming query's name (and its checkpoint folder's)."""


def engine_components(plan: Plan, alerts: Mapping[str, AlertSpec]) -> list[Component]:
    """The plan's connected parts as the engine runs them, named after their source
    streams."""
    return [
        Component("+".join(sources), sources, plan, dict(alerts)) for sources in components(plan)
    ]


def spread(spark: SparkSession, parts: list[Component], partitions: int) -> list[Component]:
    """The parts with grouping keys that put them on different state-store partitions,
    so their tasks run side by side: the part with the most rules first, each on the
    partition with the fewest rules so far.

    Spark places a group by `pmod(hash(key), partitions)`; the part names alone can all
    land on one partition (the shipped rules' three did), which ran them one after
    another. A key is the part's name and a suffix (`traffic#3`) found by asking Spark
    for the hashes of a few candidates. A key only places the part: changing the number
    of partitions later costs speed, never results."""
    if partitions < 2 or len(parts) < 2:
        return parts
    candidates = [f"{part.name}#{n}" for part in parts for n in range(8 * partitions)]
    rows = spark.createDataFrame([(c,) for c in candidates], "key STRING").selectExpr(
        "key", f"pmod(hash(key), {partitions}) AS partition"
    )
    where = {row.key: row.partition for row in rows.collect()}
    rules = [len(fed_stages(part.plan, part.sources)) for part in parts]
    load = [0] * partitions
    spread_parts = list(parts)
    for i in sorted(range(len(parts)), key=lambda i: -rules[i]):
        target = min(range(partitions), key=lambda p: load[p])
        keys = [c for c in candidates if c.split("#")[0] == parts[i].name and where[c] == target]
        if keys:
            spread_parts[i] = replace(parts[i], group=keys[0])
            load[target] += rules[i] + 1
    return spread_parts


def start_query(
    spark: SparkSession, config: Config, parts: list[Component]
) -> tuple[StreamingQuery, Committer]:
    """Start the engine query over `parts` (checkpointed in the lakehouse); the first
    part also takes the quarantine folder."""
    spark.dataSource.register(LandingSource)
    parts = spread(spark, parts, config.engine.shuffle_partitions)
    plan = parts[0].plan
    options = source_options(
        config.landing,
        config.engine.landing_archive,
        config.s3,
        {part.key: [plan.streams[name] for name in part.sources] for part in parts},
        parts[0].key,
    )
    checkpoint = config.table(f"_checkpoints/{QUERY_NAME}")
    processor = EngineProcessor(parts, config, memo_id=checkpoint)
    sources = tuple(name for part in parts for name in part.sources)
    committer = Committer(config, QUERY_NAME, table_schemas(plan, sources))
    query = (
        spark.readStream.format(NAME)
        .options(**options)
        .load()
        .groupBy("component")
        .transformWithState(processor, OUTPUT_SCHEMA, "Append", "None")
        .writeStream.foreachBatch(committer)
        .queryName(QUERY_NAME)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{config.engine.trigger_seconds} seconds")
        .start()
    )
    return query, committer
