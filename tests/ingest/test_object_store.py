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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import orjson
import pytest
from moto.server import ThreadedMotoServer

from ingest.service import build_ingester
from lookout.broker import Broker, free_port
from lookout.config import Config, IngestConfig, MqttConfig
from rules.language.loader import load_rules
from tests.ingest.conftest import RULES
from tests.ingest.helpers import IngestProcess, publish_all, traffic
from tests.waiting import wait_for

pytestmark = [pytest.mark.mqtt, pytest.mark.slow]

PREFIX = "lookout/_landing"
SECRET = "s3cr3t-never-logged"
TOPIC = "lookout/traffic/1/readings"


@dataclass
class S3Server:
    """moto's S3 server on a loopback port; `stop()` and `start()` keep its buckets.

    moto keeps buckets per process, not per server: each test gets a bucket of its own.
    """

    port: int
    bucket: str
    server: ThreadedMotoServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def client(self) -> Any:
        """A boto3 client: the independent reader of what landed."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="test-key",
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )

    def objects(self) -> dict[str, bytes]:
        """Every object under the landing prefix, by key."""
        client = self.client()
        listing = client.list_objects_v2(Bucket=self.bucket, Prefix=PREFIX).get("Contents", [])
        return {
            o["Key"]: client.get_object(Bucket=self.bucket, Key=o["Key"])["Body"].read()
            for o in listing
        }

    def landed(self, stream: str = "traffic") -> list[dict[str, Any]]:
        """The lines landed for `stream`, in arrival order (object name, line)."""
        lines = []
        for key, body in sorted(self.objects().items()):
            if key.startswith(f"{PREFIX}/stream={stream}/part-"):
                lines.extend(orjson.loads(line) for line in body.splitlines())
        return lines


@pytest.fixture
def s3() -> Iterator[S3Server]:
    port = free_port()
    server = S3Server(port, f"lake-{port}")
    server.start()
    server.client().create_bucket(Bucket=server.bucket)
    yield server
    server.stop()


def ingest_settings(s3: S3Server) -> IngestConfig:
    return IngestConfig(
        landing_url=f"s3://{s3.bucket}/{PREFIX}",
        s3_endpoint=s3.endpoint,
        s3_access_key="test-key",
        s3_secret_key=SECRET,
    )


def keys(lines: list[dict[str, Any]]) -> Counter[tuple[str, int]]:
    return Counter((line["source"], line["seq"]) for line in lines)


def test_readings_land_as_objects_exactly_once(
    tmp_path: Path, broker: Broker, s3: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    config = Config(
        lakehouse=str(tmp_path / "lakehouse"),
        mqtt=MqttConfig(host=broker.host, port=broker.port),
        ingest=ingest_settings(s3),
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

    lines = s3.landed()
    assert keys(lines) == Counter({("loop-1", seq): 1 for seq in range(1300)})
    assert set(lines[0]) == {*traffic(0), "_line", "_topic", "_received_ms"}
    (rejected,) = s3.landed("_quarantine")
    assert rejected["reason"].startswith("payload is not JSON")
    names = [key.rsplit("/", 1)[1] for key in s3.objects()]
    assert all(name.startswith("part-") and name.endswith(".jsonl") for name in names)
    assert SECRET not in caplog.text and s3.endpoint in caplog.text + repr(ingester.writer.store)


def test_nothing_is_acknowledged_before_its_put(
    tmp_path: Path, broker: Broker, s3: S3Server
) -> None:
    env = {
        f"LOOKOUT_INGEST_{key.upper()}": str(value)
        for key, value in vars(ingest_settings(s3)).items()
    }
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
    assert s3.landed() == []

    again = IngestProcess(broker, tmp_path / "lakehouse", "s3", env=env).wait_subscribed()
    wait_for(lambda: len(keys(s3.landed())) == 500, 60, "the redelivered readings to land")
    again.terminate()
    assert keys(s3.landed()) == Counter({("loop-1", seq): 1 for seq in range(500)})
    assert "landing failed" in ingest.log.read_text() and SECRET not in ingest.log.read_text()
