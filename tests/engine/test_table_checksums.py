"""Each append's version checksum (`_delta_log/<v>.crc`) says what the log itself says.

Spark's Delta source takes a version's protocol and metadata from its checksum, so a
wrong one would have Spark read the table under the wrong schema or id. The oracle is a
replay of the commit files written so far (adds less removes, the last metaData and
protocol actions), independent of delta-rs; compactions of the same table, in between
or from another thread, are commits that `append_once` did not make.
"""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import pyarrow as pa
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.maintenance import compact
from engine.tables import append_once, ensure_table

SCHEMA = pa.schema([("station", pa.int32()), ("speed", pa.float64())])


def replayed(path: Path, version: int) -> dict:
    """The table's state at `version` from its commit files: files, size, P&M."""
    files: dict[str, int] = {}
    state: dict = {}
    for v in range(version + 1):
        for line in (path / "_delta_log" / f"{v:020d}.json").read_bytes().splitlines():
            action = orjson.loads(line)
            if "add" in action:
                files[action["add"]["path"]] = action["add"]["size"]
            elif "remove" in action:
                files.pop(action["remove"]["path"], None)
            elif "metaData" in action:
                state["metadata"] = action["metaData"]
            elif "protocol" in action:
                state["protocol"] = action["protocol"]
    return {"numFiles": len(files), "tableSizeBytes": sum(files.values()), **state}


def check_checksums(path: Path) -> int:
    """Compare every checksum in the log with the replay; how many there are."""
    checksums = sorted((path / "_delta_log").glob("*.crc"))
    for file in checksums:
        got = orjson.loads(file.read_bytes())
        want = replayed(path, int(file.stem))
        assert got["numFiles"] == want["numFiles"], file.name
        assert got["tableSizeBytes"] == want["tableSizeBytes"], file.name
        assert got["protocol"] == want["protocol"], file.name
        meta, logged = got["metadata"], want["metadata"]
        assert orjson.loads(meta.pop("schemaString")) == orjson.loads(logged["schemaString"])
        assert meta == {k: v for k, v in logged.items() if k != "schemaString"}, file.name
    return len(checksums)


def rows(batch: int, count: int) -> list[dict]:
    return [{"station": batch, "speed": i / 2} for i in range(count)]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.one_of(st.integers(1, 3), st.just("compact")), min_size=1, max_size=12))
def test_each_append_writes_the_checksum_of_its_version(tmp_path_factory, steps) -> None:
    path = tmp_path_factory.mktemp("t") / "readings"
    ensure_table(str(path), SCHEMA)
    appends = 0
    for batch, step in enumerate(steps):
        if step == "compact":
            compact(DeltaTable(str(path)), min_files=2)
        else:
            appends += append_once(str(path), SCHEMA, rows(batch, step), "w", batch)
    assert check_checksums(path) == appends


def test_checksums_stay_right_while_another_writer_commits(tmp_path: Path) -> None:
    path = tmp_path / "readings"
    ensure_table(str(path), SCHEMA)
    stop = threading.Event()

    def compactions() -> None:
        while not stop.is_set():
            compact(DeltaTable(str(path)), min_files=2)

    compactor = threading.Thread(target=compactions)
    compactor.start()
    try:
        for batch in range(60):
            append_once(str(path), SCHEMA, rows(batch, 2), "w", batch)
    finally:
        stop.set()
        compactor.join()
    assert check_checksums(path) == 60
    compacted = DeltaTable(str(path)).history()
    assert any(h["operation"] == "OPTIMIZE" for h in compacted), "no compaction raced"
