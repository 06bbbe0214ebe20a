"""The SparkSession Lookout runs on: Delta configured, sized for the machine.

Settings that matter here: RocksDB state store (transformWithState
needs it), few shuffle partitions in local mode, Delta tables created without deletion
vectors or column mapping so the dashboard's delta-rs reader can load them, and
checkpoint files written through Hadoop's FileSystem API rather than FileContext (see
`CHECKPOINT_FILE_MANAGER`).

When the lakehouse or the landing is on S3, Hadoop's S3A connector is added
(`hadoop-aws` of the Hadoop pyspark bundles) and reads the same `s3://` URLs delta-rs
and ingest write (`fs.s3.impl` is S3A, so one URL names a table everywhere); Spark's
streaming checkpoints go there too (`<lakehouse>/_checkpoints`), since on a cluster the
executors write the state store's files and need a place every node reaches.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyspark
from pyspark.sql import SparkSession

from engine.spark.class_archive import archive_path, recording_options, sharing_option
from engine.spark.spark_home import lookout_cache, spark_home
from lookout.config import EngineConfig, S3Config, jvm_mebibytes
from lookout.storage import s3_endpoint

# Spark's default manager renames a checkpoint file through Hadoop's FileContext, which
# without Hadoop's native library runs `readlink` four times per file (file and .crc,
# source and target) besides the two `chmod`s of creating it: six processes per offset,
# commit or state changelog file. FileSystem.rename skips the readlinks (it took
# 0.2-0.3 s off each batch here, in an earlier two-query design). It is the same
# rename(2), atomic on a local or shared POSIX filesystem, and neither manager syncs the
# file, so a kill -9 keeps what it kept before.
CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)

S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"


JVM_OPTIONS = "-XX:+AlwaysPreTouch"
"""The driver's and executors' JVM options. The JIT stays the JVM's default (tiered, C2
for hot code): with the quick compiler alone (C1) a standby compiled almost nothing after
its takeover, but every batch at load was slower (at 37k readings/s the state writes
0.28 s a batch against 0.19, p99 4.96 s against 3.98), and with the class archive the
default recovered from an engine kill better too (docs/runtime.md)."""

INITIAL_HEAP_MB = 1024
"""The driver JVM's heap at its start (at most its `driver_memory`). With the heap
pre-touched, each growth of the heap touches its new pages inside a garbage collection's
pause: from Spark's default start (1/64 of the machine's memory, 384 MB here) the first
backlog of a million readings grew it to 1.9 GB in a 2.2 s pause. A 20k readings/s
engine settles at about 1.1 GB resident, and a backlog then stays within 1 GB of heap."""


def driver_jvm_options(driver_memory: str, classes: str = "") -> str:
    """The driver JVM's options: `JVM_OPTIONS`, its heap from the start, and
    ``classes``, the options of its class archive (`engine.spark.class_archive`)."""
    initial = min(INITIAL_HEAP_MB, jvm_mebibytes(driver_memory))
    return f"{JVM_OPTIONS} -Xms{initial}m {classes}".rstrip()


def hadoop_version() -> str:
    """The Hadoop version pyspark bundles (its `hadoop-client-api` jar): hadoop-aws must
    be exactly that version."""
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    if not jars:
        raise RuntimeError(f"no hadoop-client-api jar in {Path(pyspark.__file__).parent}/jars")
    return jars[-1].stem.removeprefix("hadoop-client-api-")


def s3a_settings(s3: S3Config) -> dict[str, str]:
    """Spark settings for S3A, except the keys (see `build_session`)."""
    settings = {
        # s3:// is what delta-rs, pyarrow and AWS call it; Hadoop's default for it is none.
        "spark.hadoop.fs.s3.impl": S3A,
        "spark.hadoop.fs.s3a.endpoint.region": s3.region,
    }
    endpoint = s3_endpoint(s3)
    if endpoint is not None:
        settings.update(
            {
                "spark.hadoop.fs.s3a.endpoint": s3.endpoint,
                # MinIO, Ceph, moto: buckets in the path, not in the host name.
                "spark.hadoop.fs.s3a.path.style.access": "true",
                "spark.hadoop.fs.s3a.connection.ssl.enabled": str(endpoint[0] == "https").lower(),
                # The state store uploads its files with copyFromLocalFile, by default
                # through the SDK's async (Netty) client, which failed every upload to
                # moto's server ("Status Code: 100", its answer to Expect: 100-continue);
                # the plain path writes them through the sync client like any other file.
                "spark.hadoop.fs.s3a.optimized.copy.from.local.enabled": "false",
            }
        )
    return settings


def _jars_file(coordinates: str) -> Path:
    """Where the jars resolved for these Maven coordinates are listed."""
    digest = hashlib.sha256(coordinates.encode()).hexdigest()[:16]
    return lookout_cache() / f"spark-jars-{digest}.txt"


def resolved_jars(coordinates: str) -> list[str] | None:
    """The local jars an earlier start resolved for ``coordinates`` (Delta's and the
    extra packages), if it listed them and they are all still there.

    Resolving packages runs Ivy at every start: 2.4 s of the engine's 8.5 s to a
    running session here, even with every jar in Ivy's cache; an engine restarted after
    a crash pays it while its backlog grows. The same jars named in ``spark.jars`` give
    the same classpath."""
    try:
        listed = _jars_file(coordinates).read_text().split(",")
    except OSError:
        return None
    paths = [urlparse(jar).path for jar in listed if jar]  # Spark lists file: URIs
    if not paths or not all(Path(jar).is_file() for jar in paths):
        return None
    return paths


def remember_jars(coordinates: str, jars: str) -> None:
    """List the jars Spark resolved for ``coordinates`` (its ``spark.jars`` after
    resolving them) for :func:`resolved_jars`; a cache that cannot be written is
    skipped (the next start resolves again)."""
    if not jars:
        return
    target = _jars_file(coordinates)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(jars)
        partial.replace(target)  # whole or not at all: test sessions start in parallel
    except OSError:
        return


def write_local_files_without_checksums(spark: SparkSession) -> None:
    """Have Hadoop's `file:` filesystem in this JVM (the driver's; in local mode also the
    executors') write no checksum files.

    Its checksummed output stream writes a `.crc` beside every checkpoint file, and its
    close gives up at a failed flush without closing either file: on a full disk the
    state store then deletes its half-written changelog while the JVM still holds it
    open, so its space stays taken (and the disk cannot be remounted read-only) until a
    garbage collection happens to reach the stream. Without checksums the file is
    Hadoop's raw one, whose close closes it whatever its flush did. (The raw filesystem
    cannot be `fs.file.impl` itself: Hadoop casts the `file:` filesystem to the
    checksummed class where the state store copies its local files.)"""
    jvm: Any = spark.sparkContext._jvm
    hadoop_fs = jvm.org.apache.hadoop.fs
    local = hadoop_fs.FileSystem.getLocal(spark.sparkContext._jsc.hadoopConfiguration())
    local.setWriteChecksum(False)


def maven_coordinates(s3: S3Config | None) -> str:
    """The Maven coordinates of the jars the session adds to Spark's: Delta's for this
    pyspark, and hadoop-aws's with `s3`."""
    from delta import configure_spark_with_delta_pip

    packages = [] if s3 is None else [f"org.apache.hadoop:hadoop-aws:{hadoop_version()}"]
    # Delta's helper sets only `spark.jars.packages`, read here from a spare builder.
    return str(
        configure_spark_with_delta_pip(SparkSession.builder, packages)._options[
            "spark.jars.packages"
        ]
    )


