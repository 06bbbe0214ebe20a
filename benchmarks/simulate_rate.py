"""Sustained publish rate of ``lookout simulate traffic`` to a real mosquitto (QoS 1).

Starts a private mosquitto on an ephemeral loopback port and runs the simulator CLI
against it: unpaced (``--speedup 0``) at several batch sizes, then paced at the target
of 20k readings/s with a QoS 1 subscriber counting what arrives. Prints readings/s.

    .venv/bin/python benchmarks/simulate_rate.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import paho.mqtt.client as mqtt

TARGET = 20_000


def start_broker(tmp: Path) -> tuple[subprocess.Popen, int]:
    """mosquitto on 127.0.0.1:<free port>, persistence off, no queue limit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\n"
        "max_queued_messages 0\npersistence false\nlog_type error\n"
    )
    proc = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)])
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("mosquitto did not start")


def simulate(port: int, *argv: str) -> tuple[int, float]:
    """Run the simulator CLI; return (readings sent, wall seconds)."""
    t0 = time.monotonic()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "simulators.cli",
            "traffic",
            "--port",
            str(port),
            "--profile",
            "flat",
            "--no-heartbeats",
            *argv,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.monotonic() - t0
    m = re.findall(r"(\d+) readings in", res.stderr)
    return int(m[-1]), wall


class Counter:
    """A QoS 1 subscriber counting readings on lookout/traffic/#."""

    def __init__(self, port: int) -> None:
        self.n = 0
        ready = threading.Event()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-counter")
        self.c.on_connect = lambda c, *a: c.subscribe("lookout/traffic/#", qos=1)
        self.c.on_subscribe = lambda *a: ready.set()
        self.c.on_message = self._count
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        ready.wait(10)

    def _count(self, client, userdata, msg) -> None:
        body = orjson.loads(msg.payload)
        self.n += len(body) if isinstance(body, list) else 1

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def main() -> int:
    """Run the measurements and print them."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="event seconds per run")
    secs = ap.parse_args().seconds
    with tempfile.TemporaryDirectory() as tmp:
        broker, port = start_broker(Path(tmp))
        try:
            print(f"mosquitto on 127.0.0.1:{port}; QoS 1, PUBACKs awaited, 100 in flight")
            for batch in (1, 10, 100):
                n, wall = simulate(
                    port,
                    "--rate",
                    str(TARGET * 2),
                    "--duration",
                    str(secs),
                    "--speedup",
                    "0",
                    "--batch",
                    str(batch),
                )
                print(
                    f"unpaced  batch {batch:>3}: {n:>8} readings in {wall:5.2f} s "
                    f"= {n / wall:>9,.0f} readings/s (incl. ~0.3 s start-up)"
                )
            for batch in (1, 10, 100):
                sub = Counter(port)
                n, wall = simulate(
                    port, "--rate", str(TARGET), "--duration", str(secs), "--batch", str(batch)
                )
                time.sleep(0.5)
                got = sub.n
                sub.close()
                print(
                    f"paced {TARGET}/s batch {batch:>3}: {n} readings in {wall:5.2f} s "
                    f"= {n / wall:,.0f} readings/s wall; subscriber got {got} "
                    f"({'all' if got == n else f'{n - got} missing'})"
                )
        finally:
            broker.terminate()
            broker.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
