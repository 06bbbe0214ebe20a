"""kill -9 of the engine mid-stream, then a restart from its checkpoints: nothing lost,
nothing twice.

`lookout engine` runs as its own process over the congestion rules. Half the readings
are published; once some alerts are in Delta the engine is killed with SIGKILL (no
chance to finish a batch or close anything), restarted, and the rest of the readings
and a closing heartbeat follow. The tables must then hold what `lookout replay` computes
for the same readings: every reading stored once, every alert once (same ids), the late
readings once, every incident in the state replay ends with (the incidents table is
merged once per batch).
"""

from __future__ import annotations

import os
import signal

import orjson
import pytest

from engine.core.replay import run
from lookout.replay import alert_ids, read_readings
from tests.e2e.helpers import (
    CLOSING_HEARTBEAT,
    arrival_order,
    as_messages,
    incidents,
    make_readings,
    ms,
    replay_congestion,
    start_engine,
    stop_engine,
)
from tests.pipeline import delta_rows, publish, running_ingest, table_rows, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]


def test_engine_kill_9_and_restart_gives_the_uninterrupted_tables(
    spark, mosquitto, lookout_config, tmp_path
):
    readings = arrival_order(make_readings(seed=21), seed=22, max_delay_ms=1_500)
    # A few readings far behind the slack, so late capture crosses the restart too.
    late = [dict(r, seq=10_000 + i, ts=r["ts"] - 30_000) for i, r in enumerate(readings[400::150])]
    stream = readings[:400] + late[:1] + readings[400:] + late[1:]
    half = len(stream) // 2
    replayed = replay_congestion(tmp_path, stream)
    rules_file, rule_set, want_alerts = replayed.rules_file, replayed.rule_set, replayed.alerts
    want_late = replayed.rows("late_readings")
    assert want_late
    want_incidents = sorted(
        (r["incident_id"], r["key"], ms(r["opened_at"]), ms(r["resolved_at"]), r["reports"])
        for r in map(orjson.loads, replayed.rows("incidents"))
    )
    assert want_incidents

    log = tmp_path / "engine.log"
    with running_ingest(lookout_config, rule_set):
        engine = start_engine(lookout_config, rules_file, log)
        try:
            publish(mosquitto, as_messages(stream[:half], seed=23))
            wait_for(
                lambda: delta_rows(lookout_config, "alerts"),
                240,
                "the first alerts before the kill",
            )
            os.killpg(engine.pid, signal.SIGKILL)
            engine.wait()
            publish(mosquitto, [*as_messages(stream[half:], seed=24), CLOSING_HEARTBEAT])
            engine = start_engine(lookout_config, rules_file, log)
            wait_for(
                lambda: len(delta_rows(lookout_config, "alerts")) >= len(want_alerts),
                300,
                f"{len(want_alerts)} alerts after the restart",
            )
            wait_for(
                lambda: (
                    len(delta_rows(lookout_config, "readings_traffic"))
                    + len(delta_rows(lookout_config, "late_readings"))
                    >= len(stream)
                ),
                120,
                "every reading stored",
            )
            wait_for(
                lambda: incidents(delta_rows(lookout_config, "incidents")) == want_incidents,
                60,
                "the incidents replay gives",
            )
        finally:
            stop_engine(engine)

    alerts = table_rows(spark, lookout_config, "alerts")
    # The ids an uninterrupted run gives: replay's alert outputs, identified as live.
    outputs = run(
        rule_set.plan, read_readings([((rule_set.plan.streams["traffic"],), replayed.recording)])
    )
    want_ids = sorted(alert_ids(rule_set.plan, outputs.outputs))
    assert len(want_ids) == len(want_alerts)
    assert sorted(a["alert_id"] for a in alerts) == want_ids, (
        "alerts after kill -9 and restart must be the uninterrupted run's, each once"
    )
    assert len({a["alert_id"] for a in alerts}) == len(alerts)
    stored = table_rows(spark, lookout_config, "readings_traffic")
    assert (
        len(stored)
        == len({(r["source"], r["seq"]) for r in stored})
        == len(stream) - len(want_late)
    )
    late_rows = table_rows(spark, lookout_config, "late_readings")
    assert sorted((r["source"], r["seq"]) for r in late_rows) == sorted(
        (orjson.loads(x)["source"], orjson.loads(x)["seq"]) for x in want_late
    )
