"""The whole pipeline under load, with faults: simulators → mosquitto → ingest →
Spark → Delta, every part a real process, measured end to end.

The traffic simulator publishes at `--rate` readings/s (paced, `--batch` readings per
message; congestion and silent-detector episodes planted, and speeding drivers at one
station all through the run, so that alerts come every minute); when the rules
(`--rules`, files or folders, repeatable) read the RFID stream too, the RFID simulator
publishes `--rfid-rate` of those readings (thefts and missing items planted) and traffic
the rest.
At random moments of the run (seeded) each fault in `--faults` strikes once:

* `ingest`: kill -9 of `lookout ingest`, restarted 1 s later;
* `engine`: kill -9 of `lookout engine` (the Spark driver), restarted at once; with
  `--standby`, two `lookout engine --standby` run, and the one holding the lakehouse's
  engine lock is killed: the other takes over with its Spark already up, and the killed
  one is started again `STANDBY_BACK_S` (120 s) later, as a supervisor with a back-off
  would;
* `broker`: mosquitto restarted (SIGTERM, which saves its persistence, then start);
* `dashboard`: kill -9 of the Streamlit server, restarted; it must answer again.

With `--cluster N` the engine runs on a Spark standalone cluster on this machine (`lookout
cluster`: a master and N one-core workers): `lookout engine` is then the driver, and
the CPU per reading is reported for it and for each worker with its executor and the
executor's Python workers (`executors-<n>`), so the driver's share shows.

Once every reading is stored, a heartbeat a day ahead on every stream closes every
window, and the tables must hold: every generated reading in its `readings_<stream>`
table or `late_readings` exactly once (the late ones exactly those the simulators made
late, duplicates removed), and the alerts `lookout replay` computes over the same
readings (the same seeds written to files): same ids, none twice, none missing. It
prints those checks and the figures: the achieved publish rate, the backlog drained
after the last publish, the latency from a reading's publication to the alert row it
completes (p50 / p99, overall and after the last fault), stamped when the engine's
stateful step wrote it (`detected_at`: `latency_p50_s`, `latency_p99_s`) and when its
Delta commit made it readable to the dashboard and the notifier (`committed_p50_s`,
`committed_p99_s`: the commit's time, from the alerts table's log), and where the time
and the machine went: the engine's batch phases (from its /metrics), CPU per reading of
every part, the engine's resident memory and its watermark lag over the run (each as the
median over minute 2 and over the last minute of publishing; the memory's growth between
them without the table maintenance's process, which starts its rounds later), and for
each fault how long after it the alerts were on time again (`recovery`: from the first
alert after which, for 15 s, every alert came within the slack + 2 s), and the run in
spans of 30 s (`by_30_s`: latency, batch phases, each part's cores, the machine's CPU,
I/O and memory stalls and stolen time), where a fault's or a restart's cost shows. The
simulators start once every engine query has run its first batch: the latency measured
is the running pipeline's, not a cold start's (`benchmarks/first_alert.py` times that). While
they publish, a line every 5 minutes gives the watermark's lag, the engine's memory, the
streaming checkpoints' size and the tables' data files (all sampled over the run).

`--no-oracle` is for a long soak, whose readings would not fit in memory as id sets:
replay is not run, the readings are checked by count (each table's distinct ids equal
to its rows, and to the readings generated), and the alerts for duplicates only.

    python benchmarks/pipeline_faults.py --rate 20000 --duration 600 \\
        --rules rules/traffic.sql --rules rules/rfid.sql --json report.json
    python benchmarks/pipeline_faults.py --rate 10000 --duration 3600 --no-oracle \\
        --rules rules/traffic.sql --rules rules/rfid.sql --json soak.json
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import gc
import json
import logging
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import paho.mqtt.publish as mqtt_publish
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from prometheus_client.parser import text_string_to_metric_families

from engine.core.pipeline import components, fed_stages, stage_sinks
from engine.core.plan import Plan
from engine.core.replay import ordered_outputs
from engine.tables import readings_table
from ingest.validate import heartbeat_filter
from lookout.broker import Broker, free_port
from lookout.cluster import LocalCluster
from lookout.demo import Part, lookout_argv, wait_for_parts
from lookout.health import engine_running, read_health
from lookout.mqtt_auth import PUBLISHER
from lookout.replay import alert_ids, evaluate
from lookout.replay_inputs import Readings, parse_inputs
from rules.language.loader import RULES_DIR, RuleSet, load_rules

START = "2026-03-02T06:00:00+00:00"
FAULTS = ("ingest", "engine", "broker", "dashboard")
STANDBY_BACK_S = 120.0
"""With `--standby`: when a killed engine starts again, as the new standby (its JVM and
Spark take about 10 s of a core: later than the recovery the run measures)."""


def columns_of(lakehouse: Path, table: str, columns: list[str]) -> pa.Table | None:
    """``columns`` of a lakehouse table, or None if it has not been written yet."""
    path = lakehouse / table
    if not (path / "_delta_log").is_dir():
        return None
    return DeltaTable(str(path)).to_pyarrow_table(columns=columns)


def count(lakehouse: Path, table: str) -> int:
    path = lakehouse / table
    return DeltaTable(str(path)).count() if (path / "_delta_log").is_dir() else 0


def rows(lakehouse: Path, table: str, columns: list[str]) -> list[dict]:
    found = columns_of(lakehouse, table, columns)
    return [] if found is None else found.to_pylist()


def distinct_ids(
    lakehouse: Path, table: str, where: tuple[str, str] | None = None
) -> tuple[int, int]:
    """A table's rows and distinct (source, seq) pairs (of rows whose column
    ``where[0]`` is ``where[1]``), counted by Arrow."""
    found = columns_of(lakehouse, table, ["source", "seq"] + ([where[0]] if where else []))
    if found is None:
        return 0, 0
    if where:
        found = found.filter(pc.equal(found[where[0]], where[1]))
    return found.num_rows, found.group_by(["source", "seq"]).aggregate([]).num_rows


def stream_timing(lakehouse: Path, streams: list[str]) -> dict[str, tuple[float, float]]:
    """Per stream with readings: the fastest delivery seen (received_at - ts, seconds)
    and the newest event time (epoch seconds), from its readings table."""
    timing = {}
    for stream in streams:
        found = columns_of(lakehouse, readings_table(stream), ["ts", "received_at"])
        if found is None or not found.num_rows:
            continue
        ts, received = epoch_us(found["ts"]), epoch_us(found["received_at"])
        delivery = pc.min(pc.subtract(received, ts)).as_py() / 1e6
        timing[stream] = (delivery, pc.max(ts).as_py() / 1e6)
    return timing


def epoch_us(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A timestamp column as microseconds since the epoch."""
    return column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())


