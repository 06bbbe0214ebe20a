"""Sliding windows on Spark: Lookout's runtime against Spark's own `window()`, one run.

The input: readings of `--stations` stations, `--rows` in all, 50 ms apart
in event time. Each window is "average speed per station over 15 minutes", as

* Spark: `groupBy(window(ts, '15 minutes', slide), station).avg(speed)`, a batch job
  over the rows in Parquet, written to the `noop` sink (Spark's best case: no stream,
  no state store);
* Lookout: the same extents (WID, `FROM traffic [RANGE 15 MINUTES SLIDE s]
  GROUP BY station`) run by the live runtime (`engine/spark/query.py`: landed files
  → parsed by the source's executors → the stateful step → the derived stream's Delta
  table), from the query's start until its table holds every window;
* Lookout's replay: `lookout replay --format parquet` over the same Parquet rows (the
  backfill and backtest path; one worker per core), timed as it reports, from reading
  the rows to its outputs written;

for slides of 1 minute, 10 s and 1 s, and the 15-minute tumble. Spark copies each row
into (range / slide) windows: at 1 s that is 900 copies per row, so its 1 s run takes
`--spark-1s-rows` rows only (the rate is per input row either way).

Every Lookout result (engine and replay) is checked against an independent evaluation
of the extents (prefix sums per station, numpy): same (station, window end) groups, same
averages (to 1e-9). Then one keyed active-expiration rule (the silent-detector pattern:
an alarm when a station sends nothing for 5 seconds) runs over the same rows with gaps
planted, checked against `engine.core.replay`.

    python benchmarks/spark_windows.py [--rows 2000000] [--stations 10]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from flink_peer import flink_rates

from engine.core.replay import run as replay
from engine.spark.job import EngineJob
from engine.spark.query import start_query
from engine.spark.session import build_session
from ingest.landing import LandingWriter
from lookout.config import Config, EngineConfig
from rules.language.loader import load_rules

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
STEP_MS = 50
SLIDES = [("1 minute", "1 MINUTE", 60), ("10 seconds", "10 SECONDS", 10),
          ("1 second", "1 SECOND", 1), ("tumble", None, 900)]  # fmt: skip
STREAM = """CREATE STREAM traffic (station INT, speed DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings';
"""


def readings(rows: int, stations: int, gaps: bool = False) -> pa.Table:
    """`rows` readings round-robin over the stations, 50 ms apart; with `gaps`, some
    stations fall silent for 6-20 s now and then (for the expiration rule)."""
    rng = random.Random(3)
    station, ts, speed, seq = [], [], [], []
    silent_until = [0] * stations
    for i in range(rows):
        t = START_MS + i * STEP_MS
        s = i % stations
        if gaps and silent_until[s] < t and rng.random() < 0.0005:
            silent_until[s] = t + rng.randint(6_000, 20_000)
        if silent_until[s] > t:
            continue
        station.append(s + 1)
        ts.append(t)
        speed.append(round(rng.uniform(5.0, 35.0), 3))
        seq.append(i)
    return pa.table(
        {
            "station": pa.array(station, pa.int32()),
            "speed": pa.array(speed, pa.float64()),
            "ts": pa.array(ts, pa.timestamp("ms")).cast(pa.timestamp("us", tz="UTC")),
            "seq": pa.array(seq, pa.int64()),
        }
    )


def fill_lakehouse(lakehouse: Path, data: pa.Table, rule_text: str) -> tuple[Config, object]:
    """A fresh lakehouse whose landing holds `data` as ingest lands it (files of 20,000
    readings, from messages of 20 as `pipeline_faults.py`'s simulator publishes them),
    then a heartbeat a day past the end (the final heartbeat: every window closes)."""
    shutil.rmtree(lakehouse, ignore_errors=True)
    config = Config(lakehouse=str(lakehouse), engine=EngineConfig())
    rules = lakehouse.parent / "bench.sql"
    rules.write_text(STREAM + rule_text)
    rule_set = load_rules([rules])
    writer = LandingWriter(config.landing, "bench")
    ts_ms = (data["ts"].cast(pa.int64()).to_numpy() // 1000).tolist()
    rows = [
        {"station": st, "speed": v, "ts": t, "source": "bench", "seq": q}
        for st, v, t, q in zip(data["station"].to_pylist(), data["speed"].to_pylist(), ts_ms,
                               data["seq"].to_pylist(), strict=True)
    ]  # fmt: skip
    for offset in range(0, len(rows), 20_000):
        for message in range(offset, min(offset + 20_000, len(rows)), 20):
            writer.add_readings("traffic", rows[message : message + 20], "bench", 0)
        writer.flush()
    writer.add_heartbeat("traffic", {"source": "bench", "ts": ts_ms[-1] + 86_400_000}, 0)
    writer.flush()
    return config, rule_set


STALL_S = 180.0
"""A run whose sink gains no row for this long has stalled (e.g. its windows never close)."""


def run_lookout(spark, config: Config, rule_set, sink: str, expected: int) -> float:
    """Seconds from the engine query's start until `sink` holds `expected` rows."""
    job = EngineJob(config, rule_set.plan, {}, spark=spark)
    job.ensure_tables()
    t0 = time.perf_counter()
    query, committer = start_query(spark, config, job.components)
    seen, since = -1, t0
    try:
        while True:
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            got = DeltaTable(config.table(sink)).count() if _exists(config, sink) else 0
            now = time.perf_counter()
            if got >= expected:
                return now - t0
            if got != seen:
                seen, since = got, now
            elif now - since > STALL_S:
                raise RuntimeError(
                    f"{sink} stalled at {got:,} of {expected:,} rows: no new row for "
                    f"{STALL_S:.0f} s (last batch: {query.lastProgress})"
                )
            time.sleep(0.2)
    finally:
        query.stop()
        committer.close()


def run_replay(parquet: str, rule_text: str, work: Path, expected: dict) -> float:
    """Seconds `lookout replay` (a process of its own, one worker per core) takes from
    reading the rows to its outputs written as Parquet, as it reports them (the rules
    loaded and the interpreter's imports before that are not counted, as Flink's job is
    timed from its submission); its windows are checked against the oracle."""
    rules = work / "replay.sql"
    rules.write_text(STREAM + rule_text)
    out = work / "replay-out"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "lookout.cli", "replay", "--rules", str(rules), "--input",
               f"traffic={parquet}", "--out", str(out), "--format", "parquet"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"lookout replay failed ({done.returncode}): {done.stderr[-3000:]}")
    said = re.search(r"readings in ([0-9.]+) s", done.stderr)
    if said is None:
        raise RuntimeError(f"lookout replay said no time: {done.stderr[-1000:]}")
    rows = pq.read_table(out / "avg15.parquet").to_pylist()
    compare({(r["station"], int(r["window_end"].timestamp() * 1000)): r["avg_speed"]
             for r in rows}, expected, "replay avg15")  # fmt: skip
    return float(said.group(1))


def warm_up(
    spark, work: Path, slides: list[tuple[str, str | None, int]], full: pa.Table | None
) -> None:
    """Untimed Lookout runs right before the timed ones, as Flink's timed jobs follow an
    untimed job over all the rows and a check run of their own: one run of the tumble
    over `full`, the timed runs' rows (a process's first run over batches of a million
    readings took three times as long as later ones), then one run per window over a
    small input, so that a timed run pays neither for the JVM's JIT of its paths (a 1 s
    slide sends a million rows where the tumble sends a thousand) nor for the Python
    workers' imports. They come after Flink's jobs, which leave this process idle for a
    minute or more: the first timed run took twice as long right after them (the
    1-minute slide: 17.0 s, against 8.7 s in a run without Flink; this VM's kernel
    pages out memory left idle for a minute)."""
    small = readings(200_000, 10)
    runs = [("tumble", full, 900)] if full is not None else []
    runs += [(label, small, slide_s) for label, _, slide_s in slides]
    for label, data, slide_s in runs:
        work.mkdir(parents=True, exist_ok=True)
        config, rule_set = fill_lakehouse(work / "lakehouse", data, avg15_rule(slide_s))
        windows = len(extents(data, slide_s * 1000))
        seconds = run_lookout(spark, config, rule_set, "avg15", windows)
        print(f"warm-up: {label} over {data.num_rows:,} rows, {seconds:.1f} s (not counted)")
        shutil.rmtree(work, ignore_errors=True)


def avg15_rule(slide_s: int) -> str:
    """The benchmark's rule: the average speed per station over 15 minutes, sliding by
    `slide_s` seconds (900: the tumble)."""
    window = (
        "[RANGE 15 MINUTES]" if slide_s == 900 else f"[RANGE 15 MINUTES SLIDE {slide_s} SECONDS]"
    )
    return (
        "CREATE STREAM avg15 AS SELECT station, window_end, avg(speed) AS avg_speed "
        f"FROM traffic {window} GROUP BY station;\n"
    )


def _exists(config: Config, name: str) -> bool:
    return Path(config.table(name), "_delta_log").is_dir()


def spark_window_seconds(spark, parquet: str, slide: str | None) -> float:
    """Seconds Spark's window() takes over the Parquet rows, to the noop sink."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(parquet)
    window = F.window("ts", "15 minutes", slide) if slide else F.window("ts", "15 minutes")
    grouped = df.groupBy(window.alias("w"), "station").agg(F.avg("speed").alias("avg_speed"))
    t0 = time.perf_counter()
    grouped.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def extents(data: pa.Table, slide_ms: int, range_ms: int = 900_000) -> dict:
    """The oracle: avg speed per (station, window end) over [end - range, end), for every
    end on the slide grid whose window holds a reading (Spark's and WID's extents)."""
    station = data["station"].to_numpy()
    ts = data["ts"].cast(pa.int64()).to_numpy() // 1000  # us -> ms
    speed = data["speed"].to_numpy()
    out = {}
    for s in np.unique(station):
        t, v = ts[station == s], speed[station == s]
        prefix = np.concatenate([[0.0], np.cumsum(v)])
        # [end - range, end) holds t  <=>  t < end <= t + range
        ends = np.arange((t[0] // slide_ms + 1) * slide_ms, t[-1] + range_ms + 1, slide_ms)
        hi = np.searchsorted(t, ends, "left")
        lo = np.searchsorted(t, ends - range_ms, "left")
        n = hi - lo
        avg = (prefix[hi] - prefix[lo]) / np.maximum(n, 1)
        for end, count, a in zip(ends.tolist(), n.tolist(), avg.tolist(), strict=True):
            if count:
                out[(int(s), end)] = a
    return out


def check(config: Config, sink: str, expected: dict) -> None:
    """Lookout's windows equal the oracle's: same groups, same averages."""
    rows = DeltaTable(config.table(sink)).to_pyarrow_table().to_pylist()
    ours = {(r["station"], int(r["window_end"].timestamp() * 1000)): r["avg_speed"] for r in rows}
    compare(ours, expected, sink)


def compare(ours: dict, expected: dict, name: str) -> None:
    """The same (station, window end) groups as the oracle's, the same averages."""
    assert ours.keys() == expected.keys(), f"{name}: {len(ours)} windows, oracle {len(expected)}"
    bad = [k for k, v in ours.items() if not math.isclose(v, expected[k], rel_tol=1e-9)]
    assert not bad, f"{name}: {len(bad)} averages differ, e.g. {bad[:3]}"


def timed(label: str, rows: int, fn: Callable[..., float], *args: object) -> float:
    """Run `fn(*args)` (it returns the seconds it measured) and print the rate."""
    seconds = fn(*args)
    rate = rows / seconds
    print(f"  {label:<44} {rows:>9,} rows {seconds:8.1f} s {rate:>11,.0f} rows/s", flush=True)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--stations", type=int, default=10)
    parser.add_argument("--spark-1s-rows", type=int, default=100_000)
    parser.add_argument("--only", choices=["windows", "expiration"], default=None)
    parser.add_argument("--slides", nargs="+", choices=[s[0] for s in SLIDES], default=None)
    parser.add_argument("--flink-python", default=None, help="the Flink venv's python")
    args = parser.parse_args()
    slides = [s for s in SLIDES if args.slides is None or s[0] in args.slides]

    work = Path(tempfile.mkdtemp(prefix="lookout-bench-"))
    spark = build_session(EngineConfig(), "lookout-bench")
    print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}")
    print(f"Spark {spark.version}, master {spark.sparkContext.master}, "
          f"{spark.conf.get('spark.sql.shuffle.partitions')} shuffle partitions")  # fmt: skip
    results: dict[str, tuple[float, float, float]] = {}
    flink: dict[str, float] = {}
    windows = args.only in (None, "windows")
    data = readings(args.rows, args.stations) if windows else None
    try:
        if data is not None:
            parquet = str(work / "rows.parquet")
            pq.write_table(data, parquet)
            small = str(work / "rows-small.parquet")
            pq.write_table(data.slice(0, args.spark_1s_rows), small)
            print(f"{data.num_rows:,} readings, {args.stations} stations, avg per station "
                  "over 15 minutes")  # fmt: skip
            print("PyFlink SQL HOP (TUMBLE) over the same Parquet rows:")
            flink = flink_rates(parquet, [(label, s) for label, _, s in slides], args.flink_python)
            # Spark's own jobs run in Lookout's JVM: before Lookout's warm-up, so that
            # their garbage (the 1 s slide's job copies each row into 900 windows for
            # 100 s) is collected before Lookout's timed runs, not during one of them
            # (Lookout's 1 s slide right after that job: 11.1 s; before it, 7.6 s).
            spark_rates: dict[str, float] = {}
            for label, spark_slide, slide_s in slides:
                print(f"slide {label}:")
                few = slide_s == 1
                spark_rates[label] = timed(
                    "Spark window()",
                    args.spark_1s_rows if few else data.num_rows,
                    spark_window_seconds,
                    spark,
                    small if few else parquet,
                    spark_slide and spark_slide.lower(),
                )
        # Right before the timed runs, after Flink's: see warm_up.
        warm_up(spark, work / "warm-up", slides if windows else SLIDES[-1:], data)
        if data is not None:
            for label, _, slide_s in slides:
                print(f"slide {label}:")
                spark_rate = spark_rates[label]
                expected = extents(data, slide_s * 1000)
                config, rule_set = fill_lakehouse(work / "lakehouse", data, avg15_rule(slide_s))
                ours = timed(
                    "Lookout extents (the engine query)",
                    data.num_rows,
                    run_lookout,
                    spark,
                    config,
                    rule_set,
                    "avg15",
                    len(expected),
                )
                check(config, "avg15", expected)
                replayed = timed(
                    "Lookout replay (Parquet in and out)",
                    data.num_rows,
                    run_replay,
                    parquet,
                    avg15_rule(slide_s),
                    work,
                    expected,
                )
                results[label] = (spark_rate, ours, replayed)
                print(f"  {len(expected):,} windows, as the oracle's; "
                      f"Lookout / Spark = {ours / spark_rate:,.1f}x")  # fmt: skip
        if args.only in (None, "expiration"):
            data = readings(args.rows, args.stations, gaps=True)
            config, rule_set = fill_lakehouse(
                work / "lakehouse",
                data,
                "CREATE AGGREGATE silence(ts TIMESTAMP) RETURNS TIMESTAMP\n"
                "  LANGUAGE PYTHON AS 'rules.udas:Silence';\n"
                "CREATE STREAM silent AS SELECT station, silence(ts) OVER (PARTITION BY "
                "station RANGE 5 SECONDS PRECEDING ACTIVE EXPIRATION) AS last_seen "
                "FROM traffic;\n",
            )
            rows = [("traffic", {"station": s, "speed": v, "ts": t, "source": "bench",
                                 "seq": q})
                    for s, v, t, q in zip(data["station"].to_pylist(),
                                          data["speed"].to_pylist(),
                                          [int(x.timestamp() * 1000) for x in
                                           data["ts"].to_pylist()],
                                          data["seq"].to_pylist(), strict=True)]  # fmt: skip
            want = sum(1 for o in replay(rule_set.plan, rows).outputs if o.sink == "silent")
            print(f"keyed active expiration: {data.num_rows:,} readings, {want} alarms")
            rate = timed(
                "Lookout silent detector (5 s)",
                data.num_rows,
                run_lookout,
                spark,
                config,
                rule_set,
                "silent",
                want,
            )
            got = DeltaTable(config.table("silent")).count()
            assert got == want, f"{got} alarms live, {want} in replay"
            results["active expiration"] = (math.nan, rate, math.nan)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("\n| window | Spark window() rows/s | PyFlink SQL rows/s | Lookout engine rows/s | "
          "Lookout replay rows/s | engine / Flink | replay / Flink |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, (theirs, ours, replayed) in results.items():
        peer = flink.get(label, math.nan)
        print(f"| {label} | {_rate(theirs)} | {_rate(peer)} | {ours:,.0f} | {_rate(replayed)} | "
              f"{_ratio(ours, peer)} | {_ratio(replayed, peer)} |")  # fmt: skip


def _rate(value: float) -> str:
    return "" if math.isnan(value) else f"{value:,.0f}"


def _ratio(ours: float, theirs: float) -> str:
    return "" if math.isnan(theirs) else f"{ours / theirs:,.2f}x"


if __name__ == "__main__":
    main()
