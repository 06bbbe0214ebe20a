"""The MQTT side of ingest: subscribe, validate, land durably, then acknowledge.

One `Ingester` is one paho client with a persistent session (clean_session=False, a
stable client id that only this installation knows: `lookout.mqtt_auth`) and manual
acknowledgement: a QoS 1 message is PUBACKed only after the landing file holding its
readings (or its quarantine record) has been fsynced and renamed into place. If the
process dies before that, the broker redelivers it; the engine removes the
duplicates that this can create.

Retained messages: over MQTT 3.1.1 the broker sends every retained message again at
each subscription, flagged `retain` (a message forwarded as it is published never is).
Such a copy is landed only on a connection whose session is new; on one that resumed
its session the message was delivered before, so the copy is acknowledged, counted
(`retained_repeats`) and not landed again. (MQTT 5's retain handling would let the
broker skip them, but paho's MQTT 5 costs about 15 µs more per message: measured.)

Threads: paho's network thread only appends received messages to a list; the thread
that called `run()` validates, lands and acknowledges them every `flush_ms` or every
`flush_messages` messages, whichever comes first.

Reconnection: paho reconnects by itself with exponential backoff (1 s doubling to 30 s).
Message ids are only meaningful within one connection, so a message received before a
reconnect is landed but not acknowledged afterwards: the persistent session makes the
broker send it again (flagged as a duplicate), and that copy is acknowledged.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import paho.mqtt.client as mqtt
from paho.mqtt.client import PUBACK

from ingest import metrics
from ingest.heartbeats import SilenceHeartbeats
from ingest.landing import LandingWriter
from ingest.object_store import ObjectStore
from ingest.validate import Rejection, Validated, Validator
from lookout.config import IngestConfig, MqttConfig, S3Config
from lookout.health import write_health
from lookout.storage import DEFAULT_S3

log = logging.getLogger("lookout.ingest")

#: A PUBACK packet: type, remaining length 2, message id.
_PUBACK = struct.Struct("!BBH")

#: Pauses before landing again while the landing storage fails (disk full, read-only,
#: unmounted, object store down): the first, doubling up to the last.
LANDING_RETRY_FIRST_S = 0.25
LANDING_RETRY_MAX_S = 8.0


@dataclass
class IngestStats:
    """Counters the dashboard's health page shows (written as JSON about every second).

    Totals since start, except `landing_lag_ms_max` (since the previous health write).
    `landing_cpu_s` is the CPU time spent validating, landing and acknowledging: against
    the wall clock it says how close the landing thread is to saturation.
    `redelivered` counts messages the broker flagged as sent before: each may be landed
    twice, and the engine's dedupe by (source, seq) removes the copy.
    """

    ingester: str
    messages: int = 0
    readings: int = 0
    heartbeats: int = 0
    heartbeats_emitted: int = 0
    quarantined: int = 0
    redelivered: int = 0
    retained_repeats: int = 0
    files: int = 0
    connects: int = 0
    connected: bool = False
    subscribed: bool = False
    pending: int = 0
    last_error: str = ""
    # When the landing storage started failing (0: it works): nothing is acknowledged
    # meanwhile, and the broker keeps the messages.
    landing_failing_since_ms: int = 0
    landing_cpu_s: float = 0.0
    last_landing_lag_ms: float = 0.0
    landing_lag_ms_max: float = 0.0
    started_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))


class _Message(NamedTuple):
    mid: int
    qos: int
    topic: str
    payload: bytes
    received_ms: int
    dup: bool
    connection: int  # which connection it came on: its mid means nothing on another
    retained_repeat: bool  # a retained copy re-sent at a resumed session's subscription


def make_client(mqtt_config: MqttConfig, client_id: str, clean_session: bool) -> mqtt.Client:
    """A paho client with credentials and TLS taken from configuration (never logged).

    A password that would go to a host other than this machine's without TLS is warned
    about.
    """
    client = mqtt.Client(
        callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
        client_id=client_id,
        clean_session=clean_session,
        protocol=mqtt.MQTTv311,
        manual_ack=True,
    )
    tls = bool(mqtt_config.tls_ca or mqtt_config.tls_cert)
    if mqtt_config.username:
        client.username_pw_set(mqtt_config.username, mqtt_config.password or None)
        if mqtt_config.password and not tls and not is_loopback(mqtt_config.host):
            log.warning(
                "the MQTT password goes to %s unencrypted: set [mqtt] tls_ca (and run the "
                "broker with TLS, docs/ingest.md)",
                mqtt_config.host,
            )
    if tls:
        client.tls_set(
            ca_certs=mqtt_config.tls_ca or None,  # None: the system's trusted CAs
            certfile=mqtt_config.tls_cert or None,
            keyfile=mqtt_config.tls_key or None,
            cert_reqs=ssl.CERT_REQUIRED,
        )
    client.reconnect_delay_set(min_delay=1, max_delay=30)
    return client


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine (an address is not resolved: a name other than
    localhost counts as another machine)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Ingester:
    """Subscribes to every stream's topics and lands what arrives.

    `share_group` puts this ingester in an MQTT shared subscription so several
    processes split the load; each needs its own `ingester_id`. `heartbeat_after_s`
    turns on heartbeats for silent streams (see `ingest.heartbeats`). `client_id` is
    the MQTT client id, the same at every start (it names the persistent session).
    """

    def __init__(
        self,
        validator: Validator,
        landing_root: str | Path | ObjectStore,
        lakehouse: str,
        mqtt_config: MqttConfig,
        ingest_config: IngestConfig,
        ingester_id: str = "0",
        share_group: str | None = None,
        heartbeat_after_s: float | None = None,
        clock: Callable[[], float] = time.time,
        s3: S3Config = DEFAULT_S3,
        *,
        client_id: str,
    ) -> None:
        self.validator = validator
        self.writer = LandingWriter(
            landing_root, ingester_id, ingest_config.quarantine_payload_bytes
        )
        self.lakehouse = lakehouse  # where the health record goes (reached as `s3` says)
        self.s3 = s3
        self.mqtt_config = mqtt_config
        self.config = ingest_config
        self.share_group = share_group
        self.clock = clock
        self.silence = (
            SilenceHeartbeats(round(heartbeat_after_s * 1000)) if heartbeat_after_s else None
        )
        self.stats = IngestStats(ingester=ingester_id)
        metrics.watch(self.stats)
        self._pending: list[_Message] = []
        self._wake = threading.Condition()
        self._stopping = threading.Event()
        self._connection = 0
        self._session_resumed = False  # whether the current connection resumed a session
        self._client = make_client(mqtt_config, client_id, clean_session=False)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe
        self._timestamps = {
            s.name: s.timestamp for s in validator.streams if s.timestamp is not None
        }
        self._last_health = clock()
        self._last_counts = (0, 0)
        self._health_error = ""  # why the last health write failed (logged once)

    # -- paho callbacks (network thread) -------------------------------------------
    def _on_connect(self, client: mqtt.Client, _u: Any, flags: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            self.stats.last_error = f"broker refused the connection: {reason}"
            log.error("%s", self.stats.last_error)
            return
        self._session_resumed = flags.session_present
        self._connection += 1
        self.stats.connects += 1
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

    def _on_subscribe(self, _c: mqtt.Client, _u: Any, _mid: int, reasons: Any, _p: Any) -> None:
        refused = [r for r in reasons if r.is_failure]
        if refused:
            self.stats.last_error = f"subscription refused: {refused}"
            log.error("%s", self.stats.last_error)
        self.stats.subscribed = not refused

    def _on_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        was_connected = self.stats.connected  # not after a refusal: keep its reason
        self.stats.connected = self.stats.subscribed = False
        if was_connected and not self._stopping.is_set():
            self.stats.last_error = f"disconnected: {reason}"
            log.warning("disconnected from the broker (%s); reconnecting", reason)

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        message = _Message(
            msg.mid,
            msg.qos,
            msg.topic,
            # paho types it for publishing too; a received payload is bytes (struct.unpack)
            msg.payload,  # type: ignore[arg-type]
            int(self.clock() * 1000),
            msg.dup,
            self._connection,
            msg.retain and self._session_resumed,
        )
        with self._wake:
            self._pending.append(message)
            if len(self._pending) >= self.config.flush_messages:
                self._wake.notify()

    # -- main loop -------------------------------------------------------------------
    def start(self) -> None:
        """Connect (retrying until the broker answers) and start the network thread."""
        for orphan in self.writer.remove_orphans():
            log.info("removed %s, left by an earlier run that was killed", orphan.name)
        log.info("landing into %s", self.writer.store or self.writer.root)
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
            self._client.disconnect()  # queued after the last PUBACKs, so sent after them
            self._client.loop_stop()
            self.stats.connected = self.stats.subscribed = False
            self.write_health(force=True)

    def stop(self) -> None:
        """Ask `run()` to flush, acknowledge and return.

        Safe to call from a signal handler: it takes no lock (`run()` notices within
        `flush_ms`).
        """
        self._stopping.set()

    def step(self, wait_s: float) -> int:
        """Wait up to `wait_s` for messages, then land and acknowledge them all."""
        with self._wake:
            if len(self._pending) < self.config.flush_messages and wait_s > 0:
                self._wake.wait(wait_s)
            batch, self._pending = self._pending, []
        cpu = time.thread_time()
        self._land(batch)
        self.stats.landing_cpu_s += time.thread_time() - cpu
        self.write_health()
        return len(batch)

    def _land(self, batch: list[_Message]) -> None:
        now_ms = int(self.clock() * 1000)
        silence = self.silence
        repeats = 0
        for message in batch:
            if message.retained_repeat:  # landed when first delivered; acknowledged below
                repeats += 1
                continue
            result = self._validate(message, now_ms)
            stream = result.stream
            if result.readings:
                assert stream is not None  # only a message routed to a stream has readings
                self.writer.add_readings(
                    stream, result.readings, message.topic, message.received_ms
                )
            for heartbeat in result.heartbeats:
                assert stream is not None
                self.writer.add_heartbeat(stream, heartbeat, message.received_ms)
            for rejection in result.rejections:
                self.writer.add_rejection(
                    rejection.topic, rejection.reason, rejection.payload, message.received_ms
                )
            if silence is not None and stream is not None:
                for accepted in (result.readings, result.heartbeats):
                    if accepted:
                        ts = max(r[self._timestamps[stream]] for r in accepted)
                        silence.observe(stream, ts, message.received_ms)
            self.stats.readings += len(result.readings)
            self.stats.heartbeats += len(result.heartbeats)
            self.stats.quarantined += len(result.rejections)
            self.stats.redelivered += message.dup
        if repeats:
            self.stats.retained_repeats += repeats
            log.info("%d retained messages sent again at subscription: not landed again", repeats)
        if silence is not None:
            for stream, ts in silence.due(now_ms):
                beat = {"source": f"ingest-{self.stats.ingester}", self._timestamps[stream]: ts}
                self.writer.add_heartbeat(stream, beat, now_ms)
                self.stats.heartbeats_emitted += 1
        if not self._flush_until_landed():
            return  # stopping with the storage still failing: the broker keeps them all
        # Durable now: only from here on may the broker forget these messages.
        self._acknowledge(batch)
        self.stats.messages += len(batch)
        if batch:
            lag = self.clock() * 1000 - batch[0].received_ms
            self.stats.last_landing_lag_ms = lag
            self.stats.landing_lag_ms_max = max(self.stats.landing_lag_ms_max, lag)

    def _validate(self, message: _Message, now_ms: int) -> Validated:
        """Validate one message; a bug in validation quarantines it instead of crashing.

        Crashing would be worse than wrong: the message, never acknowledged, would be
        redelivered to every restart and stop ingest for good (a poison message).
        """
        try:
            return self.validator.validate(message.topic, message.payload, now_ms)
        except Exception as err:
            log.exception("validation failed on a message of %s", message.topic)
            reason = f"ingest could not validate this payload: {type(err).__name__}: {err}"
            return Validated(None, rejections=[Rejection(message.topic, reason, message.payload)])

    def _flush_until_landed(self) -> bool:
        """Land the writer's buffers, retrying while the storage fails (nothing is acked).

        Retries with a backoff (LANDING_RETRY_FIRST_S doubling to LANDING_RETRY_MAX_S),
        staying connected: the broker keeps every unacknowledged message, and paho
        keeps receiving up to the broker's in-flight limit. The failure and the recovery
        are logged once each, not per retry. Returns False when asked to stop before the
        storage came back: the broker redelivers what was not landed to the next start.
        """
        delay = LANDING_RETRY_FIRST_S
        while True:
            try:
                started = time.perf_counter()
                self.stats.files += len(self.writer.flush())
                metrics.FLUSH_SECONDS.labels(self.stats.ingester).observe(
                    time.perf_counter() - started
                )
                break
            except OSError as err:
                error = f"landing failed: {err}"
                if not self.stats.landing_failing_since_ms:
                    self.stats.landing_failing_since_ms = int(self.clock() * 1000)
                    # Logged before the health record shows it: whoever sees one finds the
                    # other.
                    log.error("%s; nothing is acknowledged until it works again", error)
                self.stats.last_error = error
                self.write_health(force=True)
                if self._stopping.wait(delay):
                    log.error(
                        "stopping with %d lines not landed (the broker keeps their messages)",
                        len(self.writer),
                    )
                    return False
                delay = min(delay * 2, LANDING_RETRY_MAX_S)
        if self.stats.landing_failing_since_ms:
            failed_s = self.clock() - self.stats.landing_failing_since_ms / 1000
            log.info("landing works again after %.0f s", failed_s)
            self.stats.landing_failing_since_ms = 0
        return True

    def _acknowledge(self, batch: list[_Message]) -> None:
        """PUBACK every QoS 1 message of `batch` received on the current connection.

        All in one write: paho's `ack()` queues one packet and wakes its network thread
        through a socket per call, which took a quarter of ingest's time at one reading
        per message. Back-to-back PUBACK packets are a valid MQTT byte stream, queued
        through `_packet_queue`, the internal call `ack()` makes (paho is pinned to 2.2.0;
        every MQTT test exercises this path).
        """
        connection = self._connection
        pubacks = []
        for message in batch:
            if message.connection != connection or message.qos == 0:
                continue  # an old connection's message is redelivered and acked then
            if message.qos == 1:
                pubacks.append(_PUBACK.pack(PUBACK, 2, message.mid))
            else:
                self._client.ack(message.mid, message.qos)
        if pubacks:
            self._client._packet_queue(PUBACK, b"".join(pubacks), 0, 0)

    def write_health(self, force: bool = False) -> None:
        """Write counters and rates for the dashboard, about once a second.

        Best effort: a health record that cannot be written (the disk that is full is
        often the one that holds it) is logged once, and never stops ingest.
        """
        now = self.clock()
        elapsed = now - self._last_health
        if not force and elapsed < 1.0:
            return
        messages, readings = self._last_counts
        rates = {
            "messages_per_s": (self.stats.messages - messages) / elapsed if elapsed else 0.0,
            "readings_per_s": (self.stats.readings - readings) / elapsed if elapsed else 0.0,
        }
        self._last_counts = (self.stats.messages, self.stats.readings)
        self._last_health = now
        self.stats.pending = len(self._pending)
        record = {**asdict(self.stats), **rates, "updated_at_ms": int(now * 1000)}
        self.stats.landing_lag_ms_max = 0.0
        try:
            write_health(self.lakehouse, f"ingest-{self.stats.ingester}", record, self.s3)
        except OSError as err:
            if not self._health_error:
                log.warning("cannot write the health record: %s", err)
            self._health_error = str(err)
            return
        if self._health_error:
            log.info("the health record is written again")
            self._health_error = ""
