"""What Spark's Delta streaming source costs per micro-batch on a table delta-rs writes,
with and without version checksums (`_delta_log/<v>.crc`, `engine.tables.write_checksum`).

Delta takes each new version's protocol and metadata from its checksum when there is one
(`readProtocolAndMetadataFromChecksum`); delta-rs writes none, and without it every
batch that finds a new version runs a Spark job over the log to reconstruct them. This
script appends four one-row commits a second to a fresh table (as the engine's writers
do, `engine.tables.append_once`, once with the checksum and once with a plain delta-rs
append) while a streaming query reads it with a 0.5 s trigger, and prints the medians of
the batches' phases over `--seconds` (the first 10 s left out: query start).

    python benchmarks/delta_source.py [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

import pyarrow as pa
from deltalake import write_deltalake

from engine.spark.session import build_session
from engine.tables import append_once, ensure_table
from lookout.config import EngineConfig

SCHEMA = pa.schema([("x", pa.int64())])
PHASES = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "triggerExecution")


def stream_batches(
    spark,
    path: str,
    checkpoint: str,
    append: Callable[[int], None],
    seconds: float,
    warmup_s: float,
) -> dict[str, float]:
    """Median of each phase of the batches of a Delta stream over `path` (trigger 0.5 s)
    while `append(i)` runs four times a second; the first batch and those of the next
    `warmup_s` seconds left out (query start), then `seconds` measured."""
    stop = threading.Event()

    def appends() -> None:
        i = 0
        while not stop.wait(0.25):
            append(i)
            i += 1

    appender = threading.Thread(target=appends)
    appender.start()
    query = (
        spark.readStream.format("delta")
        .load(path)
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    while not query.recentProgress:  # the first batch reads the table as it stands
        time.sleep(0.1)
    time.sleep(warmup_s)
    skip = len(query.recentProgress)
    time.sleep(seconds)
    stop.set()
    appender.join()
    progress = list(query.recentProgress)[skip:]
    query.stop()
    took = {k: statistics.median(p.durationMs.get(k, 0) for p in progress) for k in PHASES}
    return {"batches": len(progress), **took}


def batches(spark, path: str, checksums: bool, seconds: float) -> dict[str, float]:
    """`stream_batches` over a new table appended as the engine does (`append_once`, with
    checksums), or with plain delta-rs appends."""
    ensure_table(path, SCHEMA)

    def append(i: int) -> None:
        if checksums:
            append_once(path, SCHEMA, [{"x": i}], "bench", i)
        else:
            write_deltalake(path, pa.table({"x": pa.array([i], pa.int64())}), mode="append")

    return stream_batches(spark, path, f"{path}-checkpoint", append, seconds, warmup_s=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    spark = build_session(EngineConfig(), "delta-source-bench")
    work = tempfile.mkdtemp(prefix="lookout-delta-source-")
    try:
        print("| checksums | batches | " + " | ".join(f"{p} (median)" for p in PHASES) + " |")
        print("|---|---:|" + "---:|" * len(PHASES))
        for checksums in (False, True):
            got = batches(spark, f"{work}/t-{checksums}", checksums, args.seconds)
            cells = " | ".join(f"{got[p]:.0f} ms" for p in PHASES)
            print(f"| {'yes' if checksums else 'no'} | {got['batches']} | {cells} |", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
