"""The engine on a Spark standalone cluster: a master and two workers on this machine
(`lookout cluster`), executors in their own JVMs with their own Python workers, the
lakehouse shared through the local disk. The congestion rules over disordered readings
must give exactly the alerts `lookout replay` gives, as in local mode.
"""

from __future__ import annotations

import orjson
import pytest

from lookout.cluster import LocalCluster
from tests.e2e.test_congestion import (
    CLOSING_HEARTBEAT,
    arrival_order,
    as_messages,
    make_readings,
    replay_congestion,
)
from tests.e2e.test_engine_restart import start_engine, stop_engine
from tests.e2e.test_live_equals_replay import normalised
from tests.pipeline import delta_rows, publish, running_ingest, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]


def test_the_engine_on_a_standalone_cluster_gives_the_replay_alerts(
    mosquitto, lookout_config, tmp_path
):
    readings = arrival_order(make_readings(seed=31), seed=32, max_delay_ms=1_500)
    replayed = replay_congestion(tmp_path, readings)

    with LocalCluster(tmp_path / "cluster", workers=2, cores=1, memory="1g") as cluster:
        with running_ingest(lookout_config, replayed.rule_set):
            engine = start_engine(
                lookout_config, replayed.rules_file, tmp_path / "engine.log",
                LOOKOUT_ENGINE_MASTER=cluster.url,
            )  # fmt: skip
            try:
                publish(mosquitto, [*as_messages(readings, seed=33), CLOSING_HEARTBEAT])
                wait_for(
                    lambda: len(delta_rows(lookout_config, "alerts")) >= len(replayed.alerts),
                    400,
                    f"{len(replayed.alerts)} alerts from the cluster",
                )
            finally:
                stop_engine(engine)
        # The work ran on the workers' executors, not in the driver.
        executor_logs = list((tmp_path / "cluster").glob("worker-*/app-*/*/stderr"))
        assert len(executor_logs) == 2, "one executor per worker"

    got = [orjson.loads(a["payload"]) for a in delta_rows(lookout_config, "alerts")]
    assert normalised(got, {"ts"}) == normalised(replayed.alerts, {"ts"})
    # Stopped the way docs/runtime.md says: the queries, then Spark; no error logged.
    assert "terminated with error" not in (tmp_path / "engine.log").read_text()
