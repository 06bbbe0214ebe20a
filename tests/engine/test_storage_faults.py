"""The engine's parts for a full or read-only disk, without Spark: each library's words
for it, the probe, what failed writes leave and what removes it, and the health record
that says so on the very disk that is full (the whole engine through a full and a
read-only disk: tests/e2e/test_engine_disk_full.py).

The disks are small tmpfs mounts: mounting needs root, elsewhere those tests are skipped,
saying so.
"""

from __future__ import annotations

import errno
import logging
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from engine import tables
from engine.core.plan import Column, ColumnType, StreamSchema
from engine.spark.job import EngineJob
from engine.storage_faults import (
    DISK_FULL,
    READ_ONLY,
    StorageFault,
    fault_line,
    fault_of,
    probe,
    remove_temporaries,
)
from lookout.config import Config, HealthConfig, S3Config
from lookout.health import problems, read_health
from rules.language.loader import load_rules
from tests.disks import fill, remount, small_disk
from tests.e2e.helpers import CONGESTION_RULES

TRAFFIC = StreamSchema(
    "traffic",
    (Column("station", ColumnType.INT), Column("ts", ColumnType.TIMESTAMP)),
    "ts",
    2_000,
    "lookout/traffic/+/readings",
)
S3 = S3Config()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device", DISK_FULL),
        ("java.io.FileNotFoundException: /l/_checkpoints/x.tmp (Read-only file system)", READ_ONLY),
        ("OSError: [Errno 28] Error writing bytes to file. Detail: [errno 28] oops", DISK_FULL),
        ("Generic LocalFileSystem error: Unable to write: (os error 122)", DISK_FULL),
        ("Failed to open local file '/l/x'. Detail: [errno 30] Read-only file system", READ_ONLY),
        ("[STREAM_FAILED] Query engine terminated: division by zero", None),
        ("os error 280", None),
    ],
)
def test_each_library_s_words_for_a_full_or_read_only_disk(text, problem):
    failure = f"engine: [STREAM_FAILED] Query engine terminated\nCaused by: {text}\n\tat x.y(Z)"
    assert fault_of(failure) == problem
    if problem is not None:
        assert fault_line(failure) == text


def test_an_os_error_says_it_by_its_errno():
    assert fault_of(OSError(errno.ENOSPC, "x")) == DISK_FULL
    assert fault_of(OSError(errno.EDQUOT, "x")) == DISK_FULL
    assert fault_of(OSError(errno.EROFS, "x")) == READ_ONLY
    assert fault_of(OSError(errno.EIO, "x")) is None


def _write(path: str, batch: int | None) -> tables.DataFile:
    data = pa.table({"station": pa.array([1], pa.int32()), "ts": pa.array([0], tables.TIMESTAMP)})
    return tables.write_data_file("t", path, data, batch_id=batch)


def test_the_files_of_batches_that_never_committed_are_removed_and_no_other(tmp_path):
    path = str(tmp_path / "t")
    tables.ensure_table(path, tables.stream_schema(TRAFFIC))
    committed = _write(path, 0)
    assert tables.commit_files(path, tables.stream_schema(TRAFFIC), [committed], "w", 0)
    failed = _write(path, 1)  # batch 1 wrote, then the disk filled before its commit
    replaced = _write(path, 0)  # of a committed batch (a compaction's input): kept
    unnamed = _write(path, None)  # not the engine's batch: never its to remove
    assert all(f.path.startswith("part-b") for f in (committed, failed, replaced))

    assert tables.remove_orphans(path, ["w"]) == [failed.path]
    left = {p.name for p in (tmp_path / "t").glob("*.parquet")}
    assert left == {committed.path, replaced.path, unnamed.path}
    assert DeltaTable(path).to_pyarrow_table().num_rows == 1
    # A table that holds no batch of the writer: each of its batches' files not in it.
    assert sorted(tables.remove_orphans(path, ["another"])) == [replaced.path]
    assert tables.remove_orphans(str(tmp_path / "none"), ["w"]) == []


