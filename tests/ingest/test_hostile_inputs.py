"""Hostile input through the real broker: where each payload ends up, and that no valid
neighbour is lost.

A publisher with the publisher login sends, through the shipped mosquitto, every kind
of hostile payload found so far (clocks far off, run ids of every shape, oversized and
NUL-filled payloads, text past its limit, huge integers, elements nested too deep or
unreadable inside a batch of good readings, unknown and overlong topics, wrong types,
duplicates), each between two good readings or, for batch elements, between two good
elements of its batch. A running ingester lands them; the landed files are then split
by the engine's own reader and sequencing into the tables they feed. For every input the
test names its table (`readings_traffic`, a heartbeat, a duplicate, or `quarantine`
with a piece of its reason), checks what quarantine stored of it (a bounded prefix, its
size and SHA-256), and checks that every good neighbour is in `readings_traffic` once,
on time. Retained messages are checked across ingest restarts. The fuzzers
(`tests/fuzz`) cover the same validation with generated payloads.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

from ingest.service import build_ingester
from ingest.subscriber import Ingester
from lookout.broker import Broker
from lookout.config import Config, IngestConfig
from rules.language.loader import load_rules
from tests.ingest.conftest import RULES
from tests.ingest.helpers import (
    IngestProcess,
    Publisher,
    kept_payload,
    landed_keys,
    landed_lines,
)
from tests.landed import Judged, judge_landing
from tests.waiting import wait_for

pytestmark = pytest.mark.mqtt

TOPIC = "lookout/traffic/1/readings"
BEAT_TOPIC = "lookout/traffic/1/heartbeat"
SOURCE = "hostile"
LIMIT = 65_536  # max_payload_bytes here: the broker itself takes up to 1 MB
DAY = 86_400_000
BIG = 123456789012345678901234567890  # 30 digits: past every 64-bit integer


def good(t0: int, seq: int, **changes: Any) -> dict[str, Any]:
    """A well-formed traffic reading stamped `t0` (plus `seq` ms, less 10 s for the
    neighbours' seqs): every good one within the 2 s slack of the others, so none is late
    unless a hostile one moved the stream's event time on."""
    reading = {"station": 1, "lane": 1, "speed": 20.0, "length": 4.5, "ts": t0 + seq % 10_000}
    return {**reading, "source": SOURCE, "seq": seq, **changes}


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@dataclass(frozen=True)
class Quarantined:
    """Expected in `quarantine`, with this piece of its reason."""

    reason: str


@dataclass(frozen=True)
class Landed:
    """Expected in `readings_traffic`, its landed line holding these values."""

    values: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Case:
    """One hostile input: alone between two good messages, or (`in_batch`) the middle
    element of a batch between two good readings."""

    name: str
    payload: bytes
    expect: Quarantined | Landed | str  # or "heartbeat", "duplicate"
    topic: str = TOPIC
    in_batch: bool = False


def _json(value: Any) -> bytes:
    """JSON of a value orjson cannot write (an integer past 64 bits)."""
    return json.dumps(value).encode()


def hostile_cases(t0: int) -> list[Case]:
    """Every hostile input, its timestamps around `t0` (ingest's clock when sent)."""
    return [
        # Clocks: one far ahead must not move the stream on (the good reading after it lands
        # on time); heartbeats are held to the same window.
        Case("clock 9 years ahead", orjson.dumps(good(t0, 1, ts=t0 + 9 * 365 * DAY)),
             Quarantined("timestamp too far in the future: 3284 days 23 h ahead of ingest's clock; "
                         "the limit for stream 'traffic' is 5 min")),
        Case("clock 6 minutes ahead", orjson.dumps(good(t0, 2, ts=t0 + 6 * 60_000)),
             Quarantined("timestamp too far in the future: 5 min")),
        Case("clock 11 years behind", orjson.dumps(good(t0, 3, ts=t0 - 4000 * DAY)),
             Quarantined("timestamp too far in the past: 4000 days")),
        Case("heartbeat 9 years ahead", orjson.dumps({"source": SOURCE, "ts": t0 + 9 * 365 * DAY}),
             Quarantined("timestamp too far in the future: 3284 days 23 h"), topic=BEAT_TOPIC),
        Case("heartbeat now", orjson.dumps({"source": SOURCE, "ts": t0}), "heartbeat",
             topic=BEAT_TOPIC),
        # Run ids (epochs) of every shape.
        Case("epoch text", orjson.dumps(good(t0, 10, epoch="1764000000000-3f9a")),
             Landed((("epoch", "1764000000000-3f9a"),))),
        Case("epoch integer", orjson.dumps(good(t0, 11, epoch=1764000000000)),
             Landed((("epoch", "1764000000000"),))),
        Case("epoch 30 digits", _json(good(t0, 12, epoch=BIG)), Landed((("epoch", str(BIG)),))),
        Case("no epoch", orjson.dumps(good(t0, 13)), Landed((("epoch", ""),))),
        Case("epoch too long", orjson.dumps(good(t0, 14, epoch="e" * 300)),
             Quarantined("field 'epoch' is 300 characters; the limit is 256")),
        Case("epoch object", orjson.dumps(good(t0, 15, epoch={"boot": 1})),
             Quarantined("field 'epoch' is an object")),
        # Ids and text.
        Case("source 30 digits", _json(good(t0, 20, source=BIG)), Landed((("source", str(BIG)),))),
        Case("source 5000 characters", orjson.dumps(good(t0, 21, source="s" * 5000)),
             Quarantined("field 'source' is 5000 characters; the limit is 256")),
        # Sizes.
        Case("oversized", b'{"station": "' + b"9" * 100_000 + b'"}',
             Quarantined(f"payload is 100015 bytes; the limit is {LIMIT}")),
        Case("NUL bytes", b"\x00" * 3000, Quarantined("payload is not JSON")),
        Case("not UTF-8", b'{"station": "\xff\xfe"}',
             Quarantined("payload is not UTF-8 (byte 13)")),
        Case("not JSON", b"{station: 1,", Quarantined("payload is not JSON")),
        Case("number past a double", orjson.dumps(good(t0, 30))[:-1] + b', "speed": 1e400}',
             Quarantined("payload is not JSON: number out of range")),
        Case("empty array", b"[]", Quarantined("payload is an empty array")),
        Case("unknown topic", orjson.dumps(good(t0, 31)),
             Quarantined("no stream's SOURCE matches topic 'lookout/weather/1/readings'"),
             topic="lookout/weather/1/readings"),
        Case("topic 2000 characters", orjson.dumps(good(t0, 32)),
             Quarantined("topic is 2025 characters; the limit is 1024"),
             topic="lookout/traffic/" + "7" * 2000 + "/readings"),
        # Wrong values.
        Case("text for INT", orjson.dumps(good(t0, 40, station="north")),
             Quarantined("field 'station' must be INT, got 'north'")),
        Case("30 digits for INT", _json(good(t0, 41, station=BIG)),
             Quarantined(f"field 'station' is out of the INT range ({BIG})")),
        Case("null", orjson.dumps(good(t0, 42, speed=None)), Quarantined("field 'speed' is null")),
        Case("negative speed", orjson.dumps(good(t0, 43, speed=-3.5)),
             Quarantined("field 'speed' is negative (-3.5)")),
        Case("missing field", orjson.dumps({k: v for k, v in good(t0, 44).items() if k != "lane"}),
             Quarantined("missing field 'lane'")),
        Case("a value 50,000 characters long", orjson.dumps(good(t0, 45, station="n" * 50_000)),
             Quarantined("field 'station' must be INT, got 'nnnnn")),
        Case("duplicate", orjson.dumps(good(t0, 10, epoch="1764000000000-3f9a")), "duplicate"),
        # One bad element of a batch: quarantined alone, its neighbours land.
        Case("element nested 300 deep",
             orjson.dumps(good(t0, 52))[:-1] + b', "station": ' + deep(300) + b"}",
             Quarantined("reading #1 of the batch: field 'station' is an array"), in_batch=True),
        Case("element nested 5000 deep", deep(5000),
             Quarantined("reading #1 of the batch: not JSON: nested too deeply"), in_batch=True),
        Case("NaN element", b'{"station": NaN}', Quarantined("reading #1 of the batch: not JSON"),
             in_batch=True),
        Case("not-UTF-8 element", b'{"source": "\xff"}',
             Quarantined("reading #1 of the batch: not UTF-8"), in_batch=True),
        Case("text element", b'"a reading"',
             Quarantined("reading #1 of the batch: a reading must be a JSON object, got string"),
             in_batch=True),
        Case("future element", orjson.dumps(good(t0, 50, ts=t0 + DAY)),
             Quarantined("reading #1 of the batch: timestamp too far in the future: 23 h"),
             in_batch=True),
        Case("30-digit id element", _json(good(t0, 51, source=BIG)),
             Landed((("source", str(BIG)),)), in_batch=True),
    ]  # fmt: skip


def messages(t0: int, cases: list[Case]) -> tuple[list[tuple[str, bytes]], set[int]]:
    """Every case between its good neighbours, in order; and the neighbours' seqs."""
    out: list[tuple[str, bytes]] = []
    neighbours: set[int] = set()
    for index, case in enumerate(cases):
        before, after = 10_000 + 2 * index, 10_001 + 2 * index
        neighbours |= {before, after}
        if case.in_batch:
            body = b",".join(
                [orjson.dumps(good(t0, before)), case.payload, orjson.dumps(good(t0, after))]
            )
            out.append((TOPIC, b"[" + body + b"]"))
        else:
            out.append((TOPIC, orjson.dumps(good(t0, before))))
            out.append((case.topic, case.payload))
            out.append((TOPIC, orjson.dumps(good(t0, after))))
    return out, neighbours


@pytest.fixture
def ingester(tmp_path: Path, broker: Broker) -> Iterator[Ingester]:
    config = Config(
        lakehouse=str(tmp_path / "lakehouse"),
        mqtt=broker.mqtt_config(),
        ingest=replace(IngestConfig(), max_payload_bytes=LIMIT),
    )
    ingester = build_ingester(config, load_rules([str(RULES)]))
    thread = threading.Thread(target=ingester.run, daemon=True)
    thread.start()
    wait_for(lambda: ingester.stats.subscribed, 20, "ingest to subscribe")
    yield ingester
    ingester.stop()
    thread.join(30)


def split(ingester: Ingester) -> Judged:
    """The landed lines as the engine's reader and sequencing turn them into table rows."""
    return judge_landing(ingester.writer.root, ingester.validator.streams)


def test_each_hostile_input_ends_where_it_should_and_no_neighbour_is_lost(
    ingester: Ingester, broker: Broker
) -> None:
    t0 = int(time.time() * 1000)
    cases = hostile_cases(t0)
    sent, neighbours = messages(t0, cases)
    publisher = Publisher(broker)
    for topic, payload in sent:
        publisher.send(topic, payload)
    publisher.close()
    quarantined = sum(isinstance(case.expect, Quarantined) for case in cases)
    landed = sum(isinstance(case.expect, Landed) for case in cases) + len(neighbours)
    root = ingester.writer.root
    wait_for(lambda: len(landed_lines(root, "_quarantine")) >= quarantined, 30, "quarantine")
    wait_for(lambda: len(landed_keys(root)) >= landed, 30, "the readings")
    time.sleep(0.5)  # anything more would land about now

    out = split(ingester)
    rows = {(r["source"], r["seq"]): r for r in out.readings["traffic"]}
    lines = {
        (line["source"], line["seq"]): line
        for line in landed_lines(root, "traffic")
        if line.get("_kind") != "heartbeat"
    }
    assert not out.late, f"readings made late: {out.late}"
    assert len(out.readings["traffic"]) == landed, "a reading landed twice or one too many"
    for seq in neighbours:
        assert (SOURCE, seq) in rows, f"good neighbour {seq} was lost"
    by_hash = {row["payload_sha256"]: row for row in out.quarantine}
    assert len(out.quarantine) == quarantined
    for case in cases:
        if isinstance(case.expect, Quarantined):
            row = by_hash.get(hashlib.sha256(case.payload).hexdigest())
            assert row is not None, f"{case.name}: not in quarantine as published"
            assert case.expect.reason in row["reason"], (case.name, row["reason"])
            assert len(row["reason"]) < 300, case.name
            assert row["payload_bytes"] == len(case.payload), case.name
            kept = kept_payload(row)
            assert case.payload.startswith(kept), case.name
            assert len(kept) >= min(len(case.payload), 4096) - 3, case.name
            stored = len(orjson.dumps(row, default=str))
            assert stored < 2 * min(len(case.payload), 4096) + 2500, (case.name, stored)
        elif isinstance(case.expect, Landed):
            reading = msgspec.json.decode(case.payload)  # a 30-digit id stays an integer
            key = (str(reading["source"]), reading["seq"])
            assert key in rows, f"{case.name}: not in readings_traffic"
            for name, value in case.expect.values:
                assert lines[key][name] == value, (case.name, name, lines[key][name])
    assert out.duplicates == {"traffic": 1}
    assert out.heartbeats == {"traffic": 1}


@pytest.mark.slow
def test_a_retained_message_lands_once_across_restarts(tmp_path: Path, broker: Broker) -> None:
    """The broker sends a retained reading again at every subscription; before, it
    landed again at every ingest restart."""
    lakehouse = tmp_path / "lakehouse"
    landing = lakehouse / "_landing"
    publisher = Publisher(broker)
    ingest = IngestProcess(broker, lakehouse).wait_subscribed()
    t0 = int(time.time() * 1000)
    publisher.send(TOPIC, good(t0, 1), retain=True)  # published while ingest runs
    publisher.wait()
    wait_for(lambda: landed_keys(landing), 20, "the retained reading")
    assert ingest.terminate() == 0
    publisher.send(TOPIC, good(t0, 2), retain=True)  # published while ingest is away
    publisher.close()
    for _ in range(2):
        ingest = IngestProcess(broker, lakehouse).wait_subscribed()
        time.sleep(1.5)  # a retained copy would come with the subscription
        assert ingest.terminate() == 0
    assert landed_keys(landing) == {(SOURCE, 1): 1, (SOURCE, 2): 1}
