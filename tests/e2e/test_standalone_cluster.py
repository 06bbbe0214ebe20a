"""The engine on a Spark standalone cluster: a master and two workers on this machine
(`lookout cluster`), executors in their own JVMs with their own Python workers, the
lakehouse shared through the local disk. The congestion rules over disordered readings
must give exactly the alerts `lookout replay` gives, as in local mode.
"""

from __future__ import annotations

import os
import signal

import orjson
import pytest
from deltalake import DeltaTable

from lookout.cluster import LocalCluster
from lookout.replay import run_replay
from rules.language.loader import load_rules
from tests.e2e.test_congestion import (
    CONGESTION_RULES,
    T0,
    arrival_order,
    as_messages,
    make_readings,
)
from tests.e2e.test_engine_restart import start_engine
from tests.e2e.test_live_equals_replay import normalised
from tests.pipeline import publish, running_ingest, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]


def alerts(config) -> list[dict]:
    path = config.table("alerts")
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        return []
    return DeltaTable(path).to_pyarrow_table().to_pylist()


def test_the_engine_on_a_standalone_cluster_gives_the_replay_alerts(
    mosquitto, lookout_config, tmp_path
):
    rules_file = tmp_path / "congestion.sql"
    rules_file.write_text(CONGESTION_RULES)
    rule_set = load_rules([rules_file])
    readings = arrival_order(make_readings(seed=31), seed=32, max_delay_ms=1_500)
    recording = tmp_path / "arrivals.jsonl"
    recording.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in readings))
    assert run_replay([str(rules_file)], [f"traffic={recording}"], str(tmp_path / "replay")) == 0
    want = [
        orjson.loads(x) for x in (tmp_path / "replay/congestion.jsonl").read_bytes().splitlines()
    ]
    assert want
    heartbeat = (
        "lookout/traffic/gw/heartbeat",
        orjson.dumps({"source": "gw", "ts": T0 + 80 * 60_000}),
    )

    with LocalCluster(tmp_path / "cluster", workers=2, cores=1, memory="1g") as cluster:
        with running_ingest(lookout_config, rule_set):
            engine = start_engine(
                lookout_config, rules_file, tmp_path / "engine.log",
                LOOKOUT_ENGINE_MASTER=cluster.url,
            )  # fmt: skip
            try:
                publish(mosquitto, [*as_messages(readings, seed=33), heartbeat])
                wait_for(
                    lambda: len(alerts(lookout_config)) >= len(want),
                    400,
                    f"{len(want)} alerts from the cluster",
                )
            finally:
                os.killpg(engine.pid, signal.SIGTERM)
                engine.wait(timeout=120)
        # The work ran on the workers' executors, not in the driver.
        executor_logs = list((tmp_path / "cluster").glob("worker-*/app-*/*/stderr"))
        assert len(executor_logs) == 2, "one executor per worker"

    got = [orjson.loads(a["payload"]) for a in alerts(lookout_config)]
    assert normalised(got, {"ts"}) == normalised(want, {"ts"})
