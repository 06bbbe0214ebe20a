"""The SparkSession Lookout runs on: Delta configured, sized for the machine.

Settings that matter here (DESIGN §7): RocksDB state store (transformWithStateInPandas
needs it), few shuffle partitions in local mode, and Delta tables created without
deletion vectors or column mapping so the dashboard's delta-rs reader can load them.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from lookout.config import EngineConfig


def build_session(config: EngineConfig, app_name: str = "lookout") -> SparkSession:
    """Create (or return the running) SparkSession with Delta and the state store set up."""
    from delta import configure_spark_with_delta_pip

    # Spark otherwise picks the host's first non-loopback address; we stay on 127.0.0.1.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must be this interpreter (the venv), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(config.master)
        .appName(app_name)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.sql.shuffle.partitions", str(config.shuffle_partitions))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Readers of our tables (delta-rs in the dashboard) cannot use these features.
        .config("spark.databricks.delta.properties.defaults.enableDeletionVectors", "false")
        .config("spark.databricks.delta.properties.defaults.columnMapping.mode", "none")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
        # Delta rebuilds a table's snapshot with this many partitions (default 50): each
        # first read of a table, including a stream's start, took ~3x longer here.
        .config("spark.databricks.delta.snapshotPartitions", str(config.shuffle_partitions))
    )
    spark = configure_spark_with_delta_pip(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