def disk_figures(lakehouse: Path) -> dict[str, float]:
    """The streaming checkpoints' size (state stores and logs, MB), the data files the
    tables' current versions hold (what compaction keeps bounded), and the data files on
    disk (those compaction replaced stay for the tables' retention, 7 days)."""
    checkpoint_bytes, on_disk, live = 0, 0, 0
    for root, _, names in os.walk(lakehouse):
        inside = Path(root).relative_to(lakehouse).parts
        if inside and inside[0] != "_checkpoints" and (Path(root) / "_delta_log").is_dir():
            with contextlib.suppress(Exception):  # a table being written or compacted
                live += len(DeltaTable(root).file_uris())
        for name in names:
            if inside and inside[0] == "_checkpoints":
                with contextlib.suppress(OSError):
                    checkpoint_bytes += os.stat(os.path.join(root, name)).st_size
            elif name.endswith(".parquet") and "_delta_log" not in inside:
                on_disk += 1
    return {
        "checkpoints_mb": round(checkpoint_bytes / 2**20, 1),
        "table_files": live,
        "files_on_disk": on_disk,
    }


def kill9(part: Part) -> None:
    assert part.process is not None
    os.killpg(part.process.pid, signal.SIGKILL)
    part.process.wait()


def dashboard_up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def engine_warm(lakehouse: str) -> bool:
    """Whether every query of the engine has committed a batch (its Python workers and
    first state store are up)."""
    queries = (read_health(lakehouse, "engine") or {}).get("queries") or []
    return bool(queries) and all(q.get("batches") for q in queries)


def publish_one(broker: Broker, topic: str, payload: bytes) -> None:
    """One message with the publisher login, acknowledged."""
    assert broker.credentials is not None
    login = broker.credentials.login(PUBLISHER)
    auth = {"username": login.username, "password": login.password}
    mqtt_publish.single(topic, payload, qos=1, hostname="127.0.0.1", port=broker.port, auth=auth)


def warm_up_heartbeats(rule_set: RuleSet, broker: Broker) -> None:
    """A heartbeat at the run's start on every source stream: each engine query runs
    its first batch on it before the readings come."""
    ts = int(datetime.fromisoformat(START).timestamp() * 1000)
    for stream in rule_set.plan.sources():
        if stream.topic:
            topic = heartbeat_filter(stream.topic).replace("+", "bench").replace("#", "bench")
            publish_one(
                broker, topic, orjson.dumps({"source": "bench", stream.timestamp or "ts": ts})
            )


@dataclass
class Simulated:
    """A source stream the run publishes: its simulator's arguments, and the files the
    undisturbed run (the same seed) is written to."""

    stream: str
    argv: list[str]
    recording: Path
    truth: Path


