"""Ingest throughput against a real mosquitto: messages/s and readings/s landed, zero loss.

Two loads, each measured two ways:

* single: one reading per MQTT message (QoS 1) -> messages/s;
* batched: `--batch` readings per message (QoS 1) -> readings/s.

* drain: the messages wait in the broker for the ingester's (offline) persistent session,
  then the ingester starts; the rate is what it lands per second from its start to the
  last message. This is ingest alone, with the publisher not competing for the 2 cores.
* live: the ingester runs while a publisher (another process) sends as fast as paho
  can; the rate is from the first message received to the last landed. On a small
  machine the publisher, the broker and ingest share the cores, so this is lower.

The landing thread's CPU time per reading is printed as well, and the whole process's
(landing thread + paho's network thread, which share one GIL; the publisher is another
process): on a machine shared with other work, they tell what ingest would do with a
core to itself (1 / whole-process CPU per reading).

Every run then reads all landed files and checks that each published (source, seq)
landed (zero loss); it prints duplicates too (there should be none without failures).

    .venv/bin/python benchmarks/ingest_throughput.py                 # all four
    .venv/bin/python benchmarks/ingest_throughput.py --load single --how drain
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.service import build_ingester  # noqa: E402
from ingest.subscriber import Ingester, make_client  # noqa: E402
from lookout.broker import Broker, free_port  # noqa: E402
from lookout.config import Config, IngestConfig, MqttConfig  # noqa: E402
from lookout.mqtt_auth import PUBLISHER, load_credentials  # noqa: E402
from rules.language.loader import load_rules  # noqa: E402

TOPIC = "lookout/traffic/1/readings"


def publish(host: str, port: int, credentials: str, messages: int, batch: int) -> None:
    """Publish `messages` QoS 1 messages of `batch` readings, with the publisher login of
    the `credentials` file; return when all are PUBACKed."""
    logins = load_credentials(credentials)
    assert logins is not None, credentials
    mqtt_config = logins.mqtt_config(MqttConfig(host=host, port=port), PUBLISHER)
    client = make_client(mqtt_config, f"bench-pub-{os.getpid()}", True)
    client.max_inflight_messages_set(2_000)
    client.max_queued_messages_set(0)
    client.connect(host, port)
    client.loop_start()
    # Stamped in the recent past, one ms apart: every reading inside ingest's clock window.
    start_ms = int(time.time() * 1000) - messages * batch
    seq = 0
    infos = []
    for _ in range(messages):
        readings = [
            {
                "station": 1,
                "lane": (seq + i) % 3,
                "speed": 21.5,
                "length": 4.5,
                "ts": start_ms + seq + i,
                "source": "bench",
                "seq": seq + i,
            }
            for i in range(batch)
        ]
        seq += batch
        infos.append(client.publish(TOPIC, orjson.dumps(readings if batch > 1 else readings[0]), 1))
        if len(infos) == 30_000:  # message ids are 16 bits: at most 65,535 unacknowledged
            for info in infos[:15_000]:
                info.wait_for_publish(120)
            del infos[:15_000]
    for info in infos:
        info.wait_for_publish(120)
    client.disconnect()
    client.loop_stop()


def _publisher(broker: Broker, messages: int, batch: int) -> subprocess.Popen[bytes]:
    credentials = broker.mqtt_config().credentials_file
    args = ["--publish", broker.host, str(broker.port), credentials, str(messages), str(batch)]
    return subprocess.Popen([sys.executable, __file__, *args])


def _run_ingester(ingester: Ingester) -> threading.Thread:
    thread = threading.Thread(target=ingester.run, daemon=True)
    thread.start()
    while not ingester.stats.subscribed:
        time.sleep(0.01)
    return thread


def measure(load: str, how: str, messages: int, batch: int, work: Path) -> dict[str, float]:
    """One run on a fresh broker and lakehouse; returns the figures."""
    batch = 1 if load == "single" else batch
    broker = Broker("127.0.0.1", free_port(), work / f"broker-{load}-{how}").start()
    config = Config(
        lakehouse=str(work / f"lakehouse-{load}-{how}"),
        mqtt=broker.mqtt_config(),
        ingest=replace(IngestConfig(), flush_ms=200, flush_messages=10_000),
    )
    rules = load_rules([str(ROOT / "rules")])
    try:
        ingester = build_ingester(config, rules)
        thread = _run_ingester(ingester)  # creates the persistent session and subscription
        if how == "drain":
            ingester.stop()
            thread.join()
            _publisher(broker, messages, batch).wait()
            ingester = build_ingester(config, rules)
            start = time.perf_counter()
            process_cpu = time.process_time()
            thread = _run_ingester(ingester)
            publisher = None
        else:
            publisher = _publisher(broker, messages, batch)
            while ingester.stats.messages == 0 and not ingester._pending:
                time.sleep(0.001)
            start = time.perf_counter()
            process_cpu = time.process_time()
        while ingester.stats.messages < messages:
            time.sleep(0.005)
        elapsed = time.perf_counter() - start
        process_cpu = time.process_time() - process_cpu
        cpu_s = ingester.stats.landing_cpu_s
        ingester.stop()
        thread.join()
        if publisher is not None:
            publisher.wait()
    finally:
        broker.stop()
    landed: Counter[int] = Counter()
    for path in (Path(config.landing) / "stream=traffic").glob("part-*.jsonl"):
        landed.update(orjson.loads(line)["seq"] for line in path.read_bytes().splitlines())
    total = messages * batch
    return {
        "messages_per_s": messages / elapsed,
        "readings_per_s": total / elapsed,
        "seconds": elapsed,
        "landing_cpu_us_per_reading": cpu_s / total * 1e6,
        "process_cpu_us_per_reading": process_cpu / total * 1e6,
        "lost": total - len(set(landed) & set(range(total))),
        "duplicates": sum(landed.values()) - len(landed),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--publish":
        host, port, credentials, messages, batch = sys.argv[2:7]
        publish(host, int(port), credentials, int(messages), int(batch))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--load", choices=["single", "batched", "both"], default="both")
    parser.add_argument("--how", choices=["drain", "live", "both"], default="both")
    parser.add_argument("--messages", type=int, default=200_000, help="single-reading messages")
    parser.add_argument("--batches", type=int, default=20_000, help="batched messages")
    parser.add_argument("--batch", type=int, default=100, help="readings per batched message")
    args = parser.parse_args()
    loads = ["single", "batched"] if args.load == "both" else [args.load]
    hows = ["drain", "live"] if args.how == "both" else [args.how]
    print(f"load average at start: {os.getloadavg()[0]:.1f} (2 cores)", flush=True)
    with tempfile.TemporaryDirectory(prefix="lookout-bench-") as work:
        for load in loads:
            for how in hows:
                count = args.messages if load == "single" else args.batches
                r = measure(load, how, count, args.batch, Path(work))
                print(
                    f"{load:8s} {how:6s} {count:>8,} msgs: {r['messages_per_s']:>9,.0f} msg/s "
                    f"{r['readings_per_s']:>10,.0f} readings/s in {r['seconds']:5.1f} s, "
                    f"lost {r['lost']}, duplicates {r['duplicates']}; landing thread "
                    f"{r['landing_cpu_us_per_reading']:.2f} us CPU/reading, whole process "
                    f"{r['process_cpu_us_per_reading']:.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
