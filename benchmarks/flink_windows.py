"""Sliding windows on Flink: PyFlink SQL's HOP window TVF over the Spark benchmark's rows.

The peer for "average speed per station over 15 minutes" as Flink SQL in
streaming mode, event time with a 2-second watermark, parallelism 2 (Spark gets
`local[2]`), over the Parquet file that `benchmarks/spark_windows.py` writes (columns
`station` INT, `speed` DOUBLE, `ts` TIMESTAMP(us, UTC)):

    SELECT station, window_start, window_end, avg(speed)
    FROM TABLE(HOP(TABLE readings, DESCRIPTOR(et), INTERVAL 'slide' SECOND,
                   INTERVAL '15' MINUTE))
    GROUP BY window_start, window_end, station

and TUMBLE for the 15-minute tumble. Per slide, a check run writes the windows to CSV
and compares them with an oracle computed here from the same rows (the windows holding
at least one reading, and a brute-force average of a sample of them); then the timed
run writes to the `blackhole` sink, after one untimed job that warms the JVM. The time
is wall time from job submit to finish (planning, PyFlink's local cluster, the run), with
the job's own net runtime and the JVM's CPU seconds beside it (rows per CPU second
moves less than the wall rate when other work shares the 2 cores).

Runs in its own virtualenv (apache-flink pins its own numpy/pandas/pyarrow), with the
Parquet format's jars in `<venv>/jars` (`benchmarks/flink_setup.sh` makes both):

    .flink-venv/bin/python benchmarks/flink_windows.py --input rows.parquet \
        [--slides 60 10 1 900] [--repeat 3] [--no-check] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

if TYPE_CHECKING:  # pyflink is in the Flink virtualenv only
    from pyflink.table import TableEnvironment

RANGE_S = 900  # 15 minutes
RESULT_TAG = "FLINK_RESULTS "  # starts the --json line (per slide seconds), for flink_peer.py
SAMPLE = 200  # windows whose average is recomputed by brute force in the check run


def window_count(station: np.ndarray, ts_ms: np.ndarray, slide_ms: int, range_ms: int) -> int:
    """The oracle's window count: (station, end) pairs, `end` on the slide grid, whose
    window [end - range, end) holds at least one reading.

    A reading at t lies in the windows whose end is in (t, t + range]: grid indices
    t // slide + 1 .. (t + range) // slide. Per station, over its sorted readings, those
    index intervals only move forward, so their union is counted interval by interval."""
    total = 0
    for s in np.unique(station):
        t = np.sort(ts_ms[station == s])
        lo = t // slide_ms + 1
        hi = (t + range_ms) // slide_ms
        prev_hi = np.concatenate([[lo[0] - 1], np.maximum.accumulate(hi)[:-1]])
        total += int(np.clip(hi - np.maximum(lo, prev_hi + 1) + 1, 0, None).sum())
    return total


def brute_force_average(
    station: np.ndarray, ts_ms: np.ndarray, speed: np.ndarray, key: int, end_ms: int
) -> float:
    """The average speed of `key`'s readings in [end - 15 min, end), by a full scan."""
    mask = (station == key) & (ts_ms >= end_ms - RANGE_S * 1000) & (ts_ms < end_ms)
    return float(speed[mask].mean())


def interval(seconds: int) -> str:
    """A SQL interval literal (SECOND holds two digits only)."""
    if seconds % 60 == 0:
        return f"INTERVAL '{seconds // 60}' MINUTE"
    return f"INTERVAL '{seconds}' SECOND"


def window_sql(slide_s: int) -> str:
    """The windowed average: HOP for a slide shorter than the range, else TUMBLE."""
    if slide_s == RANGE_S:
        tvf = f"TUMBLE(TABLE readings, DESCRIPTOR(et), {interval(RANGE_S)})"
    else:
        tvf = f"HOP(TABLE readings, DESCRIPTOR(et), {interval(slide_s)}, {interval(RANGE_S)})"
    return (
        "SELECT station, window_start, window_end, AVG(speed) AS avg_speed "
        f"FROM TABLE({tvf}) GROUP BY window_start, window_end, station"
    )


