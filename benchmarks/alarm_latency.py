"""Alarm latency of the live runtime: from the moment the watermark passes an expiry to
the alarm in the `alerts` table.

The engine (`lookout engine`'s query, one SparkSession) runs a keyed
active-expiration rule: an alarm when a station sends nothing for 5 seconds (slack 2 s).
This script plays ingest: every `--tick` seconds it lands one file of readings (with
ingest's own `LandingWriter`) from `--stations` stations whose event clocks are the wall
clock, and now and then one station falls silent for 8 s.

* **busy stream**: the other stations keep sending. An alarm at event instant e is due
  once the stream's watermark (max event time - slack) exceeds e; the first landed file
  that takes it there is the moment the watermark passes the expiry. Latency = the
  alarm's `detected_at` - that file's landing time.
* **quiet stream** (heartbeats): at the end every station stops at once, and the script
  lands heartbeats as `lookout ingest --heartbeat-after S` would (`SilenceHeartbeats`).
  Reported: the alarm's `detected_at` - the wall time at which continuous readings would
  have passed the expiry (e + slack), i.e. processing plus what waiting for heartbeats
  costs; the difference to the busy figure is the heartbeats' extra latency.

    python benchmarks/alarm_latency.py [--seconds 90] [--trigger 1.0] [--conf KEY=VALUE ...]

`--conf` sets a Spark SQL setting on the session before the queries start (to compare
a setting against the session's own).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from engine.core.clocks import SlackClock
from engine.spark.job import EngineJob
from engine.spark.session import build_session
from ingest.heartbeats import SilenceHeartbeats
from ingest.landing import LandingWriter
from lookout.config import Config, EngineConfig
from lookout.services import alert_specs
from rules.language.loader import load_rules

SLACK_MS = 2_000
SILENT_MS = 8_000
RULES = """CREATE STREAM traffic (station INT, speed DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings';
CREATE AGGREGATE silence(ts TIMESTAMP) RETURNS TIMESTAMP
  LANGUAGE PYTHON AS 'rules.udas:Silence';
CREATE ALERT silent SEVERITY warning RESOLVE WHEN TRUE
  AS SELECT station,
            silence(ts) OVER (PARTITION BY station RANGE 5 SECONDS PRECEDING
                              ACTIVE EXPIRATION) AS last_seen
     FROM traffic;
"""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Feeder:
    """Lands readings like ingest, remembering when each file landed and the stream's
    watermark after it."""

    def __init__(self, config: Config, stations: int, seed: int) -> None:
        self.writer = LandingWriter(config.landing, "bench")
        self.stations = stations
        self.rng = random.Random(seed)
        self.silent_until = [0] * stations
        self.seq = 0
        self.clock = SlackClock(SLACK_MS)  # the stream's watermark, as the landing keeps it
        self.landed: list[tuple[int, int]] = []  # (landed at, watermark after) per file

    def tick(self, wall: int, silence: bool) -> None:
        """One file: a reading per station that is not silent at `wall`."""
        if silence:
            station = self.rng.randrange(self.stations)
            if self.silent_until[station] < wall:
                self.silent_until[station] = wall + SILENT_MS
        readings = []
        for s in range(self.stations):
            if self.silent_until[s] > wall:
                continue
            self.seq += 1
            speed = round(self.rng.uniform(5, 35), 2)
            readings.append({"station": s + 1, "speed": speed, "ts": wall, "seq": self.seq,
                             "source": f"loop-{s + 1}"})  # fmt: skip
        if readings:
            self.writer.add_readings("traffic", readings, "lookout/traffic/bench/readings", wall)
            self._land(wall)

    def heartbeat(self, event_ms: int, wall: int) -> None:
        """Land a heartbeat of the stream at `event_ms`."""
        self.writer.add_heartbeat("traffic", {"ts": event_ms, "source": "bench"}, wall)
        self._land(event_ms)

    def _land(self, latest_ms: int) -> None:
        """Flush the file and note when it landed and the watermark after it."""
        self.writer.flush()
        clock = self.clock
        clock.max_ts = latest_ms if clock.max_ts is None else max(clock.max_ts, latest_ms)
        self.landed.append((now_ms(), self.clock.watermark))


def passed_at(landed: list[tuple[int, int]], instant: int) -> int | None:
    """When the first landed file (or landing commit) took the watermark past `instant`."""
    return next((at for at, watermark in sorted(landed) if watermark > instant), None)


def landing_commits(config: Config) -> list[tuple[int, int]]:
    """(written at, stream watermark after it) per file of `readings_traffic`: when the
    engine wrote the readings (one file per batch, written before the batch commits)."""
    files = pa.table(DeltaTable(config.table("readings_traffic")).get_add_actions(flatten=True))
    return [
        (_ms(row["modification_time"]), _ms(row["max.arrival_watermark"]))
        for row in files.select(["modification_time", "max.arrival_watermark"]).to_pylist()
    ]


def _ms(value: datetime | int) -> int:
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else value


def summary(label: str, values: list[float]) -> None:
    if not values:
        print(f"  {label}: no alarms")
        return
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    print(f"  {label}: {len(values)} alarms, median {statistics.median(values):.2f} s, "
          f"p90 {p90:.2f} s, min {values[0]:.2f} s, max {values[-1]:.2f} s")  # fmt: skip


def print_batches(name: str, progress: list) -> None:
    """Median duration of a query's recent batches, with data and without, by phase."""
    for label, batches in (
        ("with rows", [p for p in progress if p.numInputRows]),
        ("no rows", [p for p in progress if not p.numInputRows and "addBatch" in p.durationMs]),
    ):
        if batches:
            phases = {k: statistics.median(p.durationMs.get(k, 0) for p in batches)
                      for k in ("triggerExecution", "addBatch", "latestOffset", "queryPlanning",
                                "walCommit", "commitOffsets")}  # fmt: skip
            print(f"  {name} batches {label} ({len(batches)}): median ms {phases}")
            ops = [p.stateOperators[0] for p in batches if p.stateOperators]
            if ops:
                commit = statistics.median(o.commitTimeMs for o in ops)
                sync = statistics.median(
                    o.customMetrics.get("rocksdbCommitFileSyncLatencyMs", 0) for o in ops
                )
                print(f"    state store commit {commit} ms, of which file sync {sync} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=90.0, help="busy phase length")
    parser.add_argument("--warmup", type=float, default=30.0, help="not measured")
    parser.add_argument("--stations", type=int, default=20)
    parser.add_argument("--tick", type=float, default=0.1, help="seconds between files")
    parser.add_argument("--trigger", type=float, default=EngineConfig.trigger_seconds)
    parser.add_argument("--heartbeat-after", type=float, default=1.0)
    parser.add_argument("--partitions", type=int, default=EngineConfig.shuffle_partitions)
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark SQL setting for this run (repeatable)")  # fmt: skip
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lookout-latency-"))
    rules = work / "silent.sql"
    rules.write_text(RULES)
    rule_set = load_rules([rules])
    engine_config = EngineConfig(trigger_seconds=args.trigger, shuffle_partitions=args.partitions)
    config = Config(lakehouse=str(work / "lakehouse"), engine=engine_config)
    print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}")
    print(f"{args.stations} stations, a file every {args.tick} s, trigger {args.trigger} s, "
          f"{args.partitions} shuffle partitions, "
          f"slack {SLACK_MS / 1000} s, silence alarm after 5 s")  # fmt: skip
    spark = build_session(engine_config)
    for setting in args.conf:
        key, _, value = setting.partition("=")
        spark.conf.set(key, value)
        print(f"setting {key} = {value}")
    job = EngineJob(config, rule_set.plan, alert_specs(rule_set), spark)
    stop = threading.Event()
    engine = threading.Thread(target=job.run_until, args=(stop,), daemon=True)
    engine.start()
    feeder = Feeder(config, args.stations, seed=7)
    try:
        start = time.monotonic()
        measured_from = now_ms() + int(args.warmup * 1000)
        while time.monotonic() - start < args.warmup + args.seconds:
            wall = now_ms()
            feeder.tick(wall, silence=wall > measured_from - 10_000 and feeder.rng.random() < 0.02)
            time.sleep(args.tick)
        # Quiet: nobody sends; heartbeats as `ingest --heartbeat-after` would land them.
        quiet_from = now_ms()
        beats = SilenceHeartbeats(int(args.heartbeat_after * 1000))
        beats.observe("traffic", feeder.clock.max_ts or quiet_from, quiet_from)
        while now_ms() - quiet_from < 15_000:
            wall = now_ms()
            for _, event_ms in beats.due(wall):
                feeder.heartbeat(event_ms, wall)
            time.sleep(0.05)
        time.sleep(8)
        failed = job.failed()
        if failed:
            raise RuntimeError(failed)
        alerts = DeltaTable(config.table("alerts")).to_pyarrow_table().to_pylist()
        committed = landing_commits(config)
        for query, _ in job.queries:
            print_batches(query.name, query.recentProgress)
    finally:
        stop.set()
        engine.join(timeout=60)
        job.spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    busy, busy_landed, quiet = [], [], []
    for alert in alerts:
        instant = int(alert["event_time"].timestamp() * 1000)
        detected = alert["detected_at"].timestamp() * 1000
        if instant >= quiet_from - 5_000:
            quiet.append((detected - (instant + SLACK_MS)) / 1000)
        elif instant > measured_from:
            at, decided = passed_at(feeder.landed, instant), passed_at(committed, instant)
            if at is not None and decided is not None:
                busy.append((detected - decided) / 1000)
                busy_landed.append((detected - at) / 1000)
    print("alarm latency (detected_at - the watermark passing the expiry):")
    summary("busy stream, from the landing's commit of the readings", busy)
    summary("busy stream, from ingest landing the file", busy_landed)
    summary("quiet stream, heartbeats after "
            f"{args.heartbeat_after:g} s (from expiry + slack)", quiet)  # fmt: skip


if __name__ == "__main__":
    main()
