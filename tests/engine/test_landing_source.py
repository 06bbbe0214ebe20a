"""The landing source's reader on real files, without Spark: Spark's simple-reader
wrapper calls `read` while planning a batch, `readBetweenOffsets` to re-run a logged
batch after a restart, and `commit` once the batch is done (the offsets' own protocol is
`test_landing_offsets.py`'s). Files are landed by ingest's `LandingWriter`, as in
production, and every line is compared with the bytes on disk.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from engine.spark.landing_source import LandingReader, source_options
from ingest.landing import LandingWriter
from lookout.config import S3Config


def land(root: Path, writer: LandingWriter, stream: str, speeds: list[float]) -> list[Path]:
    readings = [{"station": 1, "speed": s, "ts": 1_000 + i} for i, s in enumerate(speeds)]
    writer.add_readings(stream, readings, f"lookout/{stream}/1/readings", 0)
    return writer.flush()


def on_disk(files: list[Path]) -> list[tuple[str, str, bytes]]:
    """(stream, file, line) of every line of `files`, from the bytes themselves, sorted
    (a list, not a set: a line read twice must show)."""
    return sorted(
        (f.parent.name.removeprefix("stream="), f.name, line)
        for f in files
        for line in f.read_bytes().splitlines()
        if line.strip()
    )


def rows(batches) -> list[tuple[str, str, bytes]]:
    """The (stream, file, line) rows of the reader's Arrow batches, sorted."""
    table = pa.Table.from_batches(list(batches))
    return sorted(
        zip(
            table.column("stream").to_pylist(),
            table.column("file").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
    )


def reader(root: Path, archive: Path | None = None) -> LandingReader:
    return LandingReader(source_options(str(root), str(archive or ""), S3Config()))


def test_a_batch_reads_the_new_files_once_and_a_rerun_reads_the_same(tmp_path):
    root = tmp_path / "landing"
    writer = LandingWriter(root, "test")
    first = land(root, writer, "traffic", [1.0, 2.0]) + land(root, writer, "rfid", [3.0])
    (root / "stream=traffic" / ".part-0-test-x-1.jsonl.tmp").write_bytes(b'{"half": ')
    source = reader(root)
    start = source.initialOffset()

    batch, end = source.read(start)
    assert rows(batch) == on_disk(first)  # the temporary file is not read
    # Offsets are JSON in Spark's log: they must survive the round trip.
    assert json.loads(json.dumps(end)) == end

    # Nothing new: the same offset and no rows (Spark then plans no batch).
    again, same = source.read(end)
    assert same == end and list(again) == []

    # Files landed before the batch commits belong to the next batch only.
    second = land(root, writer, "traffic", [4.0, 5.0, 6.0])
    batch2, end2 = source.read(end)
    assert rows(batch2) == on_disk(second)

    # A restart re-runs a logged batch from its offsets: the same lines.
    assert rows(reader(root).readBetweenOffsets(start, end)) == on_disk(first)
    assert rows(reader(root).readBetweenOffsets(end, end2)) == on_disk(second)


@pytest.mark.parametrize("archived", [False, True], ids=["delete", "archive"])
def test_commit_removes_only_the_committed_files(tmp_path, archived):
    root, archive = tmp_path / "landing", tmp_path / "archive"
    writer = LandingWriter(root, "test")
    first = land(root, writer, "traffic", [1.0])
    contents = {f.name: f.read_bytes() for f in first}
    source = reader(root, archive if archived else None)
    _, end = source.read(source.initialOffset())
    later = land(root, writer, "traffic", [2.0])

    source.commit(end)
    source.commit(end)  # Spark may commit an offset again after a restart

    assert not any(f.exists() for f in first)
    assert all(f.exists() for f in later)
    moved = {p.name: p.read_bytes() for p in archive.rglob("*.jsonl")}
    assert moved == (contents if archived else {})
    batch, _ = source.read(end)
    assert rows(batch) == on_disk(later)