def table_env(parquet: Path, jars: Path, checkpoint_s: int | None) -> TableEnvironment:
    """A streaming TableEnvironment at parallelism 2 with `readings` over `parquet`.

    `checkpoint_s`: the filesystem sink commits its files on checkpoints, so the check
    run needs them; the timed run (blackhole sink) has none."""
    from pyflink.table import EnvironmentSettings, TableEnvironment

    jar_files = sorted(jars.glob("*.jar"))
    if not jar_files:
        sys.exit(f"no jars in {jars}: run benchmarks/flink_setup.sh (needs flink-sql-parquet)")
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("pipeline.jars", ";".join(p.as_uri() for p in jar_files))
    config.set("parallelism.default", "2")
    config.set("table.local-time-zone", "UTC")  # window grid on UTC, as Spark's
    if checkpoint_s:
        config.set("execution.checkpointing.interval", f"{checkpoint_s} s")
    # Watermarks need TIMESTAMP(3) or TIMESTAMP_LTZ(3); the file holds microseconds.
    env.execute_sql(f"""
        CREATE TABLE readings (
          station INT, speed DOUBLE, ts TIMESTAMP_LTZ(6),
          et AS CAST(ts AS TIMESTAMP_LTZ(3)),
          WATERMARK FOR et AS et - INTERVAL '2' SECOND
        ) WITH ('connector' = 'filesystem', 'path' = '{parquet.as_uri()}',
                'format' = 'parquet')""")
    return env


def jvm_cpu_seconds() -> float:
    """CPU seconds of this process's children: the gateway JVM, which runs the local
    MiniCluster (py4j cannot reach the JVM's own CPU-time bean)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # after "(comm)": state ppid ... utime stime (fields 4 and 14-15 of stat)
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[1]) == os.getpid():
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def timed_run(parquet: Path, jars: Path, slide_s: int) -> dict[str, float]:
    """Wall seconds from submit to finish of the window query into `blackhole`, with the
    job's net runtime and the JVM CPU seconds it took."""
    env = table_env(parquet, jars, checkpoint_s=None)
    env.execute_sql("""CREATE TABLE nothing (station INT, window_start TIMESTAMP(3),
        window_end TIMESTAMP(3), avg_speed DOUBLE) WITH ('connector' = 'blackhole')""")
    cpu0 = jvm_cpu_seconds()
    t0 = time.perf_counter()
    result = env.execute_sql(f"INSERT INTO nothing {window_sql(slide_s)}")
    job = result.get_job_client().get_job_execution_result().result()
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "net_seconds": job.get_net_runtime() / 1000,
        "cpu_seconds": jvm_cpu_seconds() - cpu0,
    }


