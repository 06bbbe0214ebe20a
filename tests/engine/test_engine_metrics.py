"""`lookout_incidents_firing{rule}`, without Spark: the stateful step's health row counts
the incidents it leaves open per alert, and the gauge is set from those figures per part
of the rules (merged as the driver merges them)."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from prometheus_client import REGISTRY
from pyspark.sql.streaming.tws_tester import TwsTester

from engine import tables
from engine.spark.batch_figures import merge_figures
from engine.spark.commit import table_schemas
from engine.spark.job import watermark_lag
from engine.spark.metrics import ProgressListener, observe_step
from engine.spark.processor import EngineProcessor
from lookout.config import Config, IngestConfig
from tests.e2e.helpers import arrival_order, make_readings
from tests.engine.test_processor import _LIBRARY, PARTS, landing_batches

RULES = ("congestion", "accident", "larceny", "missed_shipping")


def firing() -> dict[str, float | None]:
    """The gauge's value per rule of RULES (None: never set)."""
    return {
        rule: REGISTRY.get_sample_value("lookout_incidents_firing", {"rule": rule})
        for rule in RULES
    }


def test_incidents_firing_per_rule_as_the_parts_that_ran_last_reported() -> None:
    traffic = {"component": "traffic", "firing": {"congestion": 2, "accident": 0}}
    rfid = {"component": "rfid", "firing": {"larceny": 1, "missed_shipping": 3}}
    observe_step("engine", merge_figures([traffic, rfid]), 0.1)
    assert firing() == {"congestion": 2, "accident": 0, "larceny": 1, "missed_shipping": 3}
    # Only the traffic part ran: its incident resolved; the RFID rules' figures stand.
    traffic["firing"] = {"congestion": 1, "accident": 0}
    observe_step("engine", merge_figures([traffic]), 0.1)
    assert firing() == {"congestion": 1, "accident": 0, "larceny": 1, "missed_shipping": 3}


def test_the_time_before_the_first_step_is_a_phase_of_the_batch() -> None:
    """The parts' steps run one after another in the batch's job: the first began after
    the job's start, the source's read and the state store's load."""

    def before_step() -> tuple[float, float]:
        labels = {"query": "engine", "phase": "before_step"}
        return (
            REGISTRY.get_sample_value("lookout_engine_batch_seconds_count", labels) or 0.0,
            REGISTRY.get_sample_value("lookout_engine_batch_seconds_sum", labels) or 0.0,
        )

    count, total = before_step()
    traffic = {"component": "traffic", "waited_ms": 900}
    rfid = {"component": "rfid", "waited_ms": 300}
    observe_step("engine", merge_figures([traffic, rfid]), 1.0)
    observe_step("engine", merge_figures([{"component": "traffic", "waited_ms": -20}]), 1.0)
    after = before_step()
    assert (after[0] - count, round(after[1] - total, 6)) == (2, 0.3)


def test_live_keys_per_rule_and_per_stream_as_the_parts_that_ran_last_reported() -> None:
    """Each rule's keys stand until its part reports again: one gauge per query once
    summed only the parts of the last batch, undercounting the others."""
    traffic = {
        "component": "traffic",
        "keys": {"station_speed": 40, "congestion": 2},
        "streams": {"traffic": {"live_keys": 40, "max_live_keys": 500, "capped": 3}},
    }
    rfid = {
        "component": "rfid",
        "keys": {"missed_shipping": 900},
        "streams": {"tag_readings": {"live_keys": 900, "max_live_keys": 0}},
    }
    observe_step("engine", merge_figures([traffic, rfid]), 0.1)
    observe_step("engine", merge_figures([traffic]), 0.1)

    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)

    live = {rule: sample("lookout_engine_live_keys", query="engine", rule=rule) for rule in
            ("station_speed", "congestion", "missed_shipping")}  # fmt: skip
    assert live == {"station_speed": 40, "congestion": 2, "missed_shipping": 900}
    assert sample("lookout_stream_live_keys", stream="tag_readings") == 900
    assert sample("lookout_stream_max_live_keys", stream="traffic") == 500
    assert sample("lookout_stream_max_live_keys", stream="tag_readings") == 0
    assert sample("lookout_stream_capped_total", stream="traffic") == 6