def test_the_files_later_than_the_least_of_several_writers_batches_are_orphans(tmp_path):
    """Writers of one table (a query's state-store partitions): a file not in the table
    is an orphan if it is later than the last batch of any of them."""
    path = str(tmp_path / "t")
    tables.ensure_table(path, tables.stream_schema(TRAFFIC))
    assert tables.commit_files(path, tables.stream_schema(TRAFFIC), [_write(path, 0)], "w", 0)
    assert tables.commit_files(path, tables.stream_schema(TRAFFIC), [_write(path, 3)], "v", 3)
    failed = _write(path, 2)  # later than w's last batch, not v's
    assert tables.remove_orphans(path, ["v"]) == []
    assert tables.remove_orphans(path, ["v", "w"]) == [failed.path]


def test_a_writer_that_has_not_committed_yet_counts_with_the_version_it_inherits(tmp_path):
    """A partition's writer that has committed nothing yet stands at the single writer's
    last batch (a lakehouse an earlier Lookout wrote)."""
    path = str(tmp_path / "t")
    tables.ensure_table(path, tables.stream_schema(TRAFFIC))
    assert tables.commit_files(path, tables.stream_schema(TRAFFIC), [_write(path, 4)], "w", 4)
    assert tables.commit_files(path, tables.stream_schema(TRAFFIC), [_write(path, 6)], "w-p0", 6)
    kept, failed = _write(path, 4), _write(path, 5)
    assert tables.remove_orphans(path, ["w-p0", "w-p1"], inherits="w") == [failed.path]
    assert (tmp_path / "t" / kept.path).exists()


def test_a_data_file_that_does_not_fit_is_not_left_half_written(tmp_path):
    with small_disk(tmp_path / "disk", "1m") as disk:
        (disk / "t").mkdir()
        fill(disk)
        with pytest.raises(OSError) as failed:
            _write(str(disk / "t"), 3)
        assert fault_of(failed.value) == DISK_FULL
        assert not list((disk / "t").glob("*"))


def test_the_probe_says_whether_a_disk_takes_writes_and_leaves_nothing(tmp_path):
    with small_disk(tmp_path / "disk", "2m") as disk:
        folder = str(disk / "lakehouse" / "_checkpoints")
        assert probe(folder, S3) is None
        filler = fill(disk)
        full = probe(folder, S3)
        assert full is not None and fault_of(full) == DISK_FULL
        filler.unlink()
        remount(disk, "ro")
        try:
            read_only = probe(folder, S3)
            assert read_only is not None and fault_of(read_only) == READ_ONLY
        finally:
            remount(disk, "rw")
        assert [p.name for p in disk.rglob("*") if p.is_file()] == []


def test_spark_s_temporary_checkpoint_files_are_removed_and_no_other(tmp_path):
    offsets = tmp_path / "engine" / "offsets"
    state = tmp_path / "engine" / "state" / "0" / "1"
    for folder in (offsets, state):
        folder.mkdir(parents=True)
    kept = [offsets / "7", offsets / ".7.crc", state / "8.changelog", state / ".8.changelog.crc"]
    temporary = [
        offsets / ".8.4f8e1c2a-0d6b-4f0e-9a59-2a1c1f3f5e77.tmp",
        offsets / "..8.4f8e1c2a-0d6b-4f0e-9a59-2a1c1f3f5e77.tmp.crc",
        state / ".9.changelog.a29a02c5-778e-4114-8edd-03e00ef8df7a.TID5.tmp",
    ]
    for path in kept + temporary:
        path.write_bytes(b"x")
    removed = remove_temporaries(str(tmp_path / "engine"), S3)
    assert sorted(removed) == sorted(map(str, temporary))
    assert all(p.exists() for p in kept)


