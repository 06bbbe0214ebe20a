"""A worker's commits of its tasks' files (`engine.spark.commit.TaskCommits`): exactly
once per writer and batch."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from engine import tables
from engine.spark.commit import TaskCommits
from lookout.config import Config

SCHEMA = pa.schema([("v", pa.int64())])


def _file(config: Config, batch_id: int) -> tables.DataFile:
    data = pa.table({"v": [batch_id]}, schema=SCHEMA)
    return tables.write_data_file("t", config.table("t"), data, config.s3, batch_id)


def test_a_batch_committed_again_is_not_added_twice(tmp_path: Path) -> None:
    config = Config(lakehouse=str(tmp_path))
    location = config.table("t")
    tables.ensure_table(location, SCHEMA)
    commits = TaskCommits(config.s3)
    first = _file(config, 4)
    commits.commit(config, {"t": SCHEMA}, {"t": [first]}, ("q", 1), 4)
    copy = _file(config, 4)
    commits.commit(config, {"t": SCHEMA}, {"t": [copy]}, ("q", 1), 4)
    table = DeltaTable(location)
    assert table.to_pyarrow_table().num_rows == 1
    assert table.transaction_version("lookout-q-t-p1") == 4
    assert not (Path(location) / copy.path).exists()


def test_a_partition_writer_takes_over_the_batches_the_single_writer_committed(
    tmp_path: Path,
) -> None:
    """A lakehouse an earlier Lookout wrote: its driver committed every partition's files
    as one writer, the last batch (5) just before it stopped. Run again, each
    partition's task finds batch 5 done; batch 6 is committed by the partitions'
    writers."""
    config = Config(lakehouse=str(tmp_path))
    location = config.table("t")
    tables.ensure_table(location, SCHEMA)
    assert tables.commit_files(location, SCHEMA, [_file(config, 5)], "lookout-q-t", 5)
    commits = TaskCommits(config.s3)
    for partition in (0, 1):
        commits.commit(config, {"t": SCHEMA}, {"t": [_file(config, 5)]}, ("q", partition), 5)
    table = DeltaTable(location)
    assert table.to_pyarrow_table().num_rows == 1
    for partition in (0, 1):
        commits.commit(config, {"t": SCHEMA}, {"t": [_file(config, 6)]}, ("q", partition), 6)
    table = DeltaTable(location)
    assert table.to_pyarrow_table().num_rows == 3
    assert table.transaction_version("lookout-q-t-p0") == 6
    assert table.transaction_version("lookout-q-t") == 5
