"""The MQTT side of ingest: subscribe, validate, land durably, then acknowledge.

One `Ingester` is one paho client with a persistent session (clean_session=False, a
stable client id) and manual acknowledgement: a QoS 1 message is PUBACKed only after
the landing file holding its readings (or its quarantine record) has been fsynced and
renamed into place. If the process dies before that, the broker redelivers it
(DESIGN §7); the engine removes the duplicates that this can create.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import paho.mqtt.client as mqtt

from ingest.landing import LandingWriter
from ingest.validate import Validator
from lookout.config import IngestConfig, MqttConfig

log = logging.getLogger("lookout.ingest")


@dataclass
class IngestStats:
    """Counters the dashboard's health page shows (written as JSON every second)."""

    ingester: str
    messages: int = 0
    readings: int = 0
    heartbeats: int = 0
    quarantined: int = 0
    files: int = 0
    connected: bool = False
    last_landing_lag_ms: float = 0.0
    started_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def as_json(self, now_ms: int, rates: dict[str, float]) -> bytes:
        return orjson.dumps({**self.__dict__, **rates, "updated_at_ms": now_ms})


@dataclass(frozen=True)
class _Message:
    mid: int
    qos: int
    topic: str
    payload: bytes
    received_ms: int


def make_client(mqtt_config: MqttConfig, client_id: str, clean_session: bool) -> mqtt.Client:
    """A paho client with credentials and TLS taken from configuration (never logged)."""
    client = mqtt.Client(
        callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
        client_id=client_id,
        clean_session=clean_session,
        protocol=mqtt.MQTTv311,
        manual_ack=True,
    )
    if mqtt_config.username:
        client.username_pw_set(mqtt_config.username, mqtt_config.password or None)
    if mqtt_config.tls_ca:
        client.tls_set(
            ca_certs=mqtt_config.tls_ca,
            certfile=mqtt_config.tls_cert or None,
            keyfile=mqtt_config.tls_key or None,
            cert_reqs=ssl.CERT_REQUIRED,
        )
    client.reconnect_delay_set(min_delay=1, max_delay=30)
    return client


class Ingester:
    """Subscribes to every stream's topics and lands what arrives.

    `share_group` puts this ingester in an MQTT shared subscription so several
    processes split the load; each needs its own `ingester_id`.
    """

    def __init__(
        self,
        validator: Validator,
        landing_root: str | Path,
        health_dir: str | Path,
        mqtt_config: MqttConfig,
        ingest_config: IngestConfig,
        ingester_id: str = "0",
        share_group: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.validator = validator
        self.writer = LandingWriter(landing_root, ingester_id)
        self.health_file = Path(health_dir) / f"ingest-{ingester_id}.json"
        self.mqtt_config = mqtt_config
        self.config = ingest_config
        self.share_group = share_group
        self.clock = clock
        self.stats = IngestStats(ingester=ingester_id)
        self._pending: list[_Message] = []
        self._wake = threading.Condition()
        self._stopping = threading.Event()
        self._client = make_client(
            mqtt_config, f"lookout-ingest-{ingester_id}", clean_session=False
        )
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._last_health = 0.0
        self._last_counts = (0, 0, 0.0)

    # -- paho callbacks (network thread) -------------------------------------------
    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            log.error("broker refused the connection: %s", reason)
            return
        self.stats.connected = True
        topics = self.validator.subscriptions()
        if self.share_group:
            topics = [f"$share/{self.share_group}/{t}" for t in topics]
        client.subscribe([(t, self.mqtt_config.qos) for t in topics])
        log.info(
            "connected to %s:%s, subscribed to %s",
            self.mqtt_config.host,
            self.mqtt_config.port,
            topics,
        )

    def _on_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        self.stats.connected = False
        if not self._stopping.is_set():
            log.warning("disconnected from the broker (%s); reconnecting", reason)

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        message = _Message(msg.mid, msg.qos, msg.topic, msg.payload, int(self.clock() * 1000))
        with self._wake:
            self._pending.append(message)
            if len(self._pending) >= self.config.flush_messages:
                self._wake.notify()

    # -- main loop -------------------------------------------------------------------
    def start(self) -> None:
        """Connect (retrying until the broker answers) and start the network thread."""
        self._client.connect_async(self.mqtt_config.host, self.mqtt_config.port, keepalive=30)
        self._client.loop_start()

    def run(self) -> None:
        """Land and acknowledge until `stop()` is called; then flush what is left."""
        self.start()
        try:
            while not self._stopping.is_set():
                self.step(self.config.flush_ms / 1000)
        finally:
            self.step(0)
            self._client.disconnect()
            self._client.loop_stop()
            self.write_health(force=True)

    def stop(self) -> None:
        """Ask `run()` to flush, acknowledge and return (safe from a signal handler)."""
        self._stopping.set()
        with self._wake:
            self._wake.notify()

    def step(self, wait_s: float) -> int:
        """Wait up to `wait_s` for messages, then land and acknowledge them all."""
        with self._wake:
            if len(self._pending) < self.config.flush_messages and wait_s > 0:
                self._wake.wait(wait_s)
            batch, self._pending = self._pending, []
        if batch:
            self._land(batch)
        self.write_health()
        return len(batch)

    def _land(self, batch: list[_Message]) -> None:
        now_ms = int(self.clock() * 1000)
        for message in batch:
            result = self.validator.validate(message.topic, message.payload, now_ms)
            for reading in result.readings:
                self.writer.add_reading(result.stream, reading, message.topic, message.received_ms)
            for heartbeat in result.heartbeats:
                self.writer.add_heartbeat(result.stream, heartbeat, message.received_ms)
            for rejection in result.rejections:
                self.writer.add_rejection(
                    rejection.topic, rejection.reason, rejection.payload, message.received_ms
                )
            self.stats.readings += len(result.readings)
            self.stats.heartbeats += len(result.heartbeats)
            self.stats.quarantined += len(result.rejections)
        self.stats.files += len(self.writer.flush())
        # Durable now: only from here on may the broker forget these messages.
        for message in batch:
            if message.qos > 0:
                self._client.ack(message.mid, message.qos)
        self.stats.messages += len(batch)
        landed_ms = self.clock() * 1000
        self.stats.last_landing_lag_ms = landed_ms - batch[0].received_ms

    def write_health(self, force: bool = False) -> None:
        """Write counters and rates for the dashboard, about once a second."""
        now = self.clock()
        elapsed = now - self._last_health
        if not force and elapsed < 1.0:
            return
        messages, readings, _ = self._last_counts
        rates = {
            "messages_per_s": (self.stats.messages - messages) / elapsed if elapsed else 0.0,
            "readings_per_s": (self.stats.readings - readings) / elapsed if elapsed else 0.0,
        }
        self._last_counts = (self.stats.messages, self.stats.readings, now)
        self._last_health = now
        self.health_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.health_file.with_suffix(".tmp")
        tmp.write_bytes(self.stats.as_json(int(now * 1000), rates))
        tmp.replace(self.health_file)
