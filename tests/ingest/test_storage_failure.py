"""A full or read-only landing disk: ingest stops acknowledging, stays up, and resumes.

The lakehouse (landing folders and health record) is a 2 MB tmpfs of its own, filled
up or remounted read-only while a real mosquitto delivers readings to a real
`python -m ingest`. Ingest must not crash (its health record is on the same disk and
cannot be written either), must acknowledge nothing (a kill -9 meanwhile loses
nothing), must leave no temporary file behind, must log the failure once and not per
retry, and once the disk takes writes again must land every reading exactly once by
itself. Mounting needs root: elsewhere these tests are skipped, saying so.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lookout.broker import Broker
from tests.disks import fill
from tests.disks import small_disk as mounted
from tests.ingest.helpers import IngestProcess, landed_keys, publish_all, traffic
from tests.waiting import wait_for

pytestmark = pytest.mark.mqtt

TOPIC = "lookout/traffic/1/readings"
FAILED = "landing failed"
RECOVERED = "landing works again"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs mounted for this test (unmounted after it, whatever happens)."""
    with mounted(tmp_path / "disk", "2m") as disk:
        yield disk


def messages(count: int) -> list[tuple[str, object]]:
    """`count` single readings and then one batch of 50 more, with unique seqs."""
    now = int(time.time() * 1000)
    single = [(TOPIC, {**traffic(seq), "ts": now + seq}) for seq in range(count)]
    batch = [{**traffic(seq), "ts": now + seq} for seq in range(count, count + 50)]
    return [*single, (TOPIC, batch)]


def log_count(ingest: IngestProcess, text: str) -> int:
    return ingest.log.read_text().count(text)


def no_temporary_files(disk: Path) -> bool:
    return not [p for p in disk.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_a_full_disk_holds_the_acks_and_ingest_resumes_by_itself(
    small_disk: Path, broker: Broker
) -> None:
    """Before: the health write inside the retry raised ENOSPC and ingest died."""
    ingest = IngestProcess(broker, small_disk).wait_subscribed()
    filler = fill(small_disk)
    publish_all(broker, messages(300))
    wait_for(lambda: log_count(ingest, FAILED) == 1, 20, "the landing failure in the log")
    assert "No space left on device" in ingest.log.read_text()
    time.sleep(3)  # several retries (0.25 s doubling)
    assert ingest.process.poll() is None, f"ingest died:\n{ingest.log.read_text()}"
    assert log_count(ingest, FAILED) == 1, "logged per retry, not once"
    assert no_temporary_files(small_disk)
    assert not landed_keys(small_disk / "_landing")

    # Nothing was acknowledged: a kill -9 now loses nothing; the next life fails too.
    ingest.kill()
    ingest = IngestProcess(broker, small_disk)
    wait_for(lambda: log_count(ingest, FAILED) == 2, 20, "the second life's failure")

    filler.unlink()
    wait_for(lambda: len(landed_keys(small_disk / "_landing")) == 350, 30, "every reading")
    wait_for(lambda: log_count(ingest, RECOVERED) == 1, 10, "the recovery in the log")
    time.sleep(1)  # a duplicate would land about now
    assert ingest.terminate() == 0
    keys = landed_keys(small_disk / "_landing")
    assert set(keys) == {("loop-1", seq) for seq in range(350)}
    assert max(keys.values()) == 1
    assert no_temporary_files(small_disk)
    assert ingest.health["landing_failing_since_ms"] == 0


@pytest.mark.slow
def test_a_read_only_disk_holds_the_acks_until_it_is_writable(
    small_disk: Path, broker: Broker
) -> None:
    ingest = IngestProcess(broker, small_disk).wait_subscribed()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        publish_all(broker, messages(200))
        wait_for(lambda: log_count(ingest, FAILED) == 1, 20, "the landing failure in the log")
        assert "Read-only file system" in ingest.log.read_text()
        time.sleep(2)
        assert ingest.process.poll() is None, f"ingest died:\n{ingest.log.read_text()}"
        assert log_count(ingest, FAILED) == 1
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    wait_for(lambda: len(landed_keys(small_disk / "_landing")) == 250, 30, "every reading")
    assert ingest.terminate() == 0
    assert max(landed_keys(small_disk / "_landing").values()) == 1
    assert no_temporary_files(small_disk)