def test_the_health_record_says_the_disk_is_full_on_that_disk_and_never_raises(tmp_path, caplog):
    rules = tmp_path / "congestion.sql"
    rules.write_text(CONGESTION_RULES)
    plan = load_rules([rules]).plan
    with small_disk(tmp_path / "disk", "1m") as disk:
        lakehouse = disk / "lakehouse"
        job = EngineJob(Config(lakehouse=str(lakehouse)), plan, {}, spark=object())  # type: ignore[arg-type]
        job.write_health()
        reserve = lakehouse / "_health" / ".engine.reserve"
        assert reserve.stat().st_size > 0
        assert read_health(str(lakehouse), "engine")["storage"] is None

        fill(disk)
        job.fault = StorageFault(DISK_FULL, str(lakehouse), "No space left on device")
        job.write_health()  # the reserve makes room for it
        record = read_health(str(lakehouse), "engine")
        assert record["storage"]["problem"] == DISK_FULL
        assert record["storage"]["path"] == str(lakehouse)
        assert not reserve.exists()
        found = problems({"engine": record}, HealthConfig(), 60, int(time.time() * 1000))
        assert [(p.subject, p.what) for p in found] == [("engine", DISK_FULL)]
        assert f"disk full at {lakehouse}" in found[0].text

        remount(disk, "ro")
        try:
            with caplog.at_level(logging.WARNING, "lookout.engine"):
                job.write_health()
                job.write_health()
            said = [r for r in caplog.records if "cannot write the health record" in r.message]
            assert len(said) == 1, "logged once, not at every try"
        finally:
            remount(disk, "rw")
        assert not [p for p in Path(lakehouse).rglob("*.tmp")]


class FakeQuery:
    """What `EngineJob` asks of a streaming query, failed or running at will."""

    name = "engine"
    lastProgress = None

    def __init__(self) -> None:
        self.error: str | None = None
        self.isActive = True
        self.status = {"message": "Waiting for data to arrive", "isDataAvailable": False}
        self.status["isTriggerActive"] = False

    def fail(self, error: str | None) -> None:
        self.error, self.isActive = error, False

    def exception(self) -> str | None:
        return self.error

    def stop(self) -> None:
        self.isActive = False


def test_the_job_waits_out_a_full_disk_and_starts_the_query_again(tmp_path, monkeypatch, caplog):
    """The job's side of it with a stand-in for Spark's query: a failure that names a
    full disk is waited out and the query started again with the committer it had; one
    that does not, on a disk that takes writes, ends the job as before."""
    from types import SimpleNamespace

    import engine.spark.job as job_module

    rules = tmp_path / "congestion.sql"
    rules.write_text(CONGESTION_RULES)
    plan = load_rules([rules]).plan
    queries = [FakeQuery() for _ in range(3)]
    started: list[object] = []

    class BatchFigures:
        def health(self) -> dict:
            return {"batches": 0, "figures": {}, "totals": {}, "commit_ms": 0.0}

    def start_query(spark, config, parts, figures=None):
        started.append(figures)
        return queries[len(started) - 1], figures or BatchFigures()

    monkeypatch.setattr(job_module, "start_query", start_query)
    spark = SimpleNamespace(
        conf=SimpleNamespace(get=lambda key, default=None: default),
        streams=SimpleNamespace(addListener=lambda _: None, removeListener=lambda _: None),
    )
    job = EngineJob(Config(lakehouse=str(tmp_path / "lakehouse")), plan, {}, spark=spark)  # type: ignore[arg-type]
    job.start()
    assert job.ready()

    queries[0].fail("[STREAM_FAILED]\nCaused by: java.io.IOException: No space left on device")
    with caplog.at_level(logging.INFO, "lookout.engine"):
        job.watch()
        assert job.fault is not None and job.fault.problem == DISK_FULL
        assert not job.ready() and not job.queries and job.failed() is None
        job.watch()  # not due yet: nothing happens
        assert len(started) == 1
        job.fault.retry_at = 0  # due: the lakehouse takes the probe, the query starts again
        job.watch()
        assert len(started) == 2 and started[1] is not None  # with the figures it had
        assert job.fault is not None and not job.ready()
        job.watch()  # it waits for data, with none to run: the fault is over
        assert job.fault is None and job.ready()
    said = [r.message for r in caplog.records]
    assert sum("the engine cannot write: disk full" in m for m in said) == 1
    assert sum("the engine writes again" in m for m in said) == 1

    queries[1].fail("[STREAM_FAILED] division by zero")
    with pytest.raises(RuntimeError, match="division by zero"):
        job.watch()
    job.stop()
