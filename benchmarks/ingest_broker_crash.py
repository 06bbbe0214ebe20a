"""Broker kill -9 under load: what mosquitto had acknowledged to a publisher and then lost.

mosquitto's persistence is a snapshot of its whole state written every
`autosave_interval` seconds, or, with `autosave_on_changes true`, every
`autosave_interval` changes (messages received, delivered, acknowledged). A kill -9
loses what it accepted since the last snapshot. This measures it, per setting:

1. a fresh mosquitto from `deploy/mosquitto.conf` with the setting under test;
2. an `Ingester` (in this process) subscribed with its persistent session;
3. a paho publisher (another process) sending single-reading QoS 1 messages as fast
   as it can, noting every (source, seq) the broker PUBACKed;
4. after `--seconds`, kill -9 of mosquitto; the publisher stops at the disconnect and
   reports what was PUBACKed; mosquitto is started again on the same persistence;
5. the ingester reconnects, gets what the broker kept, and lands it; when nothing more
   lands, *lost* = PUBACKed by the broker and never landed.

*live*: ingest runs during the load, so what the broker accepted is delivered to it
within milliseconds and landed whatever happens to the broker afterwards. *queued*:
ingest is away during the load (restarting, or behind), the broker holds every
message for its persistent session, and a crash loses what the last snapshot missed.

The cost of a setting is the broker's CPU time per message (from /proc, less disturbed
by other work on a shared machine than a rate) and the publisher's PUBACK rate.

    .venv/bin/python benchmarks/ingest_broker_crash.py                 # all settings
    .venv/bin/python benchmarks/ingest_broker_crash.py --setting changes:100 --runs 3
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import paho.mqtt.client as mqtt

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.service import build_ingester  # noqa: E402
from ingest.subscriber import Ingester, make_client  # noqa: E402
from lookout.broker import Broker, free_port  # noqa: E402
from lookout.config import Config, MqttConfig  # noqa: E402
from lookout.mqtt_auth import PUBLISHER, load_credentials  # noqa: E402
from rules.language.loader import load_rules  # noqa: E402

TOPIC = "lookout/traffic/1/readings"

#: setting name -> the lines appended to the shipped configuration (the last one wins).
SETTINGS = {
    "interval:1s": "autosave_interval 1\n",
    "changes:1000": "autosave_on_changes true\nautosave_interval 1000\n",
    "changes:100": "autosave_on_changes true\nautosave_interval 100\n",
    "changes:10": "autosave_on_changes true\nautosave_interval 10\n",
}


def publish_until_disconnected(host: str, port: int, credentials: str, out: str) -> None:
    """Publish QoS 1 readings (the publisher login of the `credentials` file) until the
    broker goes away; write the PUBACKed seqs to `out`."""
    logins = load_credentials(credentials)
    assert logins is not None, credentials
    mqtt_config = logins.mqtt_config(MqttConfig(host=host, port=port), PUBLISHER)
    client = make_client(mqtt_config, f"crash-pub-{os.getpid()}", True)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    gone = threading.Event()
    client.on_disconnect = lambda *_: gone.set()
    client.connect(host, port)
    client.loop_start()
    now = int(time.time() * 1000)
    waiting: list[tuple[mqtt.MQTTMessageInfo, int]] = []  # not PUBACKed when last looked
    acked: list[int] = []

    def collect() -> None:
        still = []
        for info, seq in waiting:
            if info.is_published():
                acked.append(seq)
            else:
                still.append((info, seq))
        waiting[:] = still

    seq = 0
    while not gone.is_set():
        if len(waiting) > 2000:  # stay within paho's in-flight window; do not pile up
            collect()
            if len(waiting) > 2000:
                time.sleep(0.001)
            continue
        reading = {"station": 1, "lane": 0, "speed": 20.0, "length": 4.5}
        body = orjson.dumps({**reading, "ts": now + seq, "source": "crash", "seq": seq})
        waiting.append((client.publish(TOPIC, body, 1), seq))
        seq += 1
    client.loop_stop()
    collect()
    Path(out).write_bytes(orjson.dumps({"acked": acked, "published": seq}))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _landed(landing: Path) -> Counter[int]:
    seqs: Counter[int] = Counter()
    for path in (landing / "stream=traffic").glob("part-*.jsonl"):
        seqs.update(orjson.loads(line)["seq"] for line in path.read_bytes().splitlines())
    return seqs


def _start_ingester(config: Config) -> tuple[Ingester, threading.Thread]:
    ingester = build_ingester(config, load_rules([str(ROOT / "rules")]), "crash")
    thread = threading.Thread(target=ingester.run, daemon=True)
    thread.start()
    while not ingester.stats.subscribed:
        time.sleep(0.01)
    return ingester, thread


def measure(setting: str, how: str, seconds: float, work: Path) -> dict[str, float]:
    """One run: load, kill -9, restart, drain; returns the figures."""
    broker = Broker("127.0.0.1", free_port(), work / "broker", extra_config=SETTINGS[setting])
    broker.start()
    config = Config(lakehouse=str(work / "lakehouse"), mqtt=broker.mqtt_config())
    ingester, thread = _start_ingester(config)
    try:
        time.sleep(1.5)  # the subscription itself reaches a snapshot in every setting
        if how == "queued":  # ingest away: the broker queues for its persistent session
            ingester.stop()
            thread.join(30)
        out = work / "acked.json"
        address = [broker.host, str(broker.port), config.mqtt.credentials_file]
        publisher = subprocess.Popen([sys.executable, __file__, "--publish", *address, str(out)])
        assert broker.process is not None
        time.sleep(seconds)
        cpu_s = _cpu_s(broker.process.pid)
        broker.stop(kill=True)
        publisher.wait(60)
        report = orjson.loads(out.read_bytes())
        broker.start()
        if how == "queued":
            ingester, thread = _start_ingester(config)
        quiet_since, count = time.monotonic(), -1
        while time.monotonic() - quiet_since < 5:  # drained: nothing new for 5 s
            time.sleep(0.5)
            if ingester.stats.readings != count:
                count, quiet_since = ingester.stats.readings, time.monotonic()
    finally:
        ingester.stop()
        thread.join(30)
        broker.stop()
    acked = set(report["acked"])
    landed = _landed(Path(config.landing))
    return {
        "acked": len(acked),
        "lost": len(acked - set(landed)),
        "landed_unacked": len(set(landed) - acked),
        "duplicates": sum(landed.values()) - len(landed),
        "acked_per_s": len(acked) / seconds,
        "broker_cpu_us_per_msg": cpu_s / max(len(acked), 1) * 1e6,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--publish":
        publish_until_disconnected(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--setting", choices=[*SETTINGS, "all"], default="all")
    parser.add_argument("--how", choices=["live", "queued", "both"], default="both")
    parser.add_argument("--seconds", type=float, default=4.0, help="load before the kill")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    settings = list(SETTINGS) if args.setting == "all" else [args.setting]
    print(f"load average at start: {os.getloadavg()[0]:.1f} (2 cores)", flush=True)
    hows = ["live", "queued"] if args.how == "both" else [args.how]
    for setting, how, run in itertools.product(settings, hows, range(args.runs)):
        with tempfile.TemporaryDirectory(prefix="lookout-crash-") as work:
            r = measure(setting, how, args.seconds, Path(work))
        print(
            f"{setting:13s} {how:6s} run {run + 1}: PUBACKed {r['acked']:>6,} "
            f"({r['acked_per_s']:>6,.0f}/s), lost {r['lost']:>5,}, "
            f"landed without PUBACK {r['landed_unacked']}, duplicates {r['duplicates']}; "
            f"broker {r['broker_cpu_us_per_msg']:.1f} us CPU/message",
            flush=True,
        )


if __name__ == "__main__":
    main()
