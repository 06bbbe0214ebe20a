"""Helpers for the ingest tests: publish fast, run `python -m ingest`, read what landed."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
import paho.mqtt.client as mqtt

from ingest.subscriber import make_client
from lookout.broker import Broker
from lookout.config import MqttConfig
from lookout.mqtt_auth import PUBLISHER
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_764_000_000_000  # readings' event times start here (close enough to "now")


def traffic(seq: int, source: str = "loop-1", station: int = 1) -> dict[str, Any]:
    """One well-formed traffic reading with a unique (source, seq)."""
    return {
        "station": station,
        "lane": seq % 3,
        "speed": 20.0 + seq % 7,
        "length": 4.5,
        "ts": T0 + seq * 10,
        "source": source,
        "seq": seq,
    }


def publisher_config(broker: Broker) -> MqttConfig:
    """How a publisher (a simulator, a gateway) reaches `broker`: its publisher login."""
    assert broker.credentials is not None
    return broker.credentials.mqtt_config(broker.mqtt_config(), PUBLISHER)


class Publisher:
    """A QoS 1 publisher with its own persistent session, so it survives broker restarts.

    Like a gateway, it holds back while the broker is away; messages in flight when the
    connection dropped are resent by paho after the automatic reconnect. `wait()` returns
    once the broker acknowledged every one.
    """

    def __init__(self, broker: Broker, credentials: MqttConfig | None = None) -> None:
        # The same credential and TLS handling as ingest's own client; by default the
        # broker's publisher login.
        self.client = make_client(
            credentials or publisher_config(broker), f"test-publisher-{time.monotonic_ns()}", False
        )
        self.client.max_inflight_messages_set(1000)
        self.client.max_queued_messages_set(0)
        self.client.reconnect_delay_set(0.2, 1)
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        self.infos: list[mqtt.MQTTMessageInfo] = []

    def send(
        self, topic: str, payload: bytes | dict[str, Any] | list[Any], retain: bool = False
    ) -> None:
        """Publish one message at QoS 1 (dicts and lists are JSON-encoded)."""
        body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        while True:
            wait_for(self.client.is_connected, 60, "the publisher to reconnect", 0.01)
            info = self.client.publish(topic, body, qos=1, retain=retain)
            # Refused while the connection was dropping: paho's info would never report
            # success even if paho sends its copy later, so publish again (a duplicate
            # at worst, which the engine removes).
            if info.rc != mqtt.MQTT_ERR_NO_CONN:
                break
        self.infos.append(info)

    def wait(self, timeout: float = 60) -> None:
        """Block until the broker has acknowledged everything sent so far."""
        # Not info.wait_for_publish(): it gives up on a message published while the
        # broker was away, which paho still holds and sends after reconnecting.
        wait_for(lambda: all(i.is_published() for i in self.infos), timeout, "PUBACKs", 0.05)

    def close(self) -> None:
        """Wait for the acknowledgements, then disconnect."""
        self.wait()
        self.client.disconnect()
        self.client.loop_stop()


def publish_all(
    broker: Broker, messages: Iterable[tuple[str, Any]], credentials: MqttConfig | None = None
) -> None:
    """Publish every (topic, payload) at QoS 1 and wait for the broker's acknowledgements."""
    publisher = Publisher(broker, credentials)
    for topic, payload in messages:
        publisher.send(topic, payload)
    publisher.close()


def publish_in_background(
    broker: Broker, messages: Sequence[tuple[str, Any]], rate: float
) -> threading.Event:
    """Publish `messages` at about `rate` messages/s from a thread; the event returned is
    set when the broker acknowledged all of them."""
    done = threading.Event()

    def run() -> None:
        publisher = Publisher(broker)
        start = time.monotonic()
        for i, (topic, payload) in enumerate(messages):
            ahead = start + i / rate - time.monotonic()
            if ahead > 0.005:
                time.sleep(ahead)
            publisher.send(topic, payload)
        publisher.close()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def landed_lines(landing: Path, stream: str) -> list[dict[str, Any]]:
    """Every line landed for `stream` (or `_quarantine`), in arrival order (file, line)."""
    lines = []
    for path in sorted((landing / f"stream={stream}").glob("part-*.jsonl")):
        lines.extend(orjson.loads(line) for line in path.read_bytes().splitlines())
    return lines


def kept_payload(record: dict[str, Any]) -> bytes:
    """The first bytes of a payload a quarantine line or row keeps (text or base64)."""
    if record["payload"] is not None:
        return record["payload"].encode()
    return base64.b64decode(record["payload_b64"])


def landed_keys(landing: Path, stream: str = "traffic") -> Counter[tuple[str, int]]:
    """How many times each (source, seq) reading of `stream` landed."""
    return Counter(
        (line["source"], line["seq"])
        for line in landed_lines(landing, stream)
        if line.get("_kind") != "heartbeat"
    )


class IngestProcess:
    """`python -m ingest` as a child process, configured by environment variables."""

    def __init__(
        self,
        broker: Broker,
        lakehouse: Path,
        ingester_id: str = "0",
        *extra: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.lakehouse = lakehouse
        self.ingester_id = ingester_id
        self.log = lakehouse.parent / f"ingest-{ingester_id}.log"
        env = {
            **os.environ,
            "LOOKOUT_CONFIG": str(lakehouse.parent / "absent.toml"),
            "LOOKOUT_LAKEHOUSE_PATH": str(lakehouse),
            "LOOKOUT_MQTT_HOST": broker.host,
            "LOOKOUT_MQTT_PORT": str(broker.port),
            "LOOKOUT_MQTT_CREDENTIALS_FILE": broker.mqtt_config().credentials_file,
            **(env or {}),
        }
        cmd = [sys.executable, "-m", "ingest", "--rules", "rules", "--id", ingester_id, *extra]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)

    @property
    def health(self) -> dict[str, Any]:
        """The ingester's latest health record (empty before the first one)."""
        path = self.lakehouse / "_health" / f"ingest-{self.ingester_id}.json"
        try:
            return orjson.loads(path.read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return {}

    def wait_subscribed(self, timeout: float = 20) -> IngestProcess:
        """Wait until the broker acknowledged the subscriptions (health says so)."""

        def subscribed() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"ingest exited early:\n{self.log.read_text()}")
            return bool(self.health.get("subscribed"))

        wait_for(subscribed, timeout, "ingest to subscribe")
        return self

    def kill(self) -> None:
        """kill -9: no flush, no acknowledgement."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def terminate(self, timeout: float = 20) -> int:
        """SIGTERM and wait for the exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)
