"""Fixtures of the ingest tests: a fresh mosquitto per test, the rules' source streams."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.core.plan import StreamSchema
from lookout.broker import Broker, free_port
from rules.language.loader import load_rules

RULES = Path(__file__).resolve().parents[2] / "rules"


@pytest.fixture(scope="session")
def sources() -> list[StreamSchema]:
    """The streams every `CREATE STREAM … SOURCE` of the shipped rules declares."""
    return list(load_rules([str(RULES)]).plan.sources())


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A mosquitto of our own (shipped config): tests may restart it, and no session of
    an earlier test's ingester queues messages on it."""
    broker = Broker("127.0.0.1", free_port(), tmp_path_factory.mktemp("broker")).start()
    yield broker
    broker.stop()
