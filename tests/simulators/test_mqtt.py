"""Publishing to a real mosquitto on loopback: a subscriber receives every reading."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import orjson
import paho.mqtt.client as mqtt
import pytest

from lookout.broker import Broker, free_port
from lookout.mqtt_auth import INGEST, PUBLISHER, Login
from simulators.cli import main
from simulators.publish import MqttSink
from tests.simulators.helpers import is_reading, load, simulate

pytestmark = pytest.mark.mqtt

RUN = (
    "traffic",
    "--rate",
    "2000",
    "--duration",
    "10",
    "--start",
    "2026-01-01T00:00:00Z",
    "--seed",
    "3",
    "--disorder",
    "bounded:1",
    "--duplicate-fraction",
    "0.01",
    "--malformed-fraction",
    "0.01",
    "--accident",
    "2@0+5",
    "--epoch",  # the file and the broker get the same readings, run id included
    "run-3",
)


class Subscriber:
    """Collects every message under ``lookout/#`` at QoS 1 (with ingest's login: the one
    allowed to read)."""

    def __init__(self, broker: Broker) -> None:
        self.readings: list[tuple[str, dict]] = []
        self.heartbeats: list[dict] = []
        self.malformed: list[bytes] = []
        self._subscribed = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="test-sub")
        assert broker.credentials is not None
        login = broker.credentials.login(INGEST)
        self.client.username_pw_set(login.username, login.password)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.on_connect = lambda c, *a: c.subscribe("lookout/#", qos=1)
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        assert self._subscribed.wait(10)

    def _on_message(self, client, userdata, msg) -> None:
        try:
            body = orjson.loads(msg.payload)
        except orjson.JSONDecodeError:
            self.malformed.append(msg.payload)
            return
        if msg.topic.endswith("/heartbeat"):
            self.heartbeats.append(body)
            return
        for r in body if isinstance(body, list) else [body]:
            self.readings.append((msg.topic, r))

    def wait_for(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.readings) + len(self.malformed) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # anything beyond n would show up now

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def subscriber(mosquitto: Broker) -> Iterator[Subscriber]:
    sub = Subscriber(mosquitto)
    yield sub
    sub.close()


def address(broker: Broker) -> list[str]:
    """The simulator options that reach `broker` as a publisher."""
    assert broker.credentials is not None
    path = str(broker.credentials.path)
    return ["--host", broker.host, "--port", str(broker.port), "--credentials", path]


def publisher(broker: Broker) -> Login:
    assert broker.credentials is not None
    return broker.credentials.login(PUBLISHER)


def _key(r: dict) -> bytes:
    return orjson.dumps(r, option=orjson.OPT_SORT_KEYS)


def test_publish_delivers_every_reading(
    mosquitto: Broker, subscriber: Subscriber, tmp_path: Path
) -> None:
    lines = (simulate(tmp_path, *RUN)[0]).read_bytes().splitlines()
    expected, bad = load(tmp_path / "run.jsonl")
    rc = main([*RUN, *address(mosquitto), "--speedup", "0", "--batch", "20", "--quiet"])
    assert rc == 0
    subscriber.wait_for(len(lines))
    got = [r for _, r in subscriber.readings if is_reading(r)]
    assert Counter(map(_key, got)) == Counter(map(_key, expected))
    assert len(subscriber.readings) - len(got) + len(subscriber.malformed) == len(bad)
    for topic, r in subscriber.readings:
        if "station" in r:
            assert topic == f"lookout/traffic/{r['station']}/readings"
        elif "vid" in r:
            assert topic == "lookout/positions/0/readings"
    # Per source, MQTT keeps the publisher's order: the file's arrival order.
    assert _seqs(got) == _seqs(expected)
    hb_sources = Counter(h["source"] for h in subscriber.heartbeats)
    assert set(hb_sources) == {f"station-{i}" for i in range(1, 11)} | {"xway-0"}
    assert min(hb_sources.values()) >= 10


def _seqs(readings: list[dict]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for r in readings:
        out[r["source"]].append(r["seq"])
    return out


def test_replay_republishes_the_file(
    mosquitto: Broker, subscriber: Subscriber, tmp_path: Path
) -> None:
    out, _ = simulate(tmp_path, *RUN)
    lines = out.read_bytes().splitlines()
    t0 = time.monotonic()
    rc = main(
        [
            "replay",
            str(out),
            *address(mosquitto),
            "--speedup",
            "5",
            "--batch",
            "50",
            "--quiet",
        ]
    )
    elapsed = time.monotonic() - t0
    assert rc == 0
    subscriber.wait_for(len(lines))
    assert len(subscriber.readings) + len(subscriber.malformed) == len(lines)
    # Ten seconds of event time at five times the original speed: about two seconds.
    assert 1.5 < elapsed < 6


def test_sigterm_stops_cleanly_with_nothing_lost(mosquitto: Broker, subscriber: Subscriber) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simulators.cli",
            "traffic",
            *address(mosquitto),
            "--rate",
            "500",
            "--duration",
            "0",
            "--congestion",
            "3,7",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    sent = int(re.findall(r"(\d+) readings in \d+ msgs, average", err)[-1])
    assert sent > 300
    subscriber.wait_for(sent)
    assert len(subscriber.readings) == sent
    assert {r["station"] for _, r in subscriber.readings} == set(range(1, 11))


def test_a_publish_cut_short_is_not_waited_for(mosquitto: Broker) -> None:
    # A signal used to raise inside `send`: a message counted before paho had it made
    # `close` wait for a PUBACK that could never come (SIGTERM then took 60 s).
    sink = MqttSink(mosquitto.host, mosquitto.port, login=publisher(mosquitto))
    beat = {"source": "gw", "ts": 1}
    sink.send("heartbeat", "lookout/traffic/gw/heartbeat", beat)
    publish = sink._client.publish

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    sink._client.publish = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        sink.send("heartbeat", "lookout/traffic/gw/heartbeat", beat)
    sink._client.publish = publish  # type: ignore[method-assign]
    sink.close(timeout=5)
    assert (sink.messages, sink.inflight) == (1, 0)


@pytest.mark.slow
def test_closing_gives_up_on_a_broker_that_is_gone(tmp_path: Path) -> None:
    # Reconnecting while sending is right (a broker restart loses nothing), but closing
    # must end: a simulator whose broker had stopped used to retry for ever.
    broker = Broker("127.0.0.1", free_port(), tmp_path).start()
    sink = MqttSink(broker.host, broker.port, login=publisher(broker))
    broker.stop()
    sink.send("heartbeat", "lookout/traffic/gw/heartbeat", {"source": "gw", "ts": 1})
    closing = threading.Thread(target=sink.close, kwargs={"timeout": 2}, daemon=True)
    closing.start()
    closing.join(timeout=30)
    assert not closing.is_alive(), "close() still reconnecting 30 s after a 2 s timeout"
