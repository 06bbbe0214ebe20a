"""Shared fixtures: one real mosquitto and one SparkSession per test session, and an S3
server (moto's) per test that asks for one.

Both are real (no mocks): the broker is the Debian mosquitto started from the shipped
`deploy/mosquitto.conf` on a free loopback port; Spark runs in local mode with Delta.
A SparkSession takes seconds to start, so every Spark test shares this one.

Under pytest-xdist (`-n`, the fast lane) each worker is a test session of its own, with
its own mosquitto; the Spark and browser tests refuse to run there (see
`pytest_runtest_setup`).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from lookout.broker import Broker, free_port
from lookout.config import Config, EngineConfig
from tests.s3server import S3Server

# Alertmanager and its webhook receiver, for the notifier's and the dashboard's tests.
pytest_plugins = ["tests.alertmanager"]

# The fast lane's profile: a fifth of every property test's examples (`tests/examples.py`).
settings.register_profile("dev", max_examples=20)


def pytest_configure(config: pytest.Config) -> None:
    """A run that deselects the slow tests is the edit-test loop: it draws the `dev`
    profile's examples unless a profile is named; the full suite keeps the full count."""
    markexpr = config.getoption("markexpr") or ""
    if "not slow" in markexpr and not config.getoption("hypothesis_profile"):
        settings.load_profile("dev")


@pytest.hookimpl(tryfirst=True)  # before any fixture starts Spark or Chromium
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Spark and browser tests run in one process, one after another: under several
    pytest-xdist workers (`-n`, the fast lane's) each fails at once, rather than start a
    SparkSession or a Chromium per worker side by side."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1 and (
        item.get_closest_marker("spark") or item.get_closest_marker("browser")
    ):
        pytest.fail(
            "spark and browser tests run without -n (with -n, add -m 'not spark and not browser')",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A mosquitto with Lookout's configuration (persistence on, no queue limit, a login
    per role: `broker.credentials`, `broker.mqtt_config()`)."""
    broker = Broker("127.0.0.1", free_port(), tmp_path_factory.mktemp("mosquitto")).start()
    yield broker
    broker.stop()


def _s3_server(own_process: bool) -> Iterator[S3Server]:
    port = free_port()
    server = S3Server(port, f"lake-{port}", own_process)
    server.start()
    server.client().create_bucket(Bucket=server.bucket)
    yield server
    server.stop()


@pytest.fixture
def s3() -> Iterator[S3Server]:
    """A real S3 server (moto's, a thread of this process) on a free loopback port, with
    an empty bucket of this test's own."""
    yield from _s3_server(own_process=False)


@pytest.fixture
def s3_process() -> Iterator[S3Server]:
    """The same in a process of its own (see tests/s3server.py for when that matters)."""
    yield from _s3_server(own_process=True)


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """The one SparkSession of the test run (local[2], Delta, RocksDB state store), its
    JVM started from the class archive, as an engine's is (recorded first if missing)."""
    from engine.spark.session import build_session
    from lookout.demo import lookout_argv
    from rules.language.loader import RULES_DIR

    record = lookout_argv("engine", "--archive-classes", "--rules", str(RULES_DIR))
    subprocess.run(record, check=True)
    session = build_session(EngineConfig(master="local[2]", shuffle_partitions=2), "lookout-tests")
    yield session
    session.stop()


@pytest.fixture
def lookout_config(tmp_path: Path, mosquitto: Broker) -> Config:
    """A configuration with a fresh lakehouse and the test broker (and its logins)."""
    return Config(
        lakehouse=str(tmp_path / "lakehouse"),
        mqtt=mosquitto.mqtt_config(),
        engine=EngineConfig(master="local[2]", shuffle_partitions=2, trigger_seconds=0.5),
    )