def test_the_stateful_step_reports_the_incidents_it_left_open(tmp_path: Path) -> None:
    """Under TwsTester: after each batch, the health row's `firing` per alert equals the
    incidents whose latest state the batch's files (and the earlier ones) leave open."""
    readings = arrival_order(make_readings(seed=5), seed=6, max_delay_ms=1_500)
    landed = landing_batches(tmp_path / "in", readings, files_per_batch=20)
    config = Config(
        lakehouse=str(tmp_path / "lakehouse"), ingest=IngestConfig(landing_url=landed.root)
    )
    for name, schema in table_schemas(_LIBRARY.plan, ("traffic", "positions")).items():
        tables.ensure_table(config.table(name), schema)
    tester = TwsTester(EngineProcessor(PARTS, config, memo_id=str(tmp_path)))
    latest: dict[str, dict] = {}  # incident id -> its latest state
    opened = 0
    for rows in landed.batches:
        health = {}
        for out in tester.test("traffic", rows):
            if out["kind"] == "health":
                health = orjson.loads(out["stats"])
            elif out["table"] == "incidents":
                found = pq.read_table(f"{config.table('incidents')}/{out['path']}")
                latest.update((row["incident_id"], row) for row in found.to_pylist())
        still_open = Counter(i["rule"] for i in latest.values() if i["resolved_at"] is None)
        assert health["firing"] == {rule: still_open[rule] for rule in health["firing"]}
        assert {"congestion", "speeding"} <= health["firing"].keys()  # 0s too
        opened = max(opened, health["firing"]["congestion"])
    assert opened, "some batch left a congestion incident open"


def test_a_slow_batch_is_logged_with_its_phases_longest_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listener = ProgressListener({"engine"})
    progress = {
        "name": "engine",
        "batchId": 573,
        "numInputRows": 180,
        "durationMs": {
            "triggerExecution": 18_200,
            "queryPlanning": 2_100,
            "addBatch": 15_000,
            "getBatch": 40,
            "walCommit": 300,
        },
        "stateOperators": [{"commitTimeMs": 700}],
    }
    with caplog.at_level(logging.INFO, logger="lookout.engine"):
        listener.take_progress(progress)
        listener.take_progress({**progress, "durationMs": {"triggerExecution": 600}})
    assert [r.getMessage() for r in caplog.records] == [
        "engine: batch 573 took 18.2 s for 180 landing files: add_batch 15.0 s, plan 2.1 s, "
        "state_commit 0.7 s, wal 0.3 s"
    ]


def test_the_state_stores_memory_and_files_are_summed_over_the_query_operators() -> None:
    listener = ProgressListener({"engine"})
    operators = [
        {"memoryUsedBytes": 1_000, "customMetrics": {"rocksdbSstFileSize": 7_000}},
        {"memoryUsedBytes": 500, "customMetrics": {"rocksdbSstFileSize": 3_000}},
    ]
    listener.take_progress({"name": "engine", "stateOperators": operators})
    sample = REGISTRY.get_sample_value
    assert sample("lookout_state_store_memory_bytes", {"query": "engine"}) == 1_500
    assert sample("lookout_state_store_files_bytes", {"query": "engine"}) == 10_000


def test_the_progress_log_gives_a_lag_or_a_time_for_a_clock_of_its_own() -> None:
    """A watermark near this machine's clock is a lag; one a day or more away (a
    recording, a simulated day, a far heartbeat) is a time, not months of lag."""
    now = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    assert watermark_lag("traffic", now - 3_400, now) == "traffic watermark 3.4 s behind"
    assert watermark_lag("traffic", now - 86_400_000, now) == ("traffic watermark 86400.0 s behind")
    assert watermark_lag("tag_readings", now - 275 * 86_400_000, now) == (
        "tag_readings watermark at 2025-04-01T00:00:00.000+00:00 (a clock a day or more apart)"
    )
    assert watermark_lag("traffic", 2**62, now).startswith(f"traffic watermark at {2**62} ms")