def driver_archive(s3: S3Config | None) -> Path:
    """Where the driver JVM's class archive is (or goes) for the jars a session with
    `s3` (or without) starts with: Spark's, and those resolved for its packages."""
    coordinates = maven_coordinates(s3)
    return archive_path(coordinates, resolved_jars(coordinates) or ())


def build_session(
    config: EngineConfig,
    app_name: str = "lookout",
    s3: S3Config | None = None,
    record_classes: Path | None = None,
) -> SparkSession:
    """Create (or return the running) SparkSession with Delta and the state store set up;
    with `s3`, able to read and checkpoint on S3 as `[s3]` says. The driver's JVM maps
    the class archive recorded for its jars, if there is one, or with `record_classes`
    writes one there as it exits (`engine.spark.class_archive`)."""
    coordinates = maven_coordinates(s3)
    jars = resolved_jars(coordinates)
    classes = (
        sharing_option(coordinates, jars or ())
        if record_classes is None
        else recording_options(record_classes)
    )
    # Spark otherwise picks the host's first non-loopback address; we stay on 127.0.0.1.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must be this interpreter (the venv), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # ... and import pyspark with its bytecode (engine/spark/spark_home.py).
    os.environ["SPARK_HOME"] = str(spark_home())
    builder = (
        SparkSession.builder.master(config.master)
        .appName(app_name)
        .config("spark.driver.memory", config.driver_memory)
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
        # The JVM's heap resident from its start: otherwise its memory grows for many
        # minutes as the garbage collector first touches pages it committed long before
        # (at 20k readings/s, 939 -> 1,106 MB from minute 2 to minute 5; pre-touched
        # 1,115 -> 1,152 MB, the same at the end), which hides a real leak's growth.
        .config("spark.driver.extraJavaOptions", driver_jvm_options(config.driver_memory, classes))
        .config("spark.executor.extraJavaOptions", JVM_OPTIONS)
        # What Spark keeps of finished jobs, stages, tasks and SQL executions for its UI,
        # kept even with the UI off: a micro-batch each is several, and at the default
        # caps (1,000 each, 100,000 tasks) they held 67 MB more of the driver's heap
        # after 2.5 more minutes at 20k readings/s; with these, its live heap is flat.
        # The engine's figures come from the query's progress reports.
        .config("spark.ui.retainedJobs", "50")
        .config("spark.ui.retainedStages", "50")
        .config("spark.ui.retainedTasks", "1000")
        .config("spark.sql.ui.retainedExecutions", "50")
        .config("spark.ui.dagGraph.retainedRootRDDs", "50")
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
        # State goes to the Python worker in messages of this many entries (default
        # 10,000: a whole map of window slices in one message, megabytes each).
        .config(
            "spark.sql.execution.arrow.transformWithStateInPySpark.maxStateRecordsPerBatch", "256"
        )
    )
    if s3 is not None:
        for key, value in s3a_settings(s3).items():
            builder = builder.config(key, value)
    if jars is not None:
        builder = builder.config("spark.jars", ",".join(jars))
    else:
        builder = builder.config("spark.jars.packages", coordinates)
    spark = builder.getOrCreate()
    if jars is None:
        remember_jars(coordinates, spark.conf.get("spark.jars", "") or "")
    spark.sparkContext.setLogLevel("ERROR")
    write_local_files_without_checksums(spark)
    if s3 is not None and s3.access_key:
        # Set on the running session, not the builder: pyspark passes every builder
        # setting to spark-submit as `--conf key=value`, which any local user can read
        # in the process list. Jobs and state stores get this configuration from the
        # driver, so executors on a cluster receive the keys too.
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        hadoop.set("fs.s3a.access.key", s3.access_key)
        hadoop.set("fs.s3a.secret.key", s3.secret_key)
    return spark
