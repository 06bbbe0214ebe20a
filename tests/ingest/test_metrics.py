"""`lookout ingest`'s Prometheus endpoint, scraped over HTTP from a running ingest
process that landed real MQTT messages."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lookout.broker import Broker, free_port
from tests.ingest.helpers import IngestProcess, publish_all, traffic
from tests.waiting import wait_for

pytestmark = pytest.mark.mqtt

TOPIC = "lookout/traffic/1/readings"


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of http://127.0.0.1:port/metrics, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.slow
def test_metrics_count_what_ingest_landed(tmp_path: Path, broker: Broker) -> None:
    port = free_port()
    ingest = IngestProcess(
        broker, tmp_path / "lakehouse", env={"LOOKOUT_INGEST_METRICS_PORT": str(port)}
    ).wait_subscribed()
    try:
        # Three messages: a batch of two readings, one reading, one payload that is not JSON.
        publish_all(broker, [(TOPIC, [traffic(1), traffic(2)]), (TOPIC, traffic(3)),
                             (TOPIC, b"{not json")])  # fmt: skip
        wait_for(lambda: ingest.health.get("messages") == 3, 20, "the messages to land")

        me = (("ingester", "0"),)
        samples = wait_for(
            lambda: (s := scrape(port)).get(("lookout_ingest_messages_total", me)) == 3 and s,
            10,
            "the endpoint to count them",
        )
        assert samples[("lookout_ingest_readings_total", me)] == 3
        assert samples[("lookout_ingest_quarantined_total", me)] == 1
        assert samples[("lookout_ingest_landed_files_total", me)] >= 1
        assert samples[("lookout_ingest_flush_seconds_count", me)] >= 1
        assert samples[("lookout_ingest_flush_seconds_sum", me)] > 0
        assert samples[("lookout_ingest_connected", me)] == 1
        assert samples[("lookout_ingest_landing_failing", me)] == 0
    finally:
        assert ingest.terminate() == 0
