"""The lakehouse on S3: the engine's delta-rs writers, maintenance and checkpoint marker
against a real S3 server (moto's, on 127.0.0.1).

What landed is read with boto3 (the bucket's object keys and bodies), not with Lookout's
storage code, and the working directory is checked to hold nothing: a lakehouse URL
mistaken for a local path would make a folder named `s3:` there.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.maintenance import TableMaintenance
from engine.spark.checkpoint_layout import CHECKPOINT_LAYOUT, check_checkpoint_layout
from engine.tables import append_once, ensure_table
from lookout.config import Config
from lookout.storage import delta_options
from tests.s3server import S3Server

SCHEMA = pa.schema([("station", pa.int64()), ("speed", pa.float64())])


@pytest.fixture(autouse=True)
def in_empty_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder, which must stay empty (nothing written locally)."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert list(tmp_path.iterdir()) == []


def rows(batch: int) -> list[dict]:
    return [{"station": batch, "speed": batch / 2}, {"station": batch, "speed": batch / 3}]


def bag(path: str, options: dict[str, str]) -> Counter:
    table = DeltaTable(path, storage_options=options).to_pyarrow_table()
    pairs = zip(table.column("station").to_pylist(), table.column("speed").to_pylist(), strict=True)
    return Counter(pairs)


def commits(s3: S3Server, prefix: str) -> list[list[dict]]:
    """Each commit of the table under `prefix`, read from the bucket with boto3."""
    bodies = s3.objects(f"{prefix}/_delta_log/")
    return [
        [orjson.loads(line) for line in body.splitlines()]
        for key, body in sorted(bodies.items())
        if key.endswith(".json")
    ]


def test_append_once_writes_each_batch_once_into_the_bucket(s3: S3Server) -> None:
    path = s3.url("lake/readings_traffic")
    options = delta_options(path, s3.settings())
    ensure_table(path, SCHEMA, options)
    ensure_table(path, SCHEMA, options)  # a second start finds the table

    settings = s3.settings()
    assert append_once(path, SCHEMA, rows(0), "landing", 0, settings) is True
    assert append_once(path, SCHEMA, rows(0), "landing", 0, settings) is False  # a re-run
    assert append_once(path, SCHEMA, rows(1), "landing", 1, settings) is True

    assert bag(path, options) == Counter(
        (b, v) for b in (0, 1) for v in (b / 2, b / 3)
    )  # fmt: skip
    log = commits(s3, "lake/readings_traffic")
    assert len(log) == 3  # create, batch 0, batch 1
    marks = [a["txn"] for commit in log for a in commit if "txn" in a]
    assert [(m["appId"], m["version"]) for m in marks] == [("landing", 0), ("landing", 1)]
    # The re-run's own copy of its file was deleted, not left beside the table's.
    data = [k for k in s3.keys("lake/readings_traffic/part-") if k.endswith(".parquet")]
    assert len(data) == 2


def test_racing_commits_both_land(s3: S3Server) -> None:
    # Two writers that read the same version: the second's commit file must not replace
    # the first's (a conditional PUT refuses it), so it retries at the next version.
    path = s3.url("lake/alerts")
    options = delta_options(path, s3.settings())
    ensure_table(path, SCHEMA, options)
    first, second = (DeltaTable(path, storage_options=options) for _ in range(2))
    write_deltalake(first, pa.Table.from_pylist(rows(1), SCHEMA), mode="append")
    write_deltalake(second, pa.Table.from_pylist(rows(2), SCHEMA), mode="append")

    assert bag(path, options) == Counter((b, v) for b in (1, 2) for v in (b / 2, b / 3))
    assert len(commits(s3, "lake/alerts")) == 3


@pytest.mark.slow
def test_maintenance_compacts_and_vacuums_tables_in_the_bucket(s3: S3Server) -> None:
    path = s3.url("lake/station_speed")
    options = delta_options(path, s3.settings())
    # The engine's tables keep removed files an hour; this one 1 s.
    retention = {"delta.deletedFileRetentionDuration": "interval 1 seconds"}
    write_deltalake(
        path, SCHEMA.empty_table(), mode="append", configuration=retention, storage_options=options
    )
    for batch in range(6):
        append_once(path, SCHEMA, rows(batch), "w", batch, s3.settings())
    before = bag(path, options)
    maintenance = TableMaintenance([path], every_s=0, min_files=2, s3=s3.settings())

    def parquet() -> list[str]:  # data files (the log's checkpoints are parquet too)
        return [k for k in s3.keys("lake/station_speed/part-") if k.endswith(".parquet")]

    (done,) = maintenance.run_once()
    assert done[1].files_removed == 6 and len(parquet()) == 7
    assert any(k.endswith(".checkpoint.parquet") for k in s3.keys("lake/station_speed/_delta_log/"))
    time.sleep(1.5)
    maintenance.run_once()

    assert maintenance.errors == {} and maintenance.vacuumed == {path: 6}
    assert len(parquet()) == 1
    assert bag(path, options) == before
    assert DeltaTable(path, storage_options=options).transaction_version("w") == 5


def test_the_checkpoint_layout_marker_is_an_object(s3: S3Server) -> None:
    config = Config(lakehouse=s3.url("lake"), s3=s3.settings())
    check_checkpoint_layout(config)
    check_checkpoint_layout(config)  # and is read back on the next start
    body = s3.objects("lake/_checkpoints/")["lake/_checkpoints/LAYOUT"]
    assert body.decode().strip() == str(CHECKPOINT_LAYOUT)
