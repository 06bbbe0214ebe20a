"""`lookout demo`: every part on the embedded default, supervised, stopped by Ctrl-C.

Start order matters for losing nothing: the broker first, then ingest (whose persistent
session must exist before the first reading is published), then the engine, the
simulators (traffic and RFID) and the dashboard. Alertmanager starts with the broker;
the notifier, which posts incidents to it, with ingest. If any part dies, the demo says
which and shows the end of its log, then stops the rest. While it runs, a status line
every 10 s says what ingest landed and whether health is red, and why
(`lookout.health.problems`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lookout.alertmanager import Alertmanager, WebhookLog, ready
from lookout.broker import Broker, port_is_open
from lookout.config import Config
from lookout.health import engine_running, problems, read_health
from lookout.mqtt_auth import load_or_create_credentials
from lookout.passwords import OPERATOR, PASSWORD_VARIABLE, read_users

STATE = Path(".lookout")
# The parts that write health records in a demo (the simulators and dashboard write none).
DEMO_PARTS = ("engine", "ingest-0")
# The RFID simulator's episode period (seconds): its first theft comes 90 s into the
# demo, its first missing item at 210 s, and both again every 4 minutes.
RFID_PERIOD_S = 240.0


@dataclass
class Part:
    """One supervised child process and its log file."""

    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, env: dict[str, str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.log, "ab")  # noqa: SIM115 - the child keeps it open
        self.process = subprocess.Popen(
            self.argv, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        stop_process(self.process, timeout)


def stop_process(process: subprocess.Popen, timeout: float) -> bool:
    """Stop a child started in a session of its own, and whatever its group still holds.

    Its own process first: `lookout engine` stops its queries and then Spark's JVM
    itself (a SIGTERM to the JVM too would stop Spark under the queries). Returns
    whether it ended within `timeout`; if not, its group is killed."""
    process.terminate()
    try:
        process.wait(timeout)
        leftover = signal.SIGTERM  # its children, if any are left, may end cleanly
        stopped = True
    except subprocess.TimeoutExpired:
        leftover = signal.SIGKILL
        stopped = False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, leftover)
    process.wait()
    return stopped


def lookout_argv(*args: str) -> list[str]:
    """The command line of a `lookout` sub-command run with this interpreter."""
    return [sys.executable, "-m", "lookout.cli", *args]


def wait_for_parts(check: Callable[[], Any], what: str, parts: list[Part], timeout: float) -> float:
    """Poll `check` until it is true; returns the seconds it took. Raises if one of
    `parts` exits meanwhile (with the end of its log) or after `timeout` seconds."""
    started = time.monotonic()
    while not check():
        for part in parts:
            if part.process is not None and part.process.poll() is not None:
                raise RuntimeError(f"{part.name} exited while waiting for {what}:\n{part.tail()}")
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)
    return time.monotonic() - started


def _say(text: str) -> None:
    print(f"[lookout demo] {text}", flush=True)


def status_line(config: Config, now_ms: int) -> str:
    """The demo's periodic line: what ingest landed, then `health: ok`, or `health: RED`
    and each reason (the same as the dashboard's Health page)."""
    records = {part: read_health(config.lakehouse, part, config.s3) for part in DEMO_PARTS}
    ingest = records["ingest-0"] or {}
    found = problems(records, config.health, config.dashboard.down_after_seconds, now_ms)
    verdict = "RED: " + "; ".join(p.text for p in found) if found else "ok"
    return (
        f"ingest: {ingest.get('readings', 0)} readings landed, "
        f"{ingest.get('quarantined', 0)} quarantined, "
        f"{ingest.get('readings_per_s', 0):.0f}/s; health: {verdict}"
    )


def simulator_argvs(config: Config, args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """The demo's simulators as (name, command line): the traffic stations, and the
    warehouse doors unless `--rfid-rate 0`. Both run until stopped, on the wall clock."""
    mqtt = ["--host", config.mqtt.host, "--port", str(config.mqtt.port), "--duration", "0"]
    traffic = ["--rate", str(args.rate), "--stations", str(args.stations)]
    traffic += ["--congestion", args.congestion]
    found = [("traffic-simulator", lookout_argv("simulate", "traffic", *mqtt, *traffic))]
    if args.rfid_rate > 0:
        # One of each planted episode per period (evenly spaced, in this order): packing
        # groups, a theft, an authorised exit, a missing item. The doors are the default
        # layout rules/doors.csv describes.
        rfid = ["--rate", str(args.rfid_rate), "--period", str(RFID_PERIOD_S)]
        rfid += ["--packing", "1", "--theft", "1", "--authorised-exit", "1", "--missing", "1"]
        found.append(("rfid-simulator", lookout_argv("simulate", "rfid", *mqtt, *rfid)))
    return found


def dashboard_sign_in(config: Config, env: dict[str, str]) -> tuple[dict[str, str], str]:
    """The dashboard's environment and how to sign in to it. Sign-in stays on: with no
    account set up, this demo's `operator` gets a new random password (printed, never
    written down)."""
    if not config.dashboard.login:
        return env, "sign-in is off ([dashboard] login = false)"
    if read_users(Path(config.dashboard.users_file)) or env.get(PASSWORD_VARIABLE):
        return env, "sign in with your dashboard account"
    password = secrets.token_urlsafe(12)
    return {**env, PASSWORD_VARIABLE: password}, (
        f"sign in as {OPERATOR} with the password {password} (new for this demo)"
    )


def local_broker(config: Config) -> Broker:
    """The shipped mosquitto on `[mqtt]`'s address, its state in .lookout/broker, logging
    clients in with the installation's credentials (made on first use)."""
    credentials = load_or_create_credentials(config.mqtt.credentials_file)
    return Broker(
        config.mqtt.host, config.mqtt.port, (STATE / "broker").resolve(), credentials=credentials
    )


def local_alertmanager(config: Config, webhook_url: str) -> Alertmanager:
    """The shipped Alertmanager on `[alertmanager] url`'s loopback address and port, its
    state in .lookout/alertmanager, its one receiver the webhook at `webhook_url`."""
    where = urlsplit(config.alertmanager.url)
    if where.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise RuntimeError(
            f"[alertmanager] url {config.alertmanager.url} is not on this machine's loopback: "
            "Lookout starts its own Alertmanager only there"
        )
    return Alertmanager(
        where.hostname, where.port or 9820, (STATE / "alertmanager").resolve(), webhook_url
    )


def start_alerting(config: Config) -> tuple[Alertmanager | None, WebhookLog | None]:
    """The demo's Alertmanager and the webhook receiver that logs its notifications to
    .lookout/logs/notifications.jsonl, unless one already answers at `[alertmanager] url`
    (or routing is off): then (None, None)."""
    if not config.alertmanager.enabled:
        _say("not routing incidents ([alertmanager] enabled = false)")
        return None, None
    if ready(config.alertmanager.url):
        _say(f"posting incidents to the Alertmanager at {config.alertmanager.url}")
        return None, None
    log_path = (STATE / "logs" / "notifications.jsonl").resolve()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    webhook = WebhookLog(log_path=log_path).start()
    manager = local_alertmanager(config, webhook.url).start()
    _say(f"Alertmanager on {manager.url}; its notifications go to {log_path}")
    return manager, webhook


def run_broker(config: Config) -> int:
    """`lookout broker`: run the local broker until Ctrl-C (or SIGTERM)."""
    broker = local_broker(config)
    if port_is_open(broker.host, broker.port):
        _say(f"{broker.host}:{broker.port} is taken (another broker?)")
        return 1
    # Before the start: a SIGTERM while mosquitto starts (its port may already be open)
    # must stop it too, not kill this process and leave mosquitto in its own session.
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    broker.start()
    assert broker.credentials is not None and broker.process is not None
    print(
        f"mosquitto on {broker.host}:{broker.port}, logins in {broker.credentials.path}, "
        f"state and log in {broker.state_dir}; Ctrl-C stops it",
        flush=True,
    )
    try:
        while not stopping.is_set() and broker.process.poll() is None:
            stopping.wait(0.5)
    except KeyboardInterrupt:
        stopping.set()
    if not stopping.is_set():
        _say(f"mosquitto exited; see {broker.log_file}")
    broker.stop()
    return 0 if stopping.is_set() else 1


def run_demo(config: Config, args: argparse.Namespace) -> int:
    """Run the whole pipeline until Ctrl-C; returns the exit code."""
    logs = STATE / "logs"
    credentials = load_or_create_credentials(config.mqtt.credentials_file)
    env = {
        **os.environ,
        "LOOKOUT_LAKEHOUSE_PATH": config.lakehouse,
        # Every part reads the same logins, wherever it runs from.
        "LOOKOUT_MQTT_CREDENTIALS_FILE": str(credentials.path.resolve()),
    }
    dashboard_env, sign_in = dashboard_sign_in(config, env)
    broker = None
    if not port_is_open(config.mqtt.host, config.mqtt.port):
        _say(f"starting mosquitto on {config.mqtt.host}:{config.mqtt.port}")
        broker = local_broker(config).start()
    else:
        _say(
            f"using the MQTT broker already listening on {config.mqtt.host}:{config.mqtt.port} "
            f"(it must accept the logins in {credentials.path})"
        )
    if port_is_open(config.dashboard.address, config.dashboard.port):
        _say(
            f"port {config.dashboard.port} is taken (another dashboard?); stop it or set "
            "LOOKOUT_DASHBOARD_PORT"
        )
        if broker is not None:
            broker.stop()
        return 1
    try:
        manager, webhook = start_alerting(config)
    except RuntimeError as err:
        _say(str(err))
        if broker is not None:
            broker.stop()
        return 1
    parts = [
        Part("ingest", lookout_argv("ingest"), logs / "ingest.log"),
        Part("engine", lookout_argv("engine"), logs / "engine.log"),
        Part("dashboard", lookout_argv("dashboard"), logs / "dashboard.log"),
    ]
    simulators = [
        Part(name, argv, logs / f"{name}.log") for name, argv in simulator_argvs(config, args)
    ]
    # The notifier reads the incidents table on its own schedule: it needs no engine yet.
    notifier = Part("notifier", lookout_argv("notify"), logs / "notify.log")
    stopping = threading.Event()  # set by the handler; only read here (is_set takes no lock)

    def on_signal(_signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    started: list[Part] = []
    try:
        ingest, engine, dashboard = parts
        since_ms = int(time.time() * 1000)
        first = (ingest, engine, notifier) if config.alertmanager.enabled else (ingest, engine)
        for part in first:
            part.start(env)
            started.append(part)
        _say("waiting for ingest to subscribe (logs in .lookout/logs/)")
        wait_for_parts(
            lambda: (read_health(config.lakehouse, "ingest-0", config.s3) or {}).get("subscribed"),
            "ingest",
            started,
            60,
        )
        _say("waiting for the Spark engine to start its queries (first run downloads Delta)")
        wait_for_parts(
            lambda: engine_running(read_health(config.lakehouse, "engine", config.s3), since_ms),
            "the engine",
            started,
            900,
        )
        for simulator in simulators:
            simulator.start(env)
            started.append(simulator)
        dashboard.start(dashboard_env)  # `lookout dashboard` passes on what it needs only
        started.append(dashboard)
        url = f"http://{config.dashboard.address}:{config.dashboard.port}"
        wait_for_parts(
            lambda: port_is_open(config.dashboard.address, config.dashboard.port),
            "the dashboard",
            started,
            60,
        )
        _say(f"dashboard: {url}   ({sign_in}; Ctrl-C stops everything)")
        while not stopping.is_set():
            for part in started:
                if part.process is not None and part.process.poll() is not None:
                    _say(f"{part.name} stopped unexpectedly; the end of its log:\n{part.tail()}")
                    return 1
            _say(status_line(config, int(time.time() * 1000)))
            for _ in range(20):
                if stopping.is_set():
                    break
                time.sleep(0.5)
        return 0
    except RuntimeError as err:
        _say(str(err))
        return 1
    finally:
        _say("stopping")
        for part in reversed(started):
            part.stop()
        if manager is not None:
            manager.stop()
        if webhook is not None:
            webhook.stop()
        if broker is not None:
            broker.stop()
