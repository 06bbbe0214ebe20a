"""Nothing published is lost: kill -9 of ingest, a broker restart, SIGTERM, scale-out.

Every test publishes readings with unique (source, seq) at QoS 1 to a mosquitto running
the shipped configuration (persistence on, no queue limit), disturbs the pipeline while
the readings flow, then reads what landed. "At least once" is the landing contract (a
redelivered message may land twice); "exactly once" is what remains after the engine's
dedupe by (source, seq), so the tests check both: the set of landed keys equals the set
published, and every key landed at least once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lookout.broker import Broker
from tests.ingest.helpers import (
    IngestProcess,
    landed_keys,
    publish_all,
    publish_in_background,
    traffic,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.mqtt, pytest.mark.slow]


def readings(count: int, batch: int = 1, source: str = "loop-1") -> list[tuple[str, object]]:
    """`count` readings as messages of `batch` readings each, on one station's topic."""
    topic = "lookout/traffic/1/readings"
    if batch == 1:
        return [(topic, traffic(seq, source)) for seq in range(count)]
    return [
        (topic, [traffic(seq, source) for seq in range(start, min(start + batch, count))])
        for start in range(0, count, batch)
    ]


def expected(count: int, source: str = "loop-1") -> set[tuple[str, int]]:
    return {(source, seq) for seq in range(count)}


def test_kill_9_under_load_then_restart_loses_nothing(tmp_path: Path, broker: Broker) -> None:
    """Ingest is killed (no flush, no ack) while 20,000 readings flow in; the restarted
    ingester (same id, so same persistent session) gets the unacknowledged messages
    again and lands them."""
    lakehouse = tmp_path / "lakehouse"
    landing = lakehouse / "_landing"
    ingest = IngestProcess(broker, lakehouse).wait_subscribed()
    done = publish_in_background(broker, readings(20_000), rate=5_000)
    wait_for(lambda: len(landed_keys(landing)) > 2_000, 30, "some readings to land")
    ingest.kill()
    killed_at = len(landed_keys(landing))
    time.sleep(0.5)  # the broker queues for the offline session meanwhile
    ingest = IngestProcess(broker, lakehouse).wait_subscribed()
    assert done.wait(60), "the publisher did not finish"
    wait_for(lambda: len(landed_keys(landing)) == 20_000, 60, "every reading to land")
    ingest.terminate()

    keys = landed_keys(landing)
    assert set(keys) == expected(20_000)
    assert killed_at < 20_000, "the kill came after the load: nothing was at risk"


def test_broker_restart_under_load_loses_nothing(tmp_path: Path, broker: Broker) -> None:
    """The broker stops (saving its persistence) and starts again while batches flow;
    ingest reconnects by itself and the publisher resends what was not acknowledged."""
    lakehouse = tmp_path / "lakehouse"
    landing = lakehouse / "_landing"
    ingest = IngestProcess(broker, lakehouse).wait_subscribed()
    done = publish_in_background(broker, readings(50_000, batch=50), rate=400)
    wait_for(lambda: len(landed_keys(landing)) > 5_000, 30, "some readings to land")
    broker.restart()
    assert done.wait(60), "the publisher did not finish"
    wait_for(lambda: len(landed_keys(landing)) == 50_000, 60, "every reading to land")
    assert ingest.health["connects"] >= 2, "ingest never reconnected"
    assert ingest.terminate() == 0
    assert set(landed_keys(landing)) == expected(50_000)


def test_sigterm_flushes_and_acknowledges(tmp_path: Path, broker: Broker) -> None:
    """SIGTERM while messages are buffered: ingest lands and acknowledges them, exits 0,
    and a new life of the same ingester is sent nothing again (no duplicate lands)."""
    lakehouse = tmp_path / "lakehouse"
    landing = lakehouse / "_landing"
    ingest = IngestProcess(broker, lakehouse, "0").wait_subscribed()
    publish_all(broker, readings(5_000))
    assert ingest.terminate() == 0
    keys = landed_keys(landing)
    assert set(keys) == expected(5_000)
    assert max(keys.values()) == 1

    again = IngestProcess(broker, lakehouse, "0").wait_subscribed()
    time.sleep(1.0)  # anything unacknowledged would be redelivered at once
    assert again.terminate() == 0
    assert landed_keys(landing) == keys


def test_two_shared_subscription_ingesters_land_each_reading_once(
    tmp_path: Path, broker: Broker
) -> None:
    """Two ingesters in one `$share` group split the messages: each reading lands once in
    total, in the same folders, under names that never collide."""
    lakehouse = tmp_path / "lakehouse"
    landing = lakehouse / "_landing"
    share = ("--share", "lookout")
    first = IngestProcess(broker, lakehouse, "a", *share).wait_subscribed()
    second = IngestProcess(broker, lakehouse, "b", *share).wait_subscribed()
    publish_all(broker, readings(10_000))
    wait_for(lambda: sum(landed_keys(landing).values()) >= 10_000, 30, "every reading")
    time.sleep(0.5)  # a duplicate would show up about now
    assert first.terminate() == 0 and second.terminate() == 0

    keys = landed_keys(landing)
    assert set(keys) == expected(10_000)
    assert max(keys.values()) == 1
    files = list((landing / "stream=traffic").glob("part-*.jsonl"))
    by_ingester = {name: [f for f in files if f"-{name}-" in f.name] for name in ("a", "b")}
    assert all(by_ingester.values()), "one ingester got no share of the load"
    assert first.health["messages"] + second.health["messages"] == 10_000


def test_landing_storage_failure_holds_the_acks_until_it_recovers(
    tmp_path: Path, broker: Broker
) -> None:
    """The landing folder cannot be written (here: a file sits where it should be):
    ingest acknowledges nothing, reports the error, retries, and lands everything once
    the storage is back."""
    lakehouse = tmp_path / "lakehouse"
    landing = lakehouse / "_landing"
    lakehouse.mkdir()
    landing.write_text("not a folder")
    ingest = IngestProcess(broker, lakehouse).wait_subscribed()
    publish_all(broker, readings(1_000))
    wait_for(lambda: "landing failed" in ingest.health.get("last_error", ""), 20, "the error")
    assert ingest.health["messages"] == 0
    landing.unlink()
    wait_for(lambda: len(landed_keys(landing)) == 1_000, 20, "every reading after recovery")
    assert ingest.terminate() == 0
    assert set(landed_keys(landing)) == expected(1_000)
