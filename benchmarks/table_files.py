"""What small files cost a lakehouse table, and what compaction gives back.

Every micro-batch appends a small file to each table it writes (about two a second per
table under load, some 170,000 a day). This builds Delta tables of `--files` one-row
Parquet files (the files written with pyarrow, listed in one commit: the state a day of
appends leaves, without a day of waiting), then times, with delta-rs as the engine's
writers use it:

* opening the table (`DeltaTable(path)`: what `append_once` does per append),
* one append through an open table,

before and after `engine.maintenance.compact` (OPTIMIZE + checkpoint), and the
compaction itself. Medians of `--repeat` tries.

With `--appends N` it appends N one-file commits in a row the way the engine's driver
commits a batch (`engine.tables.commit_files` through its open tables, on a table made
by `ensure_table`: a checkpoint every 10 commits), and prints the CPU of the process
per append, in runs of `--every` appends, as the table's files grow.

    python benchmarks/table_files.py [--files 10000 40000 80000] [--repeat 5]
    python benchmarks/table_files.py --appends 1200 [--every 200]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from engine.maintenance import compact
from engine.tables import OpenTables, commit_files, ensure_table, write_data_file

SCHEMA = pa.schema([("station", pa.int64()), ("ts", pa.int64())])


def small_file_table(path: Path, files: int) -> None:
    """A Delta table of `files` one-row Parquet files, added in one commit."""
    write_deltalake(str(path), SCHEMA.empty_table(), mode="append")
    now = int(time.time() * 1000)
    lines = [orjson.dumps({"commitInfo": {"timestamp": now, "operation": "WRITE"}})]
    for i in range(files):
        name = f"part-{i:06d}-{uuid.uuid4()}.parquet"
        pq.write_table(pa.table({"station": [i], "ts": [i]}, schema=SCHEMA), path / name)
        values = {"station": i, "ts": i}
        stats = {"numRecords": 1, "minValues": values, "maxValues": values,
                 "nullCount": {"station": 0, "ts": 0}}  # fmt: skip
        add = {"path": name, "partitionValues": {}, "size": (path / name).stat().st_size,
               "modificationTime": now, "dataChange": True,
               "stats": orjson.dumps(stats).decode()}  # fmt: skip
        lines.append(orjson.dumps({"add": add}))
    (path / "_delta_log" / f"{1:020d}.json").write_bytes(b"\n".join(lines) + b"\n")
    DeltaTable(str(path)).create_checkpoint()  # as delta-rs does every 100 commits


def median_ms(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def costs(path: str, repeat: int) -> tuple[float, float]:
    """Median ms to open the table, and to append one row through an open table."""
    table = DeltaTable(path)
    row = pa.table({"station": [0], "ts": [0]}, schema=SCHEMA)
    return (
        median_ms(lambda: DeltaTable(path), repeat),
        median_ms(lambda: write_deltalake(table, row, mode="append"), repeat),
    )


def engine_appends(appends: int, every: int) -> None:
    """CPU per append of one 100-row file, the engine's way, in runs of `every`."""
    work = Path(tempfile.mkdtemp(prefix="lookout-appends-"))
    try:
        path = str(work / "readings_traffic")
        ensure_table(path, SCHEMA)
        opened = OpenTables()
        rows = pa.table({"station": list(range(100)), "ts": list(range(100))}, schema=SCHEMA)
        print("| appends | files in the table | CPU per append: mean | median | max |")
        print("|---:|---:|---:|---:|---:|")
        cpu: list[float] = []
        for batch in range(appends):
            file = write_data_file("readings_traffic", path, rows, batch_id=batch)
            started = time.process_time()
            commit_files(path, SCHEMA, [file], "lookout-benchmark", batch, opened=opened)
            cpu.append((time.process_time() - started) * 1000)
            if len(cpu) == every or batch == appends - 1:
                print(f"| {batch + 2 - len(cpu):,}-{batch + 1:,} | {batch + 1:,} | "
                      f"{statistics.mean(cpu):.1f} ms | {statistics.median(cpu):.1f} ms | "
                      f"{max(cpu):.1f} ms |", flush=True)  # fmt: skip
                cpu = []
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, nargs="+", default=[10_000, 40_000, 80_000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--appends", type=int, help="append this many files the engine's way")
    parser.add_argument("--every", type=int, default=200, help="with --appends: a row per")
    args = parser.parse_args()
    print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}")
    if args.appends:
        engine_appends(args.appends, args.every)
        return
    print("| files | open | append | compaction (+ checkpoint) | open after | append after |")
    print("|---:|---:|---:|---:|---:|---:|")
    for files in args.files:
        work = Path(tempfile.mkdtemp(prefix="lookout-files-"))
        try:
            path = work / "readings_traffic"
            small_file_table(path, files)
            open_ms, append_ms = costs(str(path), args.repeat)
            done = compact(DeltaTable(str(path)), min_files=2)
            assert done is not None and done.files_removed >= files
            open_after, append_after = costs(str(path), args.repeat)
            print(f"| {files:,} | {open_ms:.0f} ms | {append_ms:.0f} ms | {done.seconds:.1f} s | "
                  f"{open_after:.0f} ms | {append_after:.0f} ms |", flush=True)  # fmt: skip
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
