"""Publish rate and CPU cost of ``lookout simulate`` to a real mosquitto (QoS 1).

Starts a private mosquitto on an ephemeral loopback port and runs the simulator CLI
against it: ``traffic`` unpaced (``--speedup 0``) at several batch sizes, then paced at
the target of 20k readings/s with a QoS 1 subscriber counting what arrives (readings/s);
then ``traffic`` and ``rfid`` each paced at 20k readings/s in messages of 20 readings
with the options ``pipeline_faults.py`` gives them (episodes, bounded disorder, late and
duplicate readings, heartbeats), measuring the CPU seconds the simulator process used
(start-up included) per reading sent. ``--baseline DIR`` measures the CPU of the
simulators of another checkout (``git worktree add``) in the same run, for a before and
after.

    .venv/bin/python benchmarks/simulate_rate.py [--seconds 10] [--cpu-seconds 60]
        [--only rate|cpu] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
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
REPO = Path(__file__).resolve().parent.parent
#: The simulators' options in `pipeline_faults.py` (its `simulated_streams`), by kind.
PIPELINE = {
    "traffic": ["--stations", "40", "--congestion", "3@10+30,7@20", "--silent", "5@15+20",
                "--speeding", "2@5"],
    "rfid": [],
}  # fmt: skip
PIPELINE_COMMON = ["--seed", "1", "--start", "2026-03-02T06:00:00+00:00",
                   "--disorder", "bounded:1", "--late-fraction", "0.002",
                   "--duplicate-fraction", "0.002"]  # fmt: skip


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


def run_cli(port: int, argv: list[str], code: Path = REPO) -> tuple[int, float, float]:
    """Run the simulator CLI of the checkout `code`; return (readings sent, wall seconds,
    CPU seconds of the process, start-up included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "simulators.cli", *argv, "--port", str(port)],
        capture_output=True,
        text=True,
        check=True,
        cwd=code,
        env={**os.environ, "PYTHONPATH": str(code)},
    )
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    m = re.findall(r"(\d+) readings in", res.stderr)
    return int(m[-1]), wall, cpu


def simulate(port: int, *argv: str) -> tuple[int, float]:
    """Run the traffic simulator (flat profile, no heartbeats); return (readings, wall s)."""
    argv_ = ["traffic", "--profile", "flat", "--no-heartbeats", *argv]
    n, wall, _ = run_cli(port, argv_)
    return n, wall


class Counter:
    """A QoS 1 subscriber counting readings on lookout/<kind>/+/readings."""

    def __init__(self, port: int, kind: str = "traffic") -> None:
        self.n = 0
        ready = threading.Event()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-counter")
        topic = f"lookout/{kind}/+/readings"
        self.c.on_connect = lambda c, *a: c.subscribe(topic, qos=1)
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


def rates(port: int, secs: float) -> None:
    """The traffic simulator's publish rate, unpaced and paced at 20k/s, by batch size."""
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
            f"= {n / wall:>9,.0f} readings/s (incl. start-up)"
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


def cpu(port: int, secs: float, code: Path, label: str) -> None:
    """CPU per reading of each simulator paced at 20k/s in messages of 20, with the
    pipeline benchmark's options; and of its start-up alone (a run of one reading)."""
    for kind in ("traffic", "rfid"):
        argv = [kind, *PIPELINE[kind], *PIPELINE_COMMON, "--batch", "20"]
        _, _, idle = run_cli(
            port, [*argv, "--rate", "1", "--duration", "1", "--speedup", "0"], code
        )
        sub = Counter(port, kind)
        n, wall, used = run_cli(
            port, [*argv, "--rate", str(TARGET), "--duration", str(secs), "--speedup", "1"], code
        )
        time.sleep(0.5)
        got = sub.n
        sub.close()
        print(
            f"{label} {kind:<7} at {TARGET}/s: {n} readings in {wall:5.1f} s "
            f"({n / wall:,.0f}/s), CPU {used:5.1f} s = {used / n * 1e6:4.1f} us/reading "
            f"(start-up {idle:.2f} s); subscriber got "
            f"{'all' if got == n else f'{got} ({n - got} missing)'}",
            flush=True,
        )


def main() -> int:
    """Run the measurements and print them."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="event seconds per rate run")
    ap.add_argument("--cpu-seconds", type=float, default=60.0, help="event seconds per CPU run")
    ap.add_argument("--only", choices=("rate", "cpu"), help="one part of the measurements")
    ap.add_argument(
        "--baseline", type=Path, help="another checkout whose simulators' CPU to measure too"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker, port = start_broker(Path(tmp))
        try:
            print(f"mosquitto on 127.0.0.1:{port}; QoS 1, PUBACKs awaited, 1000 in flight")
            if args.only != "cpu":
                rates(port, args.seconds)
            if args.only != "rate":
                if args.baseline is not None:
                    cpu(port, args.cpu_seconds, args.baseline.resolve(), "baseline")
                cpu(port, args.cpu_seconds, REPO, "this    ")
        finally:
            broker.terminate()
            broker.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
