"""Landing into object storage: a real S3-compatible server (moto's) on 127.0.0.1.

Messages go through a real mosquitto to ingest, which lands them with one PUT per
file under `s3://lake/lookout/_landing`. The checks read the bucket with boto3, not
with ingest's own code: the objects hold exactly the published readings under the
same names as on disk, and nothing is acknowledged before its PUT succeeded (with the
server down, ingest is killed -9 after receiving everything; once the server is back,
a restarted ingester still gets and lands every reading, so none had been acked).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from ingest.service import build_ingester
from lookout.broker import Broker
from lookout.config import Config, IngestConfig
from rules.language.loader import load_rules
from tests.ingest.conftest import RULES
from tests.ingest.helpers import IngestProcess, publish_all, traffic
from tests.s3server import SECRET, S3Server
from tests.waiting import wait_for

pytestmark = [pytest.mark.mqtt, pytest.mark.slow]

PREFIX = "lookout/_landing"
TOPIC = "lookout/traffic/1/readings"


def landed(s3: S3Server, stream: str = "traffic") -> list[dict[str, Any]]:
    """The lines landed for `stream`, in arrival order (object name, line)."""
    lines = []
    for key, body in sorted(s3.objects(PREFIX).items()):
        if key.startswith(f"{PREFIX}/stream={stream}/part-"):
            lines.extend(orjson.loads(line) for line in body.splitlines())
    return lines


def ingest_settings(s3: S3Server) -> IngestConfig:
    return IngestConfig(landing_url=s3.url(PREFIX))


def keys(lines: list[dict[str, Any]]) -> Counter[tuple[str, int]]:
    return Counter((line["source"], line["seq"]) for line in lines)


def test_readings_land_as_objects_exactly_once(
    tmp_path: Path, broker: Broker, s3: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    config = Config(
        lakehouse=str(tmp_path / "lakehouse"),
        mqtt=broker.mqtt_config(),
        ingest=ingest_settings(s3),
        s3=s3.settings(),
    )
    caplog.set_level(logging.DEBUG)
    ingester = build_ingester(config, load_rules([str(RULES)]))
    thread = threading.Thread(target=ingester.run, daemon=True)
    thread.start()
    wait_for(lambda: ingester.stats.subscribed, 20, "ingest to subscribe")
    singles = [(TOPIC, traffic(seq)) for seq in range(300)]
    batches = [(TOPIC, [traffic(seq) for seq in range(s, s + 50)]) for s in range(300, 1300, 50)]
    publish_all(broker, [*singles, *batches, (TOPIC, b"{not json")])
    wait_for(lambda: ingester.stats.messages == len(singles) + len(batches) + 1, 30, "landing")
    ingester.stop()
    thread.join(30)

    lines = landed(s3)
    assert keys(lines) == Counter({("loop-1", seq): 1 for seq in range(1300)})
    assert set(lines[0]) == {*traffic(0), "epoch", "_topic", "_received_ms"}
    (rejected,) = landed(s3, "_quarantine")
    assert rejected["reason"].startswith("payload is not JSON")
    names = [key.rsplit("/", 1)[1] for key in s3.objects(PREFIX)]
    assert all(name.startswith("part-") and name.endswith(".jsonl") for name in names)
    assert SECRET not in caplog.text and s3.endpoint in caplog.text + repr(ingester.writer.store)


def test_nothing_is_acknowledged_before_its_put(
    tmp_path: Path, broker: Broker, s3: S3Server
) -> None:
    env = {"LOOKOUT_INGEST_LANDING_URL": s3.url(PREFIX), **s3.env()}
    ingest = IngestProcess(broker, tmp_path / "lakehouse", "s3", env=env).wait_subscribed()
    s3.stop()
    publish_all(
        broker, [(TOPIC, [traffic(seq) for seq in range(s, s + 25)]) for s in range(0, 500, 25)]
    )
    wait_for(
        lambda: ingest.health.get("last_error", "").startswith("landing failed"),
        60,
        "ingest to fail its PUTs",
    )
    assert ingest.health["messages"] == 0  # received, never landed, so never acknowledged
    ingest.kill()
    s3.start()
    assert landed(s3) == []

    again = IngestProcess(broker, tmp_path / "lakehouse", "s3", env=env).wait_subscribed()
    wait_for(lambda: len(keys(landed(s3))) == 500, 60, "the redelivered readings to land")
    again.terminate()
    assert keys(landed(s3)) == Counter({("loop-1", seq): 1 for seq in range(500)})
    assert "landing failed" in ingest.log.read_text() and SECRET not in ingest.log.read_text()
