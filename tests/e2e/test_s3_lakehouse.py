"""The whole pipeline on object storage, on a cluster: ingest lands into S3, and `lookout
engine` (its own process, Spark with Hadoop's S3A connector and delta-rs) runs on a
Spark standalone cluster (`lookout cluster`: a master and two workers on this machine,
executors in JVMs of their own). It reads the landing, writes its tables, checkpoints
(the executors write the state store's files), health and compactions in the bucket,
and its alerts must be exactly the ones `lookout replay` gives for the same readings.

The S3 server is moto's in a process of its own on 127.0.0.1; the engine reaches it only
through `LOOKOUT_LAKEHOUSE_PATH` and `LOOKOUT_S3_*`, and the executors only through the
Spark configuration the driver gives them. The bucket is read back with boto3 and
delta-rs, not with Lookout's code.
"""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from lookout.cluster import LocalCluster
from tests.e2e.helpers import (
    CLOSING_HEARTBEAT,
    arrival_order,
    as_messages,
    make_readings,
    normalised,
    replay_congestion,
    start_engine,
    stop_engine,
)
from tests.pipeline import delta_rows, publish, running_ingest, wait_for
from tests.s3server import SECRET, S3Server

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]


def health(s3: S3Server, part: str) -> dict:
    """`part`'s health record, read from the bucket with boto3 ({} before the first)."""
    key = f"lake/_health/{part}.json"
    body = s3.objects(key).get(key)
    return {} if body is None else orjson.loads(body)


def test_the_engine_on_an_s3_lakehouse_gives_the_replay_alerts(
    mosquitto, lookout_config, tmp_path, s3_process: S3Server
):
    s3 = s3_process
    config = replace(lookout_config, lakehouse=s3.url("lake"), s3=s3.settings())
    readings = arrival_order(make_readings(seed=41), seed=42, max_delay_ms=1_500)
    replayed = replay_congestion(tmp_path, readings)

    log = tmp_path / "engine.log"
    with (
        LocalCluster(tmp_path / "cluster", workers=2, cores=1, memory="1g") as cluster,
        running_ingest(config, replayed.rule_set),
    ):
        engine = start_engine(
            config,
            replayed.rules_file,
            log,
            **s3.env(),
            LOOKOUT_ENGINE_MASTER=cluster.url,
            # Compaction rounds while the queries run, on the bucket's tables.
            LOOKOUT_ENGINE_COMPACT_EVERY_SECONDS="2",
            LOOKOUT_ENGINE_COMPACT_MIN_FILES="2",
        )
        try:
            # In two parts, the second once the first is in the bucket, so the tables
            # hold at least two files for a compaction to merge.
            messages = [*as_messages(readings, seed=43), CLOSING_HEARTBEAT]
            half = len(messages) // 2
            publish(mosquitto, messages[:half])
            wait_for(lambda: delta_rows(config, "readings_traffic"), 400, "the first readings")
            publish(mosquitto, messages[half:])

            def all_alerts() -> bool:
                assert engine.poll() is None, f"lookout engine exited; see {log}"
                return len(delta_rows(config, "alerts")) >= len(replayed.alerts)

            wait_for(all_alerts, 400, f"{len(replayed.alerts)} alerts on S3")
            wait_for(
                lambda: health(s3, "engine").get("maintenance", {}).get("compactions"),
                60,
                "a compaction on S3 in the engine's health record",
            )
        finally:
            stop_engine(engine)
        # The stateful work ran on the workers' executors, which wrote the state store's
        # files into the bucket.
        executor_logs = list((tmp_path / "cluster").glob("worker-*/app-*/*/stderr"))
        assert len(executor_logs) == 2, "one executor per worker"
        state = [k for k in s3.keys("lake/_checkpoints/engine/") if "/state/" in k]
        assert state, "the engine query's state store in the bucket"

    got = [orjson.loads(a["payload"]) for a in delta_rows(config, "alerts")]
    assert normalised(got, {"ts"}) == normalised(replayed.alerts, {"ts"})
    assert health(s3, "engine")["maintenance"]["errors"] == {}
    assert health(s3, "ingest-0")["readings"] == len(readings)
    keys = s3.keys("lake/")
    # The engine query read its files from the bucket: its offsets name them, and
    # committed ones left it (only the files of the last batch, named by its offset, stay
    # until a next batch commits them).
    offsets = s3.objects("lake/_checkpoints/engine/offsets/")
    assert b"stream=traffic/part-" in b"".join(offsets.values())
    last = max(
        (k for k in offsets if k.rsplit("/", 1)[1].isdigit()),
        key=lambda k: int(k.rsplit("/", 1)[1]),
    )
    named = orjson.loads(offsets[last].splitlines()[-1])["files"]
    # (pyarrow leaves a folder's marker, "stream=traffic/", once its last file goes)
    left = {k.removeprefix("lake/_landing/") for k in s3.keys("lake/_landing/") if k[-1] != "/"}
    assert left <= set(named)
    assert "lake/_checkpoints/LAYOUT" in keys
    assert any(k.startswith("lake/_checkpoints/engine/commits/") for k in keys)
    assert SECRET not in log.read_text()
    # Stopped the way docs/runtime.md says: the queries, then Spark; no error logged.
    assert "terminated with error" not in log.read_text()
