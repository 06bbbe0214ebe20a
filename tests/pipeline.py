"""Helpers for tests that run real parts: publish to mosquitto, run ingest and the engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import deltalake
import paho.mqtt.client as mqtt
from deltalake.exceptions import TableNotFoundError

from engine.spark.job import EngineJob
from ingest.service import build_ingester
from ingest.subscriber import Ingester
from lookout.broker import Broker
from lookout.config import Config
from lookout.mqtt_auth import PUBLISHER
from lookout.services import alert_specs
from lookout.storage import delta_options
from rules.language.loader import RuleSet
from tests.waiting import wait_for

__all__ = ["delta_rows", "publish", "running_engine", "running_ingest", "table_rows", "wait_for"]


def publish(broker: Broker, messages: Sequence[tuple[str, bytes]], qos: int = 1) -> None:
    """Publish every (topic, payload) with QoS 1, logged in as a publisher, and wait
    until the broker acked each."""
    client = mqtt.Client(
        callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
        client_id=f"test-publisher-{time.monotonic_ns()}",
    )
    assert broker.credentials is not None
    login = broker.credentials.login(PUBLISHER)
    client.username_pw_set(login.username, login.password)
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        infos = [client.publish(topic, payload, qos=qos) for topic, payload in messages]
        for info in infos:
            info.wait_for_publish(timeout=30)
            assert info.is_published(), "the broker did not acknowledge a publish"
    finally:
        client.disconnect()
        client.loop_stop()


@contextmanager
def running_ingest(config: Config, rule_set: RuleSet, ingester_id: str = "0") -> Iterator[Ingester]:
    """An ingester in a background thread; on exit it flushes, acks and disconnects."""
    ingester = build_ingester(config, rule_set, ingester_id)
    thread = threading.Thread(target=ingester.run, daemon=True)
    thread.start()
    try:
        # The subscription must exist (SUBACK) before anything is published.
        wait_for(lambda: ingester.stats.subscribed, 20, "ingest to subscribe")
        yield ingester
    finally:
        ingester.stop()
        thread.join(timeout=30)


@contextmanager
def running_engine(config: Config, rule_set: RuleSet, spark: Any) -> Iterator[EngineJob]:
    """The engine's streaming queries on the shared SparkSession."""
    job = EngineJob(config, rule_set.plan, alert_specs(rule_set), spark=spark)
    job.start()
    try:
        yield job
    finally:
        job.stop()


def no_batch_running(engine: EngineJob) -> bool:
    """Whether none of the engine's queries runs a batch. A batch's tasks commit its
    Delta rows before Spark commits its state, so a test that reads the state store
    after seeing the rows waits for this too."""
    return all(not query.status["isTriggerActive"] for query, _ in engine.queries)


def table_rows(spark: Any, config: Config, name: str) -> list[dict[str, Any]]:
    """Every row of a Delta table as dicts (empty when the table does not exist yet)."""
    from delta.tables import DeltaTable

    path = config.table(name)
    if not DeltaTable.isDeltaTable(spark, path):
        return []
    return [row.asDict() for row in spark.read.format("delta").load(path).collect()]


def delta_rows(config: Config, name: str) -> list[dict[str, Any]]:
    """Every row of a lakehouse table read with delta-rs, without Spark (for an engine
    run in its own process; an S3 lakehouse through `[s3]`); empty before the table
    exists."""
    path = config.table(name)
    try:
        table = deltalake.DeltaTable(path, storage_options=delta_options(path, config.s3))
    except TableNotFoundError:
        return []
    return table.to_pyarrow_table().to_pylist()
