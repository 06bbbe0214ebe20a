"""Bad payloads through a real mosquitto land in quarantine, each with its reason.

The exchange: a publisher sends one message of each bad kind (and a batch mixing good
and bad readings) at QoS 1 to a running ingester; ingest lands the good readings under
`stream=traffic` and every bad payload under `stream=_quarantine` with the raw bytes,
the topic and a reason naming what is wrong. Reading the landed JSON lines is the whole
check; turning them into the Delta `quarantine` table is the engine's (tested there).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from ingest.service import build_ingester
from ingest.subscriber import Ingester
from ingest.validate import Validated, Validator
from lookout.broker import Broker
from lookout.config import Config, IngestConfig
from rules.language.loader import load_rules
from tests.ingest.conftest import RULES
from tests.ingest.helpers import kept_payload, landed_keys, landed_lines, publish_all, traffic
from tests.waiting import wait_for

pytestmark = pytest.mark.mqtt

TOPIC = "lookout/traffic/1/readings"
NOW = int(time.time() * 1000)


def good(seq: int) -> dict:
    return {**traffic(seq), "ts": NOW + seq}


#: (what, topic, payload, a piece of the reason ingest must give)
BAD = [
    ("not JSON", TOPIC, b"{station: 1,", "payload is not JSON"),
    ("not UTF-8", TOPIC, b'{"station": "\xff\xfe"}', "payload is not UTF-8"),
    ("wrong type", TOPIC, {**good(100), "station": "north"}, "field 'station' must be INT"),
    (
        "missing field",
        TOPIC,
        {k: v for k, v in good(101).items() if k != "speed"},
        "missing field 'speed'",
    ),
    ("extra nesting", TOPIC, {**good(102), "speed": {"value": 3.0}}, "field 'speed' is an object"),
    ("nested batch", TOPIC, [[good(103)]], "a reading must be a JSON object, got array"),
    (
        "unparsable timestamp",
        TOPIC,
        {**good(104), "ts": "yesterday noon"},
        "cannot parse timestamp",
    ),
    (
        "timestamp far from now",
        TOPIC,
        {**good(105), "ts": "1970-01-02T00:00:00Z"},
        "timestamp too far in the past",
    ),
    ("negative speed", TOPIC, {**good(106), "speed": -3.5}, "field 'speed' is negative"),
    ("empty array", TOPIC, [], "payload is an empty array"),
    ("oversized", TOPIC, orjson.dumps([good(200 + i) for i in range(100)]), "the limit is 4096"),
    ("unknown topic", "lookout/weather/7/readings", good(107), "no stream's SOURCE matches"),
]


@pytest.fixture
def ingester(tmp_path: Path, broker: Broker) -> Iterator[Ingester]:
    config = Config(
        lakehouse=str(tmp_path / "lakehouse"),
        mqtt=broker.mqtt_config(),
        ingest=replace(IngestConfig(), max_payload_bytes=4096, max_past_days=30),
    )
    ingester = build_ingester(config, load_rules([str(RULES)]))
    thread = threading.Thread(target=ingester.run, daemon=True)
    thread.start()
    wait_for(lambda: ingester.stats.subscribed, 20, "ingest to subscribe")
    yield ingester
    ingester.stop()
    thread.join(30)


def test_each_bad_kind_is_quarantined_with_its_reason(ingester: Ingester, broker: Broker) -> None:
    messages = [(topic, payload) for _, topic, payload, _ in BAD]
    publish_all(broker, [(TOPIC, good(1)), *messages, (TOPIC, good(2))])
    landing = ingester.writer.root
    wait_for(lambda: len(landed_lines(landing, "_quarantine")) >= len(BAD), 20, "quarantine")
    wait_for(lambda: len(landed_keys(landing)) == 2, 20, "the good readings")

    quarantined = landed_lines(landing, "_quarantine")
    assert len(quarantined) == len(BAD)
    for (what, topic, payload, reason), line in zip(BAD, quarantined, strict=True):
        raw = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        if what == "nested batch":  # a bad reading of a batch is kept alone, not the batch
            raw = orjson.dumps(payload[0])
        assert reason in line["reason"], what
        assert line["topic"] == topic, what
        assert line["payload_sha256"] == hashlib.sha256(raw).hexdigest(), what
        assert line["payload_bytes"] == len(raw), what
        assert raw.startswith(kept_payload(line)), what
        assert line["received_ms"] > 0
    assert ingester.stats.quarantined == len(BAD)


def test_a_batch_lands_its_good_readings_and_quarantines_the_rest(
    ingester: Ingester, broker: Broker
) -> None:
    bad_reading = {**good(11), "speed": -1.0}
    batch = [good(10), bad_reading, good(12), "not a reading", good(13)]
    publish_all(broker, [(TOPIC, batch)])
    landing = ingester.writer.root
    wait_for(lambda: len(landed_lines(landing, "_quarantine")) == 2, 20, "quarantine")
    wait_for(lambda: len(landed_keys(landing)) == 3, 20, "the good readings")

    assert set(landed_keys(landing)) == {("loop-1", 10), ("loop-1", 12), ("loop-1", 13)}
    first, second = landed_lines(landing, "_quarantine")
    assert first["reason"].startswith("reading #1 of the batch: field 'speed' is negative")
    assert orjson.loads(first["payload"]) == bad_reading  # the reading, not the whole batch
    assert second["reason"].startswith("reading #3 of the batch: a reading must be a JSON object")


def test_heartbeats_pass_through_among_the_readings(ingester: Ingester, broker: Broker) -> None:
    beat = {"source": "loop-1", "ts": NOW + 5_000}
    publish_all(
        broker,
        [(TOPIC, good(20)), ("lookout/traffic/1/heartbeat", beat), (TOPIC, good(21))],
    )
    landing = ingester.writer.root
    wait_for(lambda: len(landed_lines(landing, "traffic")) == 3, 20, "readings and heartbeat")
    lines = landed_lines(landing, "traffic")
    assert [line.get("_kind") for line in lines] == [None, "heartbeat", None]
    assert lines[1]["ts"] == beat["ts"] and lines[1]["source"] == "loop-1"
    assert ingester.stats.heartbeats == 1


def test_a_message_that_breaks_validation_is_quarantined_not_fatal(
    ingester: Ingester, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in validation must not make a poison message: redelivered to every restart,
    it would stop ingest for good. It is quarantined with the error, and ingest goes on."""
    validate = Validator.validate

    def broken_on_boom(self: Validator, topic: str, payload: bytes, now_ms: int) -> Validated:
        if payload == b'"boom"':
            raise RuntimeError("a bug")
        return validate(self, topic, payload, now_ms)

    monkeypatch.setattr(Validator, "validate", broken_on_boom)
    publish_all(broker, [(TOPIC, b'"boom"'), (TOPIC, good(30))])
    landing = ingester.writer.root
    wait_for(lambda: landed_lines(landing, "_quarantine"), 20, "quarantine")
    wait_for(lambda: landed_keys(landing), 20, "the good reading")
    (line,) = landed_lines(landing, "_quarantine")
    assert line["reason"] == "ingest could not validate this payload: RuntimeError: a bug"