def simulated_streams(rule_set: RuleSet, args: argparse.Namespace, work: Path) -> list[Simulated]:
    """The streams of the rules a simulator can publish, each with its share of `--rate`."""
    topics = {s.name: s.topic or "" for s in rule_set.plan.sources()}
    rfid = [name for name, topic in topics.items() if topic.startswith("lookout/rfid/")]
    traffic = [name for name, topic in topics.items() if topic.startswith("lookout/traffic/")]
    common = ["--duration", str(args.duration), "--seed", str(args.seed), "--start", START,
              "--disorder", "bounded:1", "--late-fraction", "0.002",
              "--duplicate-fraction", "0.002", "--quiet"]  # fmt: skip
    rfid_rate = args.rfid_rate if rfid else 0.0
    found = []
    if traffic:
        found.append(Simulated(traffic[0], [
            "traffic", "--rate", str(args.rate - rfid_rate), "--stations", str(args.stations),
            "--congestion", "3@10+30,7@20", "--silent", "5@15+20", "--speeding", "2@5+0", *common,
        ], work / "traffic.jsonl", work / "traffic-truth.jsonl"))  # fmt: skip
    if rfid:
        found.append(Simulated(rfid[0], ["rfid", "--rate", str(rfid_rate), *common],
                               work / "rfid.jsonl", work / "rfid-truth.jsonl"))  # fmt: skip
    if not found:
        raise SystemExit("the rules read no stream a simulator publishes (traffic, rfid)")
    return found


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def line_count(path: Path) -> int:
    """A file's lines, read a block at a time."""
    with path.open("rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b""))


def is_maintenance(process: psutil.Process) -> bool:
    """Whether ``process`` is the engine's table maintenance (a part of its own: it
    compacts every few minutes, whatever the batches)."""
    with contextlib.suppress(psutil.Error):
        return "engine.maintenance" in " ".join(process.cmdline())
    return False


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds of a process and all its descendants (live or waited for), but for a
    table maintenance process among them."""
    if pid is None:
        return 0.0
    try:
        root = psutil.Process(pid)
        total = sum(root.cpu_times()[:4])  # user, system, children_user, children_system
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if not is_maintenance(child):
                    total += sum(child.cpu_times()[:2])
        return total
    except psutil.Error:
        return 0.0


def maintenance_pid(*engines: Callable[[], int | None]) -> Callable[[], int | None]:
    """The pid of the table maintenance process of the first of ``engines`` (the
    active engine and a standby) that has one (None before the first round)."""

    def find() -> int | None:
        for engine in engines:
            with contextlib.suppress(psutil.Error):
                if (pid := engine()) is not None:
                    for child in psutil.Process(pid).children():
                        if is_maintenance(child):
                            return int(child.pid)
        return None

    return find


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The engine's /metrics, by (sample name, labels); empty if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def stalled_s() -> dict[str, float]:
    """The machine's stall counters so far, in seconds: time some task waited for CPU,
    I/O or memory (Linux's pressure stall information), and the time the hypervisor
    ran others on this VM's CPUs (steal); empty where the kernel has none."""
    found = {}
    for what in ("cpu", "io", "memory"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            some = Path(f"/proc/pressure/{what}").read_text().splitlines()[0]
            found[what] = int(some.rsplit("total=", 1)[1]) / 1e6  # µs
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        found["steal"] = int(fields[8]) / os.sysconf("SC_CLK_TCK")
    return found


class Sampler(threading.Thread):
    """Every `every_s`: each part's CPU seconds (summed across its restarts) and the
    engine's metrics; every `disk_every_s`, the lakehouse's `disk_figures` too."""

    def __init__(
        self,
        pids: dict[str, Callable[[], int | None]],
        metrics_port: int,
        lakehouse: Path,
        every_s: float = 5.0,
        disk_every_s: float = 30.0,
    ) -> None:
        super().__init__(daemon=True)
        self.pids, self.metrics_port, self.every_s = pids, metrics_port, every_s
        self.lakehouse, self.disk_every_s = lakehouse, disk_every_s
        self.cpu_s: dict[str, float] = dict.fromkeys(pids, 0.0)
        self._last: dict[str, tuple[int | None, float]] = {}
        self._disk_at = -disk_every_s
        self.samples: list[dict[str, Any]] = []
        self.started = time.monotonic()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            self.sample()

    def sample(self) -> dict[str, Any]:
        for part, pid_of in self.pids.items():
            pid = pid_of()
            now = process_cpu_s(pid)
            last_pid, last = self._last.get(part, (None, 0.0))
            self.cpu_s[part] += now - last if pid == last_pid and now >= last else now
            self._last[part] = (pid, now)
        taken = {"t": time.monotonic() - self.started, "cpu_s": dict(self.cpu_s),
                 "stalled_s": stalled_s(), "metrics": scrape(self.metrics_port)}  # fmt: skip
        if taken["t"] - self._disk_at >= self.disk_every_s:
            taken["disk"] = disk_figures(self.lakehouse)
            self._disk_at = taken["t"]
        self.samples.append(taken)
        return taken


class CommitWatcher(threading.Thread):
    """Every `every_s`, the new commits of a Delta table: each one's time and the data
    files it added, read from its log before the engine's log cleanup can delete it."""

    def __init__(self, table: Path, every_s: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.table, self.every_s = table, every_s
        self.commits: dict[int, tuple[float, list[str]]] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            self.poll()

    def poll(self) -> None:
        for path in sorted((self.table / "_delta_log").glob("*.json")):
            version = int(path.stem)
            if version in self.commits:
                continue
            with contextlib.suppress(FileNotFoundError, ValueError):
                actions = [orjson.loads(line) for line in path.read_bytes().splitlines()]
                at = next(a["commitInfo"]["timestamp"] for a in actions if "commitInfo" in a)
                added = [a["add"]["path"] for a in actions if "add" in a]
                self.commits[version] = (at / 1000, added)

    def visible_at(self, column: str) -> dict[Any, float]:
        """When each value of `column` became readable: its first commit's time (files a
        compaction rewrote are read where the engine wrote them)."""
        seen: dict[Any, float] = {}
        for _, (at, added) in sorted(self.commits.items()):
            for name in added:
                with contextlib.suppress(FileNotFoundError):
                    for value in pq.read_table(self.table / name, columns=[column])[column]:
                        seen.setdefault(value.as_py(), at)
        return seen


def metric(sample: dict[str, Any], name: str, **labels: str) -> float:
    """The sum of a metric's values whose labels include `labels`."""
    return sum(
        value
        for (found, have), value in sample["metrics"].items()
        if found == name and set(labels.items()) <= set(have)
    )


def label_values(sample: dict[str, Any], name: str, label: str) -> set[str]:
    return {dict(have)[label] for (found, have) in sample["metrics"] if found == name}


def increase(samples: list[dict[str, Any]], name: str, **labels: str) -> float:
    """How much a counter grew over `samples` (from the first that has metrics), across
    engine restarts (a counter that went down started again from zero) and scrapes
    that got no answer."""
    total, before = 0.0, None
    for sample in samples:
        if not sample["metrics"]:
            continue
        now = metric(sample, name, **labels)
        if before is not None:
            total += now - before if now >= before else now
        before = now
    return total


def phase_totals(samples: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Each batch phase that ran over `samples`: its batches and their seconds."""
    name = "lookout_engine_batch_seconds_count"
    found = {phase for x in samples for phase in label_values(x, name, "phase")}
    totals = {}
    for phase in sorted(found):
        count = increase(samples, name, phase=phase)
        if count:
            seconds = increase(samples, "lookout_engine_batch_seconds_sum", phase=phase)
            totals[phase] = (count, seconds)
    return totals


def per_second(first: dict[str, Any], last: dict[str, Any], figure: str, digits: int) -> dict:
    """How fast each of the samples' `figure` counters (CPU seconds of each part, the
    machine's stall seconds) grew from `first` to `last`, per second."""
    seconds = last["t"] - first["t"]
    if seconds <= 0:
        return {}
    return {name: round((last[figure][name] - first[figure][name]) / seconds, digits)
            for name in last[figure] if name in first[figure]}  # fmt: skip


def breakdown(samples: list[dict[str, Any]], readings: int) -> dict[str, Any]:
    """Where the time and the machine went over `samples`: the engine's mean batch
    phases, and each part's CPU per reading (µs), over every sample and from minute 2
    on (`cpu_us_per_reading_from_minute_2`: the JVMs' compilers and the windows
    filling are behind; the rate steady, so the readings of a span are counted by its
    share of the time)."""
    first, last = samples[0], samples[-1]
    after = [x for x in samples if x["t"] - first["t"] >= 60.0]
    phases = {
        phase: {"mean_s": round(seconds / count, 3), "batches": int(count)}
        for phase, (count, seconds) in phase_totals(samples).items()
    }
    cpu = {part: round((last["cpu_s"][part] - first["cpu_s"][part]) / max(readings, 1) * 1e6, 1)
           for part in last["cpu_s"]}  # fmt: skip
    seconds = last["t"] - first["t"]
    steady = {}
    if len(after) > 1 and seconds > 0:
        share = readings * (after[-1]["t"] - after[0]["t"]) / seconds
        steady = {part: round((after[-1]["cpu_s"][part] - after[0]["cpu_s"][part])
                              / max(share, 1) * 1e6, 1)
                  for part in last["cpu_s"]}  # fmt: skip
    return {
        "seconds": round(seconds, 1),
        "batch_phases": phases,
        "cpu_us_per_reading": cpu,
        "cpu_us_per_reading_from_minute_2": steady,
        "cpu_cores_used": round(
            (sum(last["cpu_s"].values()) - sum(first["cpu_s"].values())) / max(seconds, 1e-9), 2
        ),
    }


def profile(
    timed: list[tuple[float, float]],
    started_wall: float,
    samples: list[dict[str, Any]],
    published_at: float,
    period_s: float,
) -> list[dict[str, Any]]:
    """The run in spans of `period_s` from the start of publishing: the alerts' latency
    p50 / p99, the engine's mean batch phases (`trigger`: trigger to commit), each
    part's share of the machine (cores) and the machine's stalls (`stalled`: the share
    of the span some task waited for CPU, I/O or memory, and the CPU time stolen by the
    hypervisor), so a fault's or a restart's cost shows where it falls."""
    latency = {row["from_s"]: row for row in by_period(timed, started_wall, period_s)}
    spans: dict[int, list[dict[str, Any]]] = {}
    previous: list[dict[str, Any]] = []
    for sample in samples:  # each span from the last sample before it
        spans.setdefault(int((sample["t"] - published_at) // period_s), previous).append(sample)
        previous = [sample]
    found = []
    for k, span in sorted(spans.items()):
        row = latency.get(round(k * period_s), {"alerts": 0})
        found.append({
            "from_s": round(k * period_s), "alerts": row["alerts"],
            "p50_s": row.get("p50_s"), "p99_s": row.get("p99_s"),
            "batch_phases_s": {phase: round(seconds / count, 3)
                               for phase, (count, seconds) in phase_totals(span).items()},
            "cores": per_second(span[0], span[-1], "cpu_s", 2),
            # the share of the span some task stalled on each (and the CPUs were stolen)
            "stalled": per_second(span[0], span[-1], "stalled_s", 3),
        })  # fmt: skip
    return found


RESIDENT = "lookout_engine_resident_bytes"
REPORT_EVERY_S = 300.0
"""How often a line on the run so far is printed while the simulators publish."""


STATE_MEMORY = "lookout_state_store_memory_bytes"
STATE_FILES = "lookout_state_store_files_bytes"


def memory_mb(sample: dict[str, Any], process: str | None = None, name: str = RESIDENT) -> float:
    """The engine's resident memory in MB: of all its processes (driver, JVM, Python
    workers), or of one; or another metric in bytes (`name`), summed over its labels."""
    labels = {} if process is None else {"process": process}
    return round(metric(sample, name, **labels) / 2**20, 1)


def behind_s(
    sample: dict[str, Any], published_at: float, start_ms: int, streams: set[str]
) -> float | None:
    """How far the slowest published stream's watermark trails the simulators' event
    time (their start is a few seconds after `published_at`, their own start-up)."""
    marks = [
        value
        for (name, labels), value in sample["metrics"].items()
        if name == "lookout_stream_watermark_seconds" and dict(labels)["stream"] in streams
    ]
    if not marks:
        return None
    event_now = start_ms / 1000 + (sample["t"] - published_at)
    return round(event_now - min(marks), 2)


def minute_medians(
    samples: list[dict[str, Any]],
    published_at: float,
    published_s: float,
    figure: Callable[[dict[str, Any]], float | None],
    digits: int = 1,
) -> dict[str, float | None]:
    """The medians of `figure` (None: no value) over minute 2 of publishing and over its
    last minute, its final 5 s left out (a simulator that has sent its last reading no
    longer moves its stream's watermark, while the simulators' clock goes on). Medians,
    since a sample alone swings by a batch's transient allocations."""
    medians: dict[str, float | None] = {}
    for name, since_s in (("minute_2", min(60.0, published_s / 5)),
                          ("last_minute", published_s - 65)):  # fmt: skip
        found = [
            value
            for x in samples
            if since_s <= x["t"] - published_at < since_s + 60.0
            and (value := figure(x)) is not None
        ]
        medians[name] = round(statistics.median(found), digits) if found else None
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=5000, help="readings per second, all streams")
    parser.add_argument(
        "--rfid-rate", type=float, default=None, help="of which RFID (if read; default rate/10)"
    )
    parser.add_argument("--duration", type=float, default=60)
    parser.add_argument("--batch", type=int, default=20, help="readings per MQTT message")
    parser.add_argument("--stations", type=int, default=40)
    parser.add_argument("--faults", default="", help=f"comma list of {', '.join(FAULTS)}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--rules", action="append", default=None, help="rule file or folder (repeatable)"
    )
    parser.add_argument(
        "--cluster",
        type=int,
        default=0,
        help="run the engine on a local standalone cluster "
        "of this many one-core workers (0: local mode)",
    )
    parser.add_argument(
        "--no-oracle",
        action="store_true",
        help="a long soak: check readings by count, not id sets, and alerts for "
        "duplicates, without replay's alerts to compare",
    )
    parser.add_argument(
        "--standby",
        action="store_true",
        help="run a standby engine beside the engine (both `lookout engine --standby`)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--json", default=None, help="also write the report to this file")
    args = parser.parse_args()
    # paho's one-message `single` logs "Client is not connected" as an error once it
    # has disconnected cleanly: that line says nothing here.
    logging.getLogger("paho.mqtt.client").setLevel(logging.CRITICAL)
    args.rules = args.rules or [str(RULES_DIR / "traffic.sql")]
    if args.rfid_rate is None:
        args.rfid_rate = args.rate / 10
    faults = [f for f in args.faults.split(",") if f]
    if unknown := set(faults) - set(FAULTS):
        parser.error(f"unknown faults: {sorted(unknown)}")
    work = Path(tempfile.mkdtemp(prefix="lookout-faults-"))
    lakehouse = work / "lakehouse"
    print(f"machine: {platform.node()}, {os.cpu_count()} cores; work folder {work}")
    rule_set = load_rules(args.rules)
    plan = rule_set.plan
    streams = simulated_streams(rule_set, args, work)

    # The undisturbed run: the same seeds to files, evaluated by replay.
    t0 = time.monotonic()
    for sim in streams:
        subprocess.run(lookout_argv("simulate", *sim.argv, "--out", str(sim.recording),
                                    "--truth", str(sim.truth)), check=True)  # fmt: skip
    truth = {sim.stream: [orjson.loads(line) for line in lines(sim.truth)] for sim in streams}
    made_late = {
        (t["source"], t["seq"]) for ts in truth.values() for t in ts if t["type"] == "late"
    }
    # Distinct readings: the recording's lines but the duplicates the simulator made.
    expected = {
        sim.stream: line_count(sim.recording)
        - sum(t["type"] == "duplicate" for t in truth[sim.stream])
        for sim in streams
    }
    generated = (
        {}
        if args.no_oracle
        else {
            sim.stream: {(r["source"], r["seq"]) for r in map(orjson.loads, lines(sim.recording))}
            for sim in streams
        }
    )
    total = sum(expected.values())
    want_ids = None if args.no_oracle else expected_alert_ids(rule_set, streams)
    # The oracle's id sets (millions of tuples) stay as they are to the end: out of the
    # collector's passes, which would walk them on this machine's cores mid-run.
    gc.collect()
    gc.freeze()
    print(f"{total:,} readings generated ({time.monotonic() - t0:.0f} s); replay: "
          f"{'not run' if want_ids is None else len(want_ids)} alerts", flush=True)  # fmt: skip

    broker = Broker("127.0.0.1", free_port(), work / "broker").start()
    dash_port, metrics_port = free_port(), free_port()
    env = {**os.environ, "LOOKOUT_LAKEHOUSE_PATH": str(lakehouse),
           "LOOKOUT_MQTT_PORT": str(broker.port), "LOOKOUT_RULES_PATHS": ",".join(args.rules),
           "LOOKOUT_MQTT_CREDENTIALS_FILE": broker.mqtt_config().credentials_file,
           # The closing heartbeat is a day ahead of the clock: let ingest accept it.
           "LOOKOUT_INGEST_MAX_FUTURE_MS": str(2 * 86_400_000),
           "LOOKOUT_ENGINE_METRICS_PORT": str(metrics_port),
           "LOOKOUT_DASHBOARD_PORT": str(dash_port)}  # fmt: skip
    cluster = None
    if args.cluster:
        cluster = LocalCluster(work / "cluster", workers=args.cluster, cores=1, memory="2g")
        env["LOOKOUT_ENGINE_MASTER"] = cluster.start().url
    logs = work / "logs"
    engine_args = ["engine", "--standby"] if args.standby else ["engine"]
    parts = {
        "ingest": Part("ingest", lookout_argv("ingest"), logs / "ingest.log"),
        "engine": Part("engine", lookout_argv(*engine_args), logs / "engine.log"),
        "dashboard": Part("dashboard", lookout_argv("dashboard"), logs / "dashboard.log"),
    }
    if args.standby:
        parts["engine-b"] = Part("engine-b", lookout_argv(*engine_args), logs / "engine-b.log")
    # The engine holding the lock (a one-item list, swapped by a takeover).
    running = [parts["engine"]]
    restarts: list[threading.Timer] = []
    publishers = [
        Part(f"simulator-{sim.argv[0]}",
             lookout_argv("simulate", *sim.argv, "--port", str(broker.port),
                          "--batch", str(args.batch), "--speedup", "1"),
             logs / f"simulator-{sim.argv[0]}.log")
        for sim in streams
    ]  # fmt: skip

    def pid_of(part: Part) -> Callable[[], int | None]:
        return lambda: part.process.pid if part.process and part.process.poll() is None else None

    def cluster_pid(n: int) -> Callable[[], int | None]:
        return lambda: cluster.processes[n].pid if cluster and cluster.processes else None

    # A worker's descendants are its executor and the executor's Python workers.
    workers = {f"executors-{n}": cluster_pid(n + 1) for n in range(args.cluster)}
    if args.cluster:
        workers["cluster-master"] = cluster_pid(0)
    sampler = Sampler(
        {**{p.name: pid_of(p) for p in (*parts.values(), *publishers)},
         "maintenance": maintenance_pid(*(pid_of(p) for n, p in parts.items() if "engine" in n)),
         "broker": lambda: broker.process.pid if broker.process else None, **workers},
        metrics_port,
        lakehouse,
    )  # fmt: skip
    report: dict = {"rate": args.rate, "duration": args.duration, "faults": faults,
                    "standby": args.standby,
                    "cluster": args.cluster, "rules": args.rules, "streams": expected,
                    "oracle": not args.no_oracle}  # fmt: skip
    commits = CommitWatcher(lakehouse / "alerts")
    latency: list[float] = []
    try:
        parts["ingest"].start(env)
        wait_for_parts(
            lambda: (read_health(lakehouse, "ingest-0") or {}).get("subscribed"),
            "ingest",
            [parts["ingest"]],
            60,
        )
        since_ms = int(time.time() * 1000)
        parts["engine"].start(env)
        # Publishing starts once every query has run its first batch: a cold start
        # (JVM, Python workers, the first state store, ~30 s on two cores) is not the
        # latency measured (`benchmarks/first_alert.py` times that).
        wait_for_parts(
            lambda: engine_running(read_health(lakehouse, "engine"), since_ms),
            "the engine",
            [parts["engine"]],
            300,
        )
        warm_up_heartbeats(rule_set, broker)
        wait_for_parts(lambda: engine_warm(lakehouse), "the engine's first batches",
                       [parts["engine"]], 300)  # fmt: skip
        if args.standby:
            parts["engine-b"].start(env)
            wait_for_parts(lambda: "standby: Spark is up" in parts["engine-b"].log.read_text(),
                           "the standby engine", [parts["engine-b"]], 300)  # fmt: skip
        parts["dashboard"].start(env)
        wait_for_parts(lambda: dashboard_up(dash_port), "the dashboard", [parts["dashboard"]], 120)

        rng = random.Random(args.seed)
        schedule = sorted((rng.uniform(0.2, 0.8) * args.duration, f) for f in faults)
        sampler.start()
        commits.start()
        first = sampler.sample()
        for publisher in publishers:
            publisher.start(env)
        started, started_wall = time.monotonic(), time.time()
        published_at = first["t"]
        start_ms = int(datetime.fromisoformat(START).timestamp() * 1000)
        struck: list[tuple[str, float]] = []  # each fault and its wall time
        for at, fault in schedule:
            time.sleep(max(0.0, started + at - time.monotonic()))
            print(f"{time.monotonic() - started:6.1f} s  fault: {fault}", flush=True)
            struck.append((fault, time.time()))
            if fault == "broker":
                broker.restart()
            elif fault == "engine" and args.standby:
                killed = running[0]
                kill9(killed)
                running[0] = parts["engine-b" if killed is parts["engine"] else "engine"]
                back = threading.Timer(STANDBY_BACK_S, killed.start, (env,))
                back.daemon = True
                back.start()
                restarts.append(back)
            else:
                kill9(parts[fault])
                if fault == "ingest":
                    time.sleep(1.0)
                parts[fault].start(env)
        report_at = REPORT_EVERY_S
        while any(publisher.process.poll() is None for publisher in publishers):
            time.sleep(1.0)
            if time.monotonic() - started >= report_at:
                print(progress(sampler.samples, published_at, start_ms, set(expected)), flush=True)
                report_at += REPORT_EVERY_S
        published_s = time.monotonic() - started
        last = sampler.sample()
        for publisher in publishers:
            if publisher.process.returncode != 0:
                raise RuntimeError(f"{publisher.name} failed:\n{publisher.tail()}")
        report["publish_rate"] = total / published_s
        print(f"published {total:,} readings in {published_s:.1f} s "
              f"({report['publish_rate']:,.0f}/s)", flush=True)  # fmt: skip
        if "dashboard" in faults:
            wait_for_parts(lambda: dashboard_up(dash_port), "the dashboard after its kill", [], 120)
            report["dashboard_back"] = True

        def stored() -> int:
            return sum(count(lakehouse, readings_table(s)) for s in expected) + count(
                lakehouse, "late_readings"
            )

        report["drain_s"] = wait_for_parts(
            lambda: stored() >= total,
            "every reading stored",
            [running[0], parts["ingest"]],
            900,
        )
        # Only now: a batch holding both the last readings and the closing heartbeat
        # (which fires every expiration at once) would date the alerts those readings
        # complete by its end.
        end_ts = int(time.time() * 1000) + 86_400_000
        for stream in plan.sources():
            if stream.topic:
                topic = heartbeat_filter(stream.topic).replace("+", "gw").replace("#", "gw")
                publish_one(
                    broker, topic, orjson.dumps({"source": "gw", stream.timestamp or "ts": end_ts})
                )
        if want_ids is None:  # the alerts the closing heartbeat brings: until none comes
            wait_for_parts(settled(lambda: count(lakehouse, "alerts"), 30), "the alerts",
                           [running[0]], 600)  # fmt: skip
        else:
            wait_for_parts(lambda: count(lakehouse, "alerts") >= len(want_ids), "the alerts",
                           [running[0]], 600)  # fmt: skip
        time.sleep(5)  # anything more (a duplicate) would show up now
        report["takeovers"] = sum(
            p.log.read_text(errors="replace").count("standby: taking over")
            for n, p in parts.items()
            if n.startswith("engine") and p.log.exists()
        )
        sampler.stopped.set()

        late = rows(lakehouse, "late_readings", ["stream", "source", "seq"])
        once = True
        for name, want in expected.items():
            if args.no_oracle:
                stored_n, distinct = distinct_ids(lakehouse, readings_table(name))
                late_n, late_distinct = distinct_ids(lakehouse, "late_readings", ("stream", name))
                once = once and (stored_n, late_n) == (distinct, late_distinct)
                once = once and stored_n + late_n == want
                continue
            stored_rows = rows(lakehouse, readings_table(name), ["source", "seq"])
            keys = [(r["source"], r["seq"]) for r in stored_rows]
            keys += [(r["source"], r["seq"]) for r in late if r["stream"] == name]
            once = once and len(keys) == len(set(keys)) and set(keys) == generated[name]
        report["readings_once"] = once
        # Late capture: exactly the readings the simulators made late, none dropped.
        report["late_sent"] = len(made_late)
        report["late_equal"] = {(r["source"], r["seq"]) for r in late} == made_late
        alerts = rows(lakehouse, "alerts", ["alert_id", "rule", "key", "event_time",
                                            "detected_at", "payload"])  # fmt: skip
        ids = [a["alert_id"] for a in alerts]
        report["alerts_twice"] = len(ids) - len(set(ids))
        if want_ids is not None:
            report["alerts_missing"] = len(want_ids - set(ids))
            report["alerts_unexpected"] = [
                {k: a[k] for k in ("rule", "key", "event_time", "payload")}
                for a in alerts
                if a["alert_id"] not in want_ids
            ][:10]
            report["alerts_equal"] = len(ids) == len(set(ids)) and set(ids) == want_ids
        report["alerts"] = len(ids)
        timing = stream_timing(lakehouse, list(expected))
        latency, timed = alert_latency(plan, timing, alerts)
        report["latency_alerts"] = len(latency)
        if latency:
            report["latency_p50_s"] = percentile(latency, 0.5)
            report["latency_p99_s"] = percentile(latency, 0.99)
            report["latency_by_10_minutes"] = by_period(timed, started_wall, 600)
        commits.stopped.set()
        commits.poll()
        # Committed: readable by the dashboard and the notifier.
        visible = commits.visible_at("alert_id")
        committed, _ = alert_latency(plan, timing, alerts, lambda a: visible[a["alert_id"]])
        if committed:
            report["committed_p50_s"] = percentile(committed, 0.5)
            report["committed_p99_s"] = percentile(committed, 0.99)
        if struck:
            recovered = [x for at, x in timed if at > struck[-1][1] + 30]
            if recovered:
                report["latency_30s_after_last_fault"] = {
                    "alerts": len(recovered),
                    "p50_s": percentile(recovered, 0.5),
                    "p99_s": percentile(recovered, 0.99),
                }
        during = [x for x in sampler.samples if published_at <= x["t"] <= last["t"]]
        if struck:
            on_time = max(plan.streams[s].slack_ms for s in expected) / 1000 + 2
            report["recovery"] = recovery(struck, timed, on_time, started_wall)
        report["breakdown"] = breakdown(during, total)
        report["by_30_s"] = profile(timed, started_wall, during, published_at, 30.0)

        def medians(figure: Callable[[dict[str, Any]], float | None]) -> dict[str, float | None]:
            return minute_medians(during, published_at, published_s, figure)

        processes = sorted(label_values(last, RESIDENT, "process"))
        by_process = {
            process: {
                **medians(partial(memory_mb, process=process)),
                "end": memory_mb(last, process),
            }
            for process in processes
        }
        # The maintenance process starts its rounds after minute 2: apart from the rest.
        steady = [p for p in processes if p != "maintenance"]
        before = sum(by_process[p]["minute_2"] or 0.0 for p in steady)
        after = sum(by_process[p]["last_minute"] or 0.0 for p in steady)
        report["engine_memory_mb"] = {
            **medians(memory_mb),
            "end": memory_mb(last),
            "by_process": by_process,
            "growth_without_maintenance_pct": round(100 * (after / before - 1), 1)
            if before
            else None,
        }
        # RocksDB's own figures, inside the JVM's: memtables, block cache, SST files.
        report["state_store_mb"] = {
            what: medians(partial(memory_mb, name=name))
            for what, name in (("memory", STATE_MEMORY), ("files", STATE_FILES))
        }
        stream_names = set(expected)
        report["watermark_behind_s"] = minute_medians(
            during,
            published_at,
            published_s,
            partial(behind_s, published_at=published_at, start_ms=start_ms, streams=stream_names),
            digits=2,
        )
        # [s, watermark behind (s), engine memory (MB), state stores' memory (MB),
        # checkpoints (MB), files in the tables, files on disk]
        report["timeline"] = [
            [
                round(x["t"] - published_at),
                behind_s(x, published_at, start_ms, set(expected)),
                memory_mb(x),
                memory_mb(x, name=STATE_MEMORY),
                *disk.values(),
            ]
            for x in during
            if (disk := x.get("disk"))
        ]
        engine_health = read_health(lakehouse, "engine") or {}
        report["engine"] = {k: engine_health.get(k) for k in ("streams", "maintenance")}
        # Committed landing files leave the folder: what is left is the last batch's.
        report["landing_files_left"] = len(list(Path(lakehouse, "_landing").rglob("part-*")))
    finally:
        sampler.stopped.set()
        commits.stopped.set()
        for back in restarts:
            back.cancel()
        for part in (*publishers, *parts.values()):
            part.stop()
        broker.stop()
        if cluster is not None:
            cluster.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, default=str, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    alerts_ok = (
        report.get("alerts_equal") if want_ids is not None else not report.get("alerts_twice")
    )
    ok = report.get("readings_once") and alerts_ok and report.get("late_equal")
    print("PASS" if ok else "FAIL", f"(median latency {statistics.median(latency):.2f} s)"
          if latency else "")  # fmt: skip
    return 0 if ok else 1


def detected(alert: dict) -> float:
    """When the engine's stateful step wrote `alert` (epoch seconds)."""
    return alert["detected_at"].timestamp()


def alert_latency(
    plan: Plan,
    timing: dict[str, tuple[float, float]],
    alerts: list[dict],
    seen_at: Callable[[dict], float] = detected,
) -> tuple[list[float], list[tuple[float, float]]]:
    """Each alert's latency from the publication of the reading that completes it to
    `seen_at` it, and the same with that wall time.

    Publication time of event time t: t + the fastest delivery seen on its stream
    (`stream_timing`). Only alerts the stream itself completes count: those whose event
    time the watermark passed before the end (the rest were closed by the final
    heartbeat)."""
    stream_of = {}
    for sources in components(plan):
        for _, stage in fed_stages(plan, sources):
            for sink in stage_sinks(stage):
                stream_of[sink] = sources[0]
    latency, timed = [], []
    for a in alerts:
        stream = stream_of.get(a["rule"])
        if stream not in timing:
            continue
        offset, newest = timing[stream]
        if a["event_time"].timestamp() < newest - plan.streams[stream].slack_ms / 1000:
            at = seen_at(a)
            value = at - a["event_time"].timestamp() - offset
            latency.append(value)
            timed.append((at, value))
    return latency, timed


def by_period(timed: list[tuple[float, float]], since: float, period_s: float) -> list[dict]:
    """Latency p50 / p99 per `period_s` of wall time from `since` (epoch seconds)."""
    periods: dict[int, list[float]] = {}
    for at, value in timed:
        periods.setdefault(int((at - since) // period_s), []).append(value)
    return [
        {"from_s": round(k * period_s), "alerts": len(v),
         "p50_s": percentile(v, 0.5), "p99_s": percentile(v, 0.99)}
        for k, v in sorted(periods.items())
    ]  # fmt: skip


def settled(measure: Callable[[], int], quiet_s: float) -> Callable[[], bool]:
    """A check that is true once `measure` has not changed for `quiet_s` seconds."""
    last: list[float | int | None] = [None, time.monotonic()]  # value, since when

    def check() -> bool:
        value = measure()
        if value != last[0]:
            last[:] = [value, time.monotonic()]
        return time.monotonic() - float(last[1] or 0) >= quiet_s

    return check


RECOVERED_FOR_S = 15.0
"""How long alerts must stay on time for a fault to count as recovered from."""


def recovery(
    struck: list[tuple[str, float]],
    timed: list[tuple[float, float]],
    on_time_s: float,
    started_wall: float,
) -> list[dict[str, Any]]:
    """For each fault (name, wall time): how long after it the alerts were on time
    again: the first alert from which on, for `RECOVERED_FOR_S`, every alert's latency
    was within `on_time_s` (the p99 target; None: not before the end), and the worst
    latency of the alerts written before that."""
    timed = sorted(timed)
    times = [t for t, _ in timed]
    found = []
    for fault, at in struck:
        back = None
        for i in range(bisect.bisect_left(times, at), len(timed)):
            t = times[i]
            if times[-1] < t + RECOVERED_FOR_S:
                break
            window = timed[i : bisect.bisect_right(times, t + RECOVERED_FOR_S)]
            if max(latency for _, latency in window) <= on_time_s:
                back = t - at
                break
        before = [latency for t, latency in timed if at <= t and (back is None or t < at + back)]
        found.append({"fault": fault, "at_s": round(at - started_wall, 1),
                      "on_time_after_s": None if back is None else round(back, 1),
                      "worst_latency_s": round(max(before), 2) if before else None})  # fmt: skip
    return found


def progress(
    samples: list[dict[str, Any]], published_at: float, start_ms: int, streams: set[str]
) -> str:
    """A line on the run so far: the watermark's lag, engine memory, checkpoints, files."""
    last = samples[-1]
    disk: dict[str, float] = next((x["disk"] for x in reversed(samples) if "disk" in x), {})
    parts = ", ".join(
        f"{process} {memory_mb(last, process):,.0f}"
        for process in sorted(label_values(last, RESIDENT, "process"))
    )
    return (
        f"{(last['t'] - published_at) / 60:5.1f} min  watermark "
        f"{behind_s(last, published_at, start_ms, streams)} s behind, engine "
        f"{memory_mb(last):,.0f} MB ({parts}; state stores "
        f"{memory_mb(last, name=STATE_MEMORY):,.0f} MB), "
        f"checkpoints {disk.get('checkpoints_mb', 0):,.0f} MB, "
        f"{disk.get('table_files', 0):,} files in the tables ({disk.get('files_on_disk', 0):,} "
        "on disk)"
    )


def expected_alert_ids(rule_set: RuleSet, streams: list[Simulated]) -> set[str]:
    """The ids of the alerts an undisturbed run gives: `lookout replay`'s evaluation of
    the same readings (its Arrow reader, batches and collector)."""
    plan = rule_set.plan
    readings = Readings(parse_inputs([f"{sim.stream}={sim.recording}" for sim in streams], plan))
    return set(alert_ids(plan, ordered_outputs(evaluate(plan, readings).emitted)))


if __name__ == "__main__":
    sys.exit(main())
