"""Bad payloads end in the Delta `quarantine` table with a reason; nothing else is lost.

Good readings (singly and in a batch that also holds bad elements) and one payload of
every bad kind go through a real mosquitto, the real ingest and the Spark engine
query. Afterwards: every good reading is in `readings_traffic` exactly once, every bad
payload (or bad batch element) is in `quarantine` with a reason that names the problem,
and a redelivered duplicate is not stored twice.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace

import orjson
import pytest

from lookout.config import IngestConfig
from rules.language.loader import load_rules
from tests.ingest.helpers import kept_payload
from tests.pipeline import delta_rows, publish, running_engine, running_ingest, table_rows, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]

RULES = """
CREATE STREAM traffic (station INT, lane INT, speed DOUBLE, length DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings';
"""


def reading(seq: int, **changes: object) -> dict:
    now = int(time.time() * 1000)
    base = {
        "station": 4,
        "lane": 2,
        "speed": 27.5,
        "length": 4.2,
        "ts": now + seq,
        "source": "station-4",
        "seq": seq,
    }
    return {**base, **changes}


TOPIC = "lookout/traffic/4/readings"

# (payload, words its quarantine reason must contain)
BAD = [
    (b"{not json", "not JSON"),
    (b'{"station": 4, "speed": "\xff\xfe"}', "not UTF-8"),
    (orjson.dumps(reading(100, speed="fast")), "speed"),
    (orjson.dumps({k: v for k, v in reading(101).items() if k != "lane"}), "missing field 'lane'"),
    (orjson.dumps(reading(102, station={"id": 4})), "object"),
    (orjson.dumps(reading(103, ts="yesterday at noon")), "cannot parse timestamp"),
    (orjson.dumps(reading(104, ts=0)), "timestamp too far in the past"),
    (orjson.dumps(reading(108, ts=int(time.time() * 1000) + 86_400_000)), "in the future"),
    (orjson.dumps(reading(105, speed=-3.0)), "negative"),
    (b"[]", "empty array"),
    (orjson.dumps([reading(200 + i) for i in range(60)]), "bytes; the limit is 4096"),
]


def test_bad_payloads_are_quarantined_and_good_ones_kept(
    spark, mosquitto, lookout_config, tmp_path
):
    lookout_config = replace(lookout_config, ingest=IngestConfig(max_payload_bytes=4096))
    rules_file = tmp_path / "traffic.sql"
    rules_file.write_text(RULES)
    rule_set = load_rules([rules_file])

    good = [reading(seq) for seq in range(40)]
    mixed_batch = [reading(40), reading(106, length=None), reading(41)]
    messages = [(TOPIC, orjson.dumps(r)) for r in good]
    messages += [(TOPIC, payload) for payload, _ in BAD]
    messages.append((TOPIC, orjson.dumps(mixed_batch)))
    messages.append(("lookout/elevators/1/readings", orjson.dumps(reading(107))))
    messages.append((TOPIC, orjson.dumps(good[5])))  # a redelivered duplicate
    expected_bad = len(BAD) + 2  # + the null field in the batch + the unknown topic
    expected_good = len(good) + 2

    with (
        running_ingest(lookout_config, rule_set),
        running_engine(lookout_config, rule_set, spark) as engine,
    ):
        publish(mosquitto, messages)
        wait_for(
            lambda: len(delta_rows(lookout_config, "quarantine")) >= expected_bad,
            120,
            f"{expected_bad} quarantined payloads",
            engine=engine,
        )
        wait_for(
            lambda: len(delta_rows(lookout_config, "readings_traffic")) >= expected_good,
            60,
            f"{expected_good} stored readings",
            engine=engine,
        )
        time.sleep(3)  # a later batch must not add anything

    stored = table_rows(spark, lookout_config, "readings_traffic")
    assert sorted(r["seq"] for r in stored) == list(range(42))
    quarantined = table_rows(spark, lookout_config, "quarantine")
    assert len(quarantined) == expected_bad
    reasons = [q["reason"] for q in quarantined]
    for payload, words in BAD:
        digest = hashlib.sha256(payload).hexdigest()
        rows = [q for q in quarantined if q["payload_sha256"] == digest]
        assert len(rows) == 1, f"payload {payload[:40]!r} should be quarantined once"
        assert words in rows[0]["reason"], rows[0]["reason"]
        assert payload.startswith(kept_payload(rows[0]))
        assert rows[0]["payload_bytes"] == len(payload)
    assert any("reading #1 of the batch" in r and "null" in r for r in reasons)
    assert any(
        "no stream's SOURCE matches topic 'lookout/elevators/1/readings'" in r for r in reasons
    )
    assert all(q["topic"] and q["received_at"] for q in quarantined)
