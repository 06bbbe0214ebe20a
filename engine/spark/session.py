"""The SparkSession Lookout runs on: Delta configured, sized for the machine.

Settings that matter here (DESIGN §7): RocksDB state store (transformWithStateInPandas
needs it), few shuffle partitions in local mode, Delta tables created without deletion
vectors or column mapping so the dashboard's delta-rs reader can load them, and
checkpoint files written through Hadoop's FileSystem API rather than FileContext (see
`CHECKPOINT_FILE_MANAGER`).
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from lookout.config import EngineConfig

# Spark's default manager renames a checkpoint file through Hadoop's FileContext, which
# without Hadoop's native library runs `readlink` four times per file (file and .crc,
# source and target) besides the two `chmod`s of creating it: six processes per offset,
# commit or state changelog file. FileSystem.rename skips the readlinks: rules batch
# 1.03 -> 0.75 s, landing batch 0.54 -> 0.33 s here. It is the same rename(2), atomic on
# a local or shared POSIX filesystem, and neither manager syncs the file, so a kill -9
# keeps what it kept before.
CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


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
        .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER)
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
        # Below Int.MaxValue, Spark sizes its Arrow vectors after every row it hands to
        # Python (`ArrowWriter.sizeInBytes`): 15 % of the JVM's time at a 1 s slide here.
        # Batches stay bounded by `arrow.maxRecordsPerBatch` (10,000 rows).
        .config("spark.sql.execution.arrow.maxBytesPerBatch", str(2**31 - 1))
    )
    spark = configure_spark_with_delta_pip(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
