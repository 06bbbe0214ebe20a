"""Heartbeats for silent streams, from the bounded-delay assumption (ingest.heartbeats).

Timeline of one stream with S = 2 s (wall time on the left, event time on the right):

    wall 10.0  reading ts=100.0         T = 100.0, heard at 10.0
    wall 11.9  (silent 1.9 s < S)       nothing
    wall 12.0  (silent 2.0 s = S)       heartbeat at T + 2.0 - 2.0 = 100.0
    wall 12.5  (0.5 s since the last)   nothing: at most one a second
    wall 13.0  (silent 3.0 s)           heartbeat at 101.0
    wall 13.5  reading ts=99.0 (late)   T stays 100.0, heard at 13.5
    wall 16.0  (silent 2.5 s)           T + 0.5 = 100.5 <= 101.0: nothing (never back)
    wall 17.0  (silent 3.5 s)           heartbeat at 101.5
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.heartbeats import SilenceHeartbeats
from ingest.service import build_ingester
from lookout.broker import Broker
from lookout.config import Config
from rules.language.loader import load_rules
from tests.ingest.conftest import RULES
from tests.ingest.helpers import landed_lines, publish_all, traffic
from tests.waiting import wait_for


def test_the_timeline_in_the_docstring() -> None:
    beats = SilenceHeartbeats(after_ms=2_000)
    beats.observe("traffic", 100_000, 10_000)
    assert beats.due(11_900) == []
    assert beats.due(12_000) == [("traffic", 100_000)]
    assert beats.due(12_500) == []
    assert beats.due(13_000) == [("traffic", 101_000)]
    beats.observe("traffic", 99_000, 13_500)
    assert beats.due(16_000) == []
    assert beats.due(17_000) == [("traffic", 101_500)]


def test_nothing_for_a_stream_never_heard_from() -> None:
    assert SilenceHeartbeats(after_ms=1).due(10**12) == []
    with pytest.raises(ValueError):
        SilenceHeartbeats(after_ms=0)


@given(
    events=st.lists(
        st.tuples(st.integers(0, 5_000), st.integers(-3_000, 3_000), st.booleans()),
        max_size=60,
    )
)
def test_heartbeats_never_go_back_and_respect_the_bound(
    events: list[tuple[int, int, bool]],
) -> None:
    """Readings arrive at most S late (event clock = wall clock here): no heartbeat is
    ever ahead of a reading that arrives after it, and heartbeats only move forward."""
    after = 2_000
    beats = SilenceHeartbeats(after_ms=after, every_ms=100)
    wall, emitted = 0, []
    for step, delay, observe in events:
        wall += step
        if observe:  # a reading whose event time is at most `after` behind the wall clock
            ts = wall - min(abs(delay), after)
            assert all(beat <= ts for beat in emitted)
            beats.observe("s", ts, wall)
        emitted += [ts for _, ts in beats.due(wall)]
    assert emitted == sorted(set(emitted))


@pytest.mark.mqtt
def test_ingest_lands_heartbeats_for_a_silent_stream(tmp_path: Path, broker: Broker) -> None:
    """With heartbeat_after 0.5 s, a stream that sent one reading and then fell silent
    gets heartbeats from ingest among its lines, each later than the one before."""
    config = Config(lakehouse=str(tmp_path / "lakehouse"), mqtt=broker.mqtt_config())
    ingester = build_ingester(config, load_rules([str(RULES)]), heartbeat_after_s=0.5)
    thread = threading.Thread(target=ingester.run, daemon=True)
    thread.start()
    wait_for(lambda: ingester.stats.subscribed, 20, "ingest to subscribe")
    reading = {**traffic(1), "ts": int(time.time() * 1000)}
    publish_all(broker, [("lookout/traffic/1/readings", reading)])
    landing = Path(config.landing)
    wait_for(lambda: len(landed_lines(landing, "traffic")) >= 3, 10, "two heartbeats")
    ingester.stop()
    thread.join(30)

    first, *beats = landed_lines(landing, "traffic")
    assert first["seq"] == 1
    assert {b["_kind"] for b in beats} == {"heartbeat"}
    assert {b["source"] for b in beats} == {"ingest-0"}
    times = [b["ts"] for b in beats]
    assert times == sorted(set(times)) and times[0] >= reading["ts"]
    assert times[-1] <= reading["ts"] + (beats[-1]["_received_ms"] - first["_received_ms"])
    assert ingester.stats.heartbeats_emitted == len(beats)
