"""The whole pipeline under load, with faults: simulator → mosquitto → ingest → Spark →
Delta, every part a real process, measured end to end (issue 8).

The simulator publishes traffic at `--rate` readings/s (paced, `--batch` readings per
message, congestion and silent-detector episodes planted). At random moments of the run
(seeded) each fault in `--faults` strikes once:

* `ingest`: kill -9 of `lookout ingest`, restarted 1 s later;
* `engine`: kill -9 of `lookout engine` (the Spark driver), restarted at once;
* `broker`: mosquitto restarted (SIGTERM, which saves its persistence, then start);
* `dashboard`: kill -9 of the Streamlit server, restarted; it must answer again.

Afterwards a heartbeat a day ahead closes every window, and the tables must hold:
every generated reading in `readings_traffic` or `late_readings` exactly once (the
late ones exactly those the simulator made late, duplicates removed), and the
alerts `lookout replay` computes over the same readings (the same seed written to a
file): same ids, none twice, none missing. It prints those checks and the figures:
the achieved publish rate, the backlog drained after the last publish, and the
latency from a reading's publication to the alert row it completes (p50 / p99). The
simulator starts once every engine query has run its first batch: the latency measured
is the running pipeline's, not a cold start's (`benchmarks/first_alert.py` times that).

    python benchmarks/pipeline_faults.py --rate 20000 --duration 120 \\
        --faults ingest,engine,broker,dashboard
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import orjson
import paho.mqtt.publish as mqtt_publish
from deltalake import DeltaTable

from engine.core.replay import run as replay
from ingest.validate import heartbeat_filter
from lookout.broker import Broker, free_port
from lookout.demo import Part, lookout_argv, wait_for_parts
from lookout.health import engine_running, read_health
from lookout.mqtt_auth import PUBLISHER
from lookout.replay import alert_ids, read_readings
from rules.language.loader import RULES_DIR, RuleSet, load_rules

START = "2026-03-02T06:00:00+00:00"
FAULTS = ("ingest", "engine", "broker", "dashboard")


def count(lakehouse: Path, table: str) -> int:
    path = lakehouse / table
    return DeltaTable(str(path)).count() if (path / "_delta_log").is_dir() else 0


def rows(lakehouse: Path, table: str, columns: list[str]) -> list[dict]:
    path = lakehouse / table
    if not (path / "_delta_log").is_dir():
        return []
    return DeltaTable(str(path)).to_pyarrow_table(columns=columns).to_pylist()


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=5000)
    parser.add_argument("--duration", type=float, default=60)
    parser.add_argument("--batch", type=int, default=20, help="readings per MQTT message")
    parser.add_argument("--stations", type=int, default=40)
    parser.add_argument("--faults", default="", help=f"comma list of {', '.join(FAULTS)}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rules", default=str(RULES_DIR / "traffic.sql"))
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--json", default=None, help="also write the report to this file")
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    if unknown := set(faults) - set(FAULTS):
        parser.error(f"unknown faults {sorted(unknown)}; choose from {', '.join(FAULTS)}")

    work = Path(tempfile.mkdtemp(prefix="lookout-faults-"))
    lakehouse = work / "lakehouse"
    print(f"machine: {platform.node()}, {os.cpu_count()} cores; work folder {work}")
    sim = ["traffic", "--rate", str(args.rate), "--duration", str(args.duration),
           "--seed", str(args.seed), "--stations", str(args.stations), "--start", START,
           "--congestion", "3@10+30,7@20", "--silent", "5@15+20", "--speeding", "2@5",
           "--disorder", "bounded:1",
           "--late-fraction", "0.002", "--duplicate-fraction", "0.002", "--quiet"]  # fmt: skip

    # The undisturbed run: the same seed to a file, evaluated by replay.
    recording, truth = work / "readings.jsonl", work / "truth.jsonl"
    t0 = time.monotonic()
    subprocess.run(
        lookout_argv("simulate", *sim, "--out", str(recording), "--truth", str(truth)), check=True
    )
    lines = [orjson.loads(x) for x in recording.read_bytes().splitlines()]
    truth_lines = [orjson.loads(x) for x in truth.read_bytes().splitlines()]
    generated = {(r["source"], r["seq"]) for r in lines}
    rule_set = load_rules([args.rules])
    want_ids = expected_alert_ids(rule_set, recording)
    print(f"{len(lines):,} readings generated ({time.monotonic() - t0:.0f} s); replay: "
          f"{len(want_ids)} alerts", flush=True)  # fmt: skip

    broker = Broker("127.0.0.1", free_port(), work / "broker").start()
    dash_port = free_port()
    env = {**os.environ, "LOOKOUT_LAKEHOUSE_PATH": str(lakehouse),
           "LOOKOUT_MQTT_PORT": str(broker.port), "LOOKOUT_RULES_PATHS": args.rules,
           "LOOKOUT_MQTT_CREDENTIALS_FILE": broker.mqtt_config().credentials_file,
           # The closing heartbeat is a day ahead of the clock: let ingest accept it.
           "LOOKOUT_INGEST_MAX_FUTURE_MS": str(2 * 86_400_000),
           "LOOKOUT_DASHBOARD_PORT": str(dash_port)}  # fmt: skip
    logs = work / "logs"
    parts = {
        "ingest": Part("ingest", lookout_argv("ingest"), logs / "ingest.log"),
        "engine": Part("engine", lookout_argv("engine"), logs / "engine.log"),
        "dashboard": Part("dashboard", lookout_argv("dashboard"), logs / "dashboard.log"),
    }
    publisher = Part(
        "simulator",
        lookout_argv("simulate", *sim, "--port", str(broker.port), "--batch", str(args.batch),
                     "--speedup", "1"),
        logs / "simulator.log",
    )  # fmt: skip
    report: dict = {"rate": args.rate, "duration": args.duration, "faults": faults}
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
        parts["dashboard"].start(env)
        wait_for_parts(lambda: dashboard_up(dash_port), "the dashboard", [parts["dashboard"]], 120)

        rng = random.Random(args.seed)
        schedule = sorted((rng.uniform(0.2, 0.8) * args.duration, f) for f in faults)
        publisher.start(env)
        started = time.monotonic()
        for at, fault in schedule:
            time.sleep(max(0.0, started + at - time.monotonic()))
            print(f"{time.monotonic() - started:6.1f} s  fault: {fault}", flush=True)
            if fault == "broker":
                broker.restart()
            else:
                kill9(parts[fault])
                if fault == "ingest":
                    time.sleep(1.0)
                parts[fault].start(env)
        publisher.process.wait()
        published_s = time.monotonic() - started
        if publisher.process.returncode != 0:
            raise RuntimeError(f"the simulator failed:\n{publisher.tail()}")
        report["publish_rate"] = len(lines) / published_s
        print(f"published {len(lines):,} readings in {published_s:.1f} s "
              f"({report['publish_rate']:,.0f}/s)", flush=True)  # fmt: skip
        if "dashboard" in faults:
            wait_for_parts(lambda: dashboard_up(dash_port), "the dashboard after its kill", [], 120)
            report["dashboard_back"] = True

        end = orjson.dumps({"source": "gw", "ts": int(time.time() * 1000) + 86_400_000})
        publish_one(broker, "lookout/traffic/gw/heartbeat", end)

        def stored() -> int:
            return count(lakehouse, "readings_traffic") + count(lakehouse, "late_readings")

        report["drain_s"] = wait_for_parts(
            lambda: stored() >= len(generated),
            "every reading stored",
            [parts["engine"], parts["ingest"]],
            900,
        )
        wait_for_parts(
            lambda: count(lakehouse, "alerts") >= len(want_ids),
            "the alerts",
            [parts["engine"]],
            600,
        )
        time.sleep(5)  # anything more (a duplicate) would show up now

        readings = rows(lakehouse, "readings_traffic", ["source", "seq", "ts", "received_at"])
        late = rows(lakehouse, "late_readings", ["source", "seq"])
        keys = [(r["source"], r["seq"]) for r in readings + late]
        report["readings_once"] = len(keys) == len(set(keys)) and set(keys) == generated
        # Late capture: exactly the readings the simulator made late, none dropped.
        made_late = {(t["source"], t["seq"]) for t in truth_lines if t["type"] == "late"}
        report["late_sent"] = len(made_late)
        report["late_equal"] = {(r["source"], r["seq"]) for r in late} == made_late
        alerts = rows(lakehouse, "alerts", ["alert_id", "rule", "key", "event_time",
                                            "detected_at", "payload"])  # fmt: skip
        ids = [a["alert_id"] for a in alerts]
        report["alerts_twice"] = len(ids) - len(set(ids))
        report["alerts_missing"] = len(want_ids - set(ids))
        report["alerts_unexpected"] = [
            {k: a[k] for k in ("rule", "key", "event_time", "payload")}
            for a in alerts
            if a["alert_id"] not in want_ids
        ][:10]
        report["alerts_equal"] = len(ids) == len(set(ids)) and set(ids) == want_ids
        report["alerts"] = len(ids)
        # Publication time of event time t: t + the fastest delivery seen (received - ts).
        # Only alerts the stream itself completes count: those whose event time the
        # watermark passed before the end (the rest were closed by the final heartbeat).
        offset = min((r["received_at"] - r["ts"]).total_seconds() for r in readings)
        slack_s = rule_set.plan.streams["traffic"].slack_ms / 1000
        last = max(r["ts"] for r in readings).timestamp() - slack_s
        latency = [
            (a["detected_at"] - a["event_time"]).total_seconds() - offset
            for a in alerts
            if a["event_time"].timestamp() < last
        ]
        report["latency_alerts"] = len(latency)
        if latency:
            report["latency_p50_s"] = percentile(latency, 0.5)
            report["latency_p99_s"] = percentile(latency, 0.99)
        engine_health = read_health(lakehouse, "engine") or {}
        report["engine"] = {
            k: engine_health.get(k) for k in ("streams", "late", "batches", "maintenance")
        }
        # Committed landing files leave the folder: what is left is the last batch's.
        report["landing_files_left"] = len(list(Path(lakehouse, "_landing").rglob("part-*")))
    finally:
        for part in (publisher, *parts.values()):
            part.stop()
        broker.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, default=str, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    ok = report.get("readings_once") and report.get("alerts_equal") and report.get("late_equal")
    print("PASS" if ok else "FAIL", f"(median latency {statistics.median(latency):.2f} s)"
          if latency else "")  # fmt: skip
    return 0 if ok else 1


def expected_alert_ids(rule_set: RuleSet, recording: Path) -> set[str]:
    """The ids of the alerts an undisturbed run gives (replay of the same readings)."""
    plan = rule_set.plan
    outputs = replay(plan, read_readings([((plan.streams["traffic"],), recording)])).outputs
    return set(alert_ids(plan, outputs))


if __name__ == "__main__":
    sys.exit(main())
