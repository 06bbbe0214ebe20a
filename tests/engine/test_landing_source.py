"""The landing source's reader on real files, without Spark: Spark asks it for the
latest offset while planning a batch, for that batch's partitions, and each executor
task reads one partition; `commit` runs once the batch is done (the offsets' own
protocol is `test_landing_offsets.py`'s). Files are landed by ingest's `LandingWriter`,
as in production, and every reading read back is compared with what was landed.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from engine.core.pipeline import HEARTBEAT
from engine.core.plan import Column, ColumnType, StreamSchema
from engine.ipc import read_ipc
from engine.spark.landing_source import (
    FILES_PER_PARTITION,
    MIN_FILES_PER_PARTITION,
    LandingReader,
    file_partitions,
    source_options,
)
from ingest.landing import LandingWriter
from lookout.config import S3Config

TRAFFIC = StreamSchema(
    "traffic",
    (Column("station", ColumnType.INT), Column("speed", ColumnType.DOUBLE),
     Column("ts", ColumnType.TIMESTAMP)),
    "ts",
    2_000,
)  # fmt: skip
RFID = StreamSchema(
    "rfid",
    (Column("station", ColumnType.INT), Column("speed", ColumnType.DOUBLE),
     Column("ts", ColumnType.TIMESTAMP)),
    "ts",
    2_000,
)  # fmt: skip


def land(writer: LandingWriter, stream: str, speeds: list[float]) -> list[Path]:
    readings = [
        {"station": 1, "speed": s, "ts": 1_000 + i, "source": "s", "seq": i}
        for i, s in enumerate(speeds)
    ]
    writer.add_readings(stream, readings, f"lookout/{stream}/1/readings", 0)
    return writer.flush()


def reader(root: Path, archive: Path | None = None) -> LandingReader:
    options = source_options(str(root), str(archive or ""), S3Config(), {"c": [TRAFFIC, RFID]}, "c")
    return LandingReader(options)


def read_batch(source: LandingReader, start: dict, end: dict) -> list[tuple[str, str, list]]:
    """(stream, file, speeds) of every file a batch reads, over all its partitions, as
    executor tasks would read them (each from a pickled copy of the reader)."""
    out = []
    for partition in source.partitions(start, end):
        for batch in source.read(partition):
            table = pa.Table.from_batches([batch])
            for row in table.to_pylist():
                arrivals = read_ipc(row["data"])
                assert not any(arrivals.column(HEARTBEAT).to_pylist())
                out.append((row["stream"], row["file"], arrivals.column("speed").to_pylist()))
    return sorted(out)


def on_disk(files: list[Path], speeds: list[list[float]]) -> list[tuple[str, str, list]]:
    return sorted(
        (f.parent.name.removeprefix("stream="), f.name, s)
        for f, s in zip(files, speeds, strict=True)
    )


def test_a_batch_reads_the_new_files_once_and_a_rerun_reads_the_same(tmp_path):
    root = tmp_path / "landing"
    writer = LandingWriter(root, "test")
    first = land(writer, "traffic", [1.0, 2.0]) + land(writer, "rfid", [3.0])
    (root / "stream=traffic" / ".part-0-test-x-1.jsonl.tmp").write_bytes(b'{"half": ')
    source = reader(root)
    start = source.initialOffset()

    end = source.latestOffset(start, None)
    assert read_batch(source, start, end) == on_disk(first, [[1.0, 2.0], [3.0]])
    # Offsets are JSON in Spark's log: they must survive the round trip.
    assert json.loads(json.dumps(end)) == end

    # Nothing new: the same offset and no partitions (Spark then plans no batch).
    assert source.latestOffset(end, None) == end and source.partitions(end, end) == []

    # Files landed before the batch commits belong to the next batch only.
    second = land(writer, "traffic", [4.0, 5.0, 6.0])
    end2 = source.latestOffset(end, None)
    assert read_batch(source, end, end2) == on_disk(second, [[4.0, 5.0, 6.0]])

    # A restart re-runs a logged batch from its offsets: the same readings.
    assert read_batch(reader(root), start, end) == on_disk(first, [[1.0, 2.0], [3.0]])


@pytest.mark.parametrize("archived", [False, True], ids=["delete", "archive"])
def test_commit_removes_only_the_committed_files(tmp_path, archived):
    root, archive = tmp_path / "landing", tmp_path / "archive"
    writer = LandingWriter(root, "test")
    first = land(writer, "traffic", [1.0])
    contents = {f.name: f.read_bytes() for f in first}
    source = reader(root, archive if archived else None)
    end = source.latestOffset(source.initialOffset(), None)
    later = land(writer, "traffic", [2.0])

    source.commit(end)
    source.commit(end)  # Spark may commit an offset again after a restart

    assert not any(f.exists() for f in first)
    assert all(f.exists() for f in later)
    moved = {p.name: p.read_bytes() for p in archive.rglob("*.jsonl")}
    assert moved == (contents if archived else {})
    assert read_batch(source, end, source.latestOffset(end, None)) == on_disk(later, [[2.0]])


def test_quarantined_payloads_come_as_their_own_rows(tmp_path):
    root = tmp_path / "landing"
    writer = LandingWriter(root, "test")
    writer.add_rejection("lookout/x", "payload is not JSON", b"{", 5)
    writer.flush()
    source = reader(root)
    start = source.initialOffset()
    (partition,) = source.partitions(start, source.latestOffset(start, None))
    (batch,) = list(source.read(partition))
    (row,) = pa.Table.from_batches([batch]).to_pylist()
    assert row["stream"] == "_quarantine"
    assert json.loads(row["data"])[0]["reason"] == "payload is not JSON"


@given(files=st.integers(0, 300), parallelism=st.integers(1, 16))
@example(files=84, parallelism=2)
def test_a_batch_is_spread_over_the_cores_in_runs_of_files(files: int, parallelism: int) -> None:
    names = [f"stream=traffic/part-{i:05d}" for i in range(files)]
    runs = file_partitions(names, parallelism)
    assert [name for run in runs for name in run] == names  # consecutive, in order
    assert all(0 < len(run) <= FILES_PER_PARTITION for run in runs)
    sizes = [len(run) for run in runs]
    assert not sizes or max(sizes) - min(sizes) <= 1
    # A task per core where each still gets its share of files; more only where a task
    # would read more than its most, and then as many waves of a task per core as that
    # takes (a last wave with a core idle only where a task would get too few files).
    needed = -(-files // FILES_PER_PARTITION)
    full_waves = -(-needed // parallelism) * parallelism
    wanted = min(full_waves, files // MIN_FILES_PER_PARTITION)
    assert len(runs) == max(wanted, needed)
    if (files, parallelism) == (84, 2):  # a 128 MB backlog of 1.5 MB files, two cores
        assert sizes == [21] * 4


def test_listing_and_planning_import_no_parsing(tmp_path: Path) -> None:
    # The driver's runner of the source starts at every start of the query, and the
    # query waits for it: it lists files and plans batches, executors parse.
    land(LandingWriter(tmp_path / "landing", "test"), "traffic", [1.0])
    pickled = tmp_path / "source.pickle"
    pickled.write_bytes(pickle.dumps(reader(tmp_path / "landing")))
    code = (
        "import pickle, sys; source = pickle.load(open(sys.argv[1], 'rb')); "
        "start = source.initialOffset(); "
        "assert source.partitions(start, source.latestOffset(start)); "
        "print(*sorted(m for m in sys.modules "
        "if m.startswith(('engine.landed_files', 'engine.ipc', 'pyarrow.json'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(pickled)], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == []
