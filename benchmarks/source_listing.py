"""What a growing folder costs the engine's streaming sources, which list theirs whole
every micro-batch on a local or shared filesystem, and what the engine's cleanups give
back: a table's `_delta_log` (the rules queries' Delta sources; `clean_log` in
`engine/maintenance.py`) and the landing folder (the landing query's source, which
removes committed files).

**Delta log.**
The engine appends about two commits a second to each table it writes, and a rules
query's Delta source lists the table's whole `_delta_log` folder in every micro-batch
(on a local or shared filesystem). For each log length N this script builds a table of
N commits ending in a checkpoint, then runs a streaming query over it for `--seconds`
while another thread appends four commits a second, and prints the median
`latestOffset` of its batches and the time delta-rs takes to open the table; then it
cleans the log as the engine does (no reader behind: everything below the newest
checkpoint) and measures again.

The N commits are copies of one real append commit (the same file added again, which a
Delta reader reconciles to one file), written directly: building 30,000 commits by real
appends would take most of an hour. `--real` builds them by appends instead.

**Landing folder.** For each file count N, N one-line landing files, then a stream over
the folder: Spark's file source with or without `cleanSource = delete`, and Lookout's
landing source (`engine/spark/landing_source.py`), which the landing query reads; once
the N files are read (in one batch by the file source, 40 a batch by Lookout's), four
new files a second for `--seconds`, and the median and highest `latestOffset` of the
batches after that. Lookout's source is a
simple reader: its `latestOffset` also reads the batch's new files (Spark's sources
read theirs later, in tasks).

    python benchmarks/source_listing.py [--commits 300 3000 30000] [--files 2000 20000]
        [--seconds 30] [--real]
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
from pathlib import Path

import pyarrow as pa
from delta_source import stream_batches
from deltalake import DeltaTable, write_deltalake

from engine.maintenance import clean_log
from engine.spark.landing_source import LandingSource, source_options
from engine.spark.session import build_session
from lookout.config import EngineConfig, S3Config


def build(path: str, commits: int, real: bool) -> None:
    """A table of `commits` commits (versions 0 .. commits - 1), checkpointed at the end."""
    for i in range(2 if not real else commits):
        write_deltalake(path, pa.table({"x": pa.array([i], pa.int64())}), mode="append")
    if not real:
        log = Path(path, "_delta_log")
        commit = (log / f"{1:020d}.json").read_bytes()
        for version in range(2, commits):
            (log / f"{version:020d}.json").write_bytes(commit)
    DeltaTable(path).create_checkpoint()


def open_ms(path: str, times: int = 5) -> float:
    """Median time delta-rs takes to open the table at its latest version."""
    took = []
    for _ in range(times):
        started = time.perf_counter()
        DeltaTable(path)
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took)


def latest_offset_ms(spark, path: str, work: str, seconds: float) -> float:
    """Median `latestOffset` of a Delta streaming query over the table while delta-rs
    appends go on, four a second (the first 3 s left out: query start)."""

    def append(i: int) -> None:
        write_deltalake(path, pa.table({"x": pa.array([i], pa.int64())}), mode="append")

    checkpoint = f"{work}/checkpoint-{time.monotonic_ns()}"
    return stream_batches(spark, path, checkpoint, append, seconds, warmup_s=3)["latestOffset"]


LINE = b'{"station": 1, "speed": 3.0, "ts": 1767225600000, "source": "s", "seq": 1}\n'


def landing_stream(spark, source: str, landing: str):
    """A streaming read of `landing`: Spark's file source keeping its files (`kept`) or
    deleting committed ones (`deleted`), or Lookout's landing source (`lookout`)."""
    if source == "lookout":
        spark.dataSource.register(LandingSource)
        options = source_options(landing, "", S3Config())
        return spark.readStream.format(LandingSource.name()).options(**options).load()
    clean = {"kept": "off", "deleted": "delete"}[source]
    reader = spark.readStream.format("text").schema("value STRING, stream STRING")
    return reader.option("cleanSource", clean).load(landing)


def landing_ms(
    spark, files: int, source: str, work: str, seconds: float
) -> tuple[float, float, int]:
    """Median and highest `latestOffset` of a landing stream (`landing_stream`) over a
    folder of `files` files, four more landed a second, and how many files are left in
    the folder. With Spark's file source the highest is a batch that compacts the
    source's own record of every file it has read (every tenth batch), which grows with
    the files read whatever the cleanup."""
    folder = Path(work, f"landing-{source}-{files}", "stream=traffic")
    folder.mkdir(parents=True)
    for i in range(files):
        (folder / f"part-{i:019d}-0-x-0.jsonl").write_bytes(LINE)
    stop = threading.Event()

    def land() -> None:
        i = files
        while not stop.wait(0.25):
            (folder / ".part.tmp").write_bytes(LINE)
            (folder / ".part.tmp").rename(folder / f"part-{i:019d}-0-x-0.jsonl")
            i += 1

    query = (
        landing_stream(spark, source, str(folder.parent))
        .writeStream.format("noop")
        .option("checkpointLocation", f"{work}/checkpoint-{time.monotonic_ns()}")
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    read: dict[int, int] = {}  # rows per batch id (recentProgress keeps the last 100)
    while sum(read.values()) < files:
        time.sleep(0.5)
        read.update({p.batchId: p.numInputRows or 0 for p in query.recentProgress})
    backlog_done = max(read)  # and the batch after it, which may be running as landing starts
    lander = threading.Thread(target=land)
    lander.start()
    time.sleep(seconds)
    stop.set()
    lander.join()
    progress = list(query.recentProgress)
    query.stop()
    took = [
        t
        for p in progress
        if p.batchId > backlog_done + 1 and (t := p.durationMs.get("latestOffset")) is not None
    ]
    left = len(list(folder.glob("part-*")))
    shutil.rmtree(folder.parent)
    return statistics.median(took), max(took), left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, nargs="*", default=[300, 3000, 30000])
    parser.add_argument("--files", type=int, nargs="*", default=[2000, 20000])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--real", action="store_true", help="build the log by real appends")
    args = parser.parse_args()
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    spark = build_session(EngineConfig(), "source-listing-bench")
    work = tempfile.mkdtemp(prefix="lookout-source-listing-")
    try:
        columns = ["log files", "latestOffset", "delta-rs open", "cleaned"]
        columns += ["latestOffset after", "open after"]
        print("| " + " | ".join(columns) + " |")
        print("|" + "---:|" * len(columns))
        for commits in args.commits:
            path = f"{work}/t{commits}"
            build(path, commits, args.real)
            before = latest_offset_ms(spark, path, work, args.seconds), open_ms(path)
            DeltaTable(path).create_checkpoint()
            cleaned = clean_log(DeltaTable(path), None, settle_s=0)
            after = latest_offset_ms(spark, path, work, args.seconds), open_ms(path)
            print(
                f"| {commits:,} | {before[0]:.0f} ms | {before[1]:.0f} ms | {cleaned:,} "
                f"| {after[0]:.0f} ms | {after[1]:.0f} ms |",
                flush=True,
            )
            shutil.rmtree(path)
        sources = ["kept", "deleted", "lookout"]
        print(
            "\n| landing files | latestOffset median (max), files left: file source, "
            "kept | file source, deleted | Lookout's landing source |"
        )
        print("|---:|---:|---:|---:|")
        for files in args.files:
            row = f"| {files:,} "
            for source in sources:
                median, most, left = landing_ms(spark, files, source, work, args.seconds)
                row += f"| {median:.0f} ms ({most:.0f}; {left:,}) "
            print(row + "|", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