def check_run(parquet: Path, jars: Path, slide_s: int, rows: pa.Table) -> tuple[int, int]:
    """Run the window query into CSV and compare it with the oracle: the same number of
    windows, no (station, end) twice, and `SAMPLE` averages recomputed by brute force.
    Returns (Flink's windows, the oracle's)."""
    out = Path(tempfile.mkdtemp(prefix="flink-windows-"))
    try:
        env = table_env(parquet, jars, checkpoint_s=2)
        env.execute_sql(f"""CREATE TABLE windows (station INT, window_end STRING,
            avg_speed DOUBLE) WITH ('connector' = 'filesystem', 'path' = '{out.as_uri()}',
            'format' = 'csv')""")
        query = (
            f"SELECT station, CAST(window_end AS STRING), avg_speed FROM ({window_sql(slide_s)})"
        )
        env.execute_sql(f"INSERT INTO windows {query}").wait()
        got = read_windows(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    station = rows["station"].to_numpy()
    ts_ms = rows["ts"].cast(pa.int64()).to_numpy() // 1000  # us -> ms
    speed = rows["speed"].to_numpy()
    expected = window_count(station, ts_ms, slide_s * 1000, RANGE_S * 1000)
    keys = set(zip(got["station"].to_pylist(), got["end_ms"].to_pylist(), strict=True))
    if len(keys) != got.num_rows:
        sys.exit(f"slide {slide_s} s: Flink gave {got.num_rows - len(keys)} windows twice")
    sample = np.random.default_rng(7).choice(got.num_rows, min(SAMPLE, got.num_rows), False)
    for i in sample.tolist():
        key, end, avg = (got[c][i].as_py() for c in ("station", "end_ms", "avg_speed"))
        want = brute_force_average(station, ts_ms, speed, key, end)
        if not math.isclose(avg, want, rel_tol=1e-9):
            sys.exit(f"slide {slide_s} s: station {key} window ending {end} ms: "
                     f"Flink {avg}, brute force {want}")  # fmt: skip
    return got.num_rows, expected


def read_windows(folder: Path) -> pa.Table:
    """The check run's CSV part files as (station, end_ms, avg_speed)."""
    names = ["station", "window_end", "avg_speed"]
    options = pacsv.ConvertOptions(
        column_types={"station": pa.int32(), "window_end": pa.timestamp("ms"),
                      "avg_speed": pa.float64()})  # fmt: skip
    parts = [p for p in folder.rglob("*") if p.is_file() and p.stat().st_size]
    if not parts:
        sys.exit(f"the check run wrote no windows to {folder}")
    tables = [
        pacsv.read_csv(p, pacsv.ReadOptions(column_names=names), convert_options=options)
        for p in parts
    ]
    table = pa.concat_tables(tables)
    return pa.table({
        "station": table["station"],
        "end_ms": table["window_end"].cast(pa.int64()),
        "avg_speed": table["avg_speed"],
    })  # fmt: skip


def label(slide_s: int) -> str:
    """The row label spark_windows.py prints for this slide."""
    if slide_s == RANGE_S:
        return "tumble"
    if slide_s % 60 == 0:
        return f"{slide_s // 60} minute" + ("s" if slide_s > 60 else "")
    return f"{slide_s} second" + ("s" if slide_s > 1 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", type=Path, required=True, help="Parquet readings")
    parser.add_argument("--slides", type=int, nargs="+", default=[60, 10, 1, RANGE_S],
                        help=f"slides in seconds; {RANGE_S} = the 15-minute tumble")  # fmt: skip
    parser.add_argument("--jars", type=Path, default=Path(sys.prefix) / "jars")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per slide (median)")
    parser.add_argument("--no-check", action="store_true", help="timed runs only")
    parser.add_argument("--json", action="store_true", help=f"end with a {RESULT_TAG!r}line")
    args = parser.parse_args()
    for slide_s in args.slides:
        if slide_s <= 0 or RANGE_S % slide_s:
            parser.error(f"--slides: {slide_s} s does not divide the 15-minute range")

    import pyflink

    parquet = args.input.resolve()
    rows = pq.read_table(parquet, columns=["station", "speed", "ts"])
    print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}")
    print(f"PyFlink {pyflink.version.__version__}, parallelism 2, streaming mode")
    print(f"{rows.num_rows:,} readings from {parquet}")
    # A cold JVM (class loading, JIT) made the first job ~2x slower: one untimed job first.
    timed_run(parquet, args.jars, RANGE_S)
    results = {}
    for slide_s in args.slides:
        name = label(slide_s)
        windows = expected = None
        if not args.no_check:
            windows, expected = check_run(parquet, args.jars, slide_s, rows)
            if windows != expected:
                sys.exit(f"slide {name}: Flink gave {windows:,} windows, the oracle {expected:,}")
        runs = [timed_run(parquet, args.jars, slide_s) for _ in range(args.repeat)]
        run = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
        rate = rows.num_rows / run["seconds"]
        check = "" if windows is None else f", {windows:,} windows (oracle {expected:,})"
        print(f"  Flink SQL {'TUMBLE' if slide_s == RANGE_S else 'HOP'} {name:<10} "
              f"{rows.num_rows:>9,} rows {run['seconds']:7.1f} s {rate:>10,.0f} rows/s "
              f"(net {run['net_seconds']:.1f} s, JVM CPU {run['cpu_seconds']:.1f} s: "
              f"{rows.num_rows / run['cpu_seconds']:,.0f} rows/CPU-s)"
              f"{check}", flush=True)  # fmt: skip
        results[str(slide_s)] = {"label": name, "rows": rows.num_rows, "rate": rate,
                                 "windows": windows, "oracle_windows": expected, **run}  # fmt: skip
    if args.json:
        print(RESULT_TAG + json.dumps(results))


if __name__ == "__main__":
    main()
