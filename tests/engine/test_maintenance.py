"""Table maintenance (engine/maintenance.py) on real Delta tables written by delta-rs.

Compaction must leave every table holding exactly the rows it held, with the writers'
idempotency marks (app transactions) intact, in a commit that changes no data (all its
actions `dataChange = false`, read from the log itself); it must run while another
thread appends, losing and doubling nothing; and a table that cannot be compacted is
reported without stopping the others. The log cleanup must keep every version from the
newest settled checkpoint on, exactly as it was, while it removes the commits below.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import psutil
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.maintenance import (
    LOWEST_PRIORITY,
    MaintenanceProcess,
    TableMaintenance,
    clean_log,
    compact,
)
from engine.tables import append_once, ensure_table
from tests.examples import examples

SCHEMA = pa.schema([("station", pa.int64()), ("speed", pa.float64())])


def append_batches(path: str, batches: range, writer: str = "w") -> None:
    """One append per batch id (as the engine writes), two rows each, into the table
    at `path` (created first, as the engine does at start)."""
    ensure_table(path, SCHEMA)
    for b in batches:
        rows = [{"station": b, "speed": b / 2}, {"station": b, "speed": b / 3}]
        append_once(path, SCHEMA, rows, writer, b)


def bag(path: str) -> Counter:
    table = DeltaTable(path).to_pyarrow_table()
    return Counter(zip(table.column("station").to_pylist(), table.column("speed").to_pylist(),
                       strict=True))  # fmt: skip


def commit_actions(path: str, version: int) -> list[dict]:
    log = Path(path, "_delta_log", f"{version:020d}.json")
    return [orjson.loads(line) for line in log.read_bytes().splitlines()]


def test_compaction_keeps_rows_and_marks_and_changes_no_data(tmp_path: Path) -> None:
    path = str(tmp_path / "readings_traffic")
    append_batches(path, range(40))
    before = bag(path)
    assert len(DeltaTable(path).file_uris()) == 40

    done = compact(DeltaTable(path), min_files=8)

    assert done is not None and done.files_before == 40 and done.files_removed == 40
    table = DeltaTable(path)
    assert len(table.file_uris()) == done.files_added < 40
    assert bag(path) == before
    assert table.transaction_version("w") == 39
    # The compaction's commit: nothing in it is a data change.
    actions = commit_actions(path, table.version())
    changes = [a[k] for a in actions for k in ("add", "remove") if k in a]
    assert len(changes) == 40 + done.files_added
    assert all(change["dataChange"] is False for change in changes)
    # A re-run of an appended batch is still recognised after the compaction.
    assert append_once(path, SCHEMA, [{"station": 0, "speed": 0.0}], "w", 39) is False


def test_a_table_with_few_files_or_none_is_left_alone(tmp_path: Path) -> None:
    path = str(tmp_path / "alerts")
    append_batches(path, range(3))
    version = DeltaTable(path).version()
    assert compact(DeltaTable(path), min_files=8) is None
    assert DeltaTable(path).version() == version
    never = TableMaintenance([str(tmp_path / "never_written")], every_s=0, min_files=1)
    assert never.run_once() == [] and never.errors == {}
    # A table visited counts on the health record, with nothing cleaned yet.
    few = TableMaintenance([path], every_s=0, min_files=8)
    assert few.run_once() == [] and few.health()["log_cleaned"] == {path: 0}


@pytest.mark.slow
def test_compaction_rounds_while_another_thread_appends(tmp_path: Path) -> None:
    path = str(tmp_path / "station_speed")
    appender = threading.Thread(target=append_batches, args=(path, range(150)))
    maintenance = TableMaintenance([path], every_s=0.05, min_files=2)
    appender.start()
    maintenance.start()
    appender.join()
    maintenance.stop()

    assert maintenance.errors == {}
    assert bag(path) == Counter((b, v) for b in range(150) for v in (b / 2, b / 3))
    # Oldest first: appends went on after a compaction had committed.
    operations = [h["operation"] for h in reversed(DeltaTable(path).history())]
    assert "OPTIMIZE" in operations
    assert "WRITE" in operations[operations.index("OPTIMIZE") :]


def test_a_broken_table_is_reported_and_the_others_compacted(tmp_path: Path) -> None:
    good = str(tmp_path / "readings_traffic")
    append_batches(good, range(5))
    broken = tmp_path / "quarantine"
    (broken / "_delta_log").mkdir(parents=True)
    (broken / "_delta_log" / f"{0:020d}.json").write_text("this is not a commit\n")
    maintenance = TableMaintenance([str(broken), good], every_s=0, min_files=2)

    done = maintenance.run_once()

    assert [path for path, _ in done] == [good]
    assert str(broken) in maintenance.errors
    health = maintenance.health()
    assert health["errors"][str(broken)] and health["compactions"][0]["table"] == good


def test_rounds_run_in_a_lowest_priority_process_started_again_after_it_died(
    tmp_path: Path,
) -> None:
    """The engine's rounds run in a child process at nice 19, so that they take only
    the CPU the engine's batches leave. A child killed during a round fails that round
    (the table's error says so), and the next round runs in a new child."""
    path = str(tmp_path / "readings_traffic")
    append_batches(path, range(4))
    process = MaintenanceProcess()
    maintenance = TableMaintenance([path], every_s=0, min_files=2, run_round=process)
    try:
        assert [p for p, _ in maintenance.run_once()] == [path]
        first = process.pid
        assert first is not None and psutil.Process(first).nice() == LOWEST_PRIORITY

        append_batches(path, range(4, 8))
        os.kill(first, signal.SIGSTOP)  # it takes the next round's request, never answers
        during = threading.Thread(target=maintenance.run_once)
        during.start()
        time.sleep(1.0)  # the request is in its pipe
        os.kill(first, signal.SIGKILL)
        during.join(timeout=30)
        assert not during.is_alive()
        assert maintenance.errors == {
            path: f"the maintenance process died (exit {-signal.SIGKILL})"
        }

        assert [p for p, _ in maintenance.run_once()] == [path] and maintenance.errors == {}
        assert process.pid not in (None, first)
        assert bag(path) == Counter((b, v) for b in range(8) for v in (b / 2, b / 3))
    finally:
        process.close()


def test_replaced_files_are_vacuumed_after_the_tables_retention(tmp_path: Path) -> None:
    # The engine's tables keep removed files an hour; this one keeps them 1 s.
    path = str(tmp_path / "station_speed")
    retention = {"delta.deletedFileRetentionDuration": "interval 1 seconds"}
    write_deltalake(path, SCHEMA.empty_table(), mode="append", configuration=retention)
    append_batches(path, range(6))
    before = bag(path)
    maintenance = TableMaintenance([path], every_s=0, min_files=2)

    maintenance.run_once()  # compacts; the six replaced files are not old enough yet
    on_disk = sorted(Path(path).glob("*.parquet"))
    assert len(on_disk) == 7 and maintenance.vacuumed == {}
    time.sleep(1.5)
    maintenance.run_once()

    assert maintenance.vacuumed == {path: 6}
    assert len(list(Path(path).glob("*.parquet"))) == 1
    assert bag(path) == before
    assert maintenance.health()["vacuumed"] == {path: 6}


def log_versions(path: str, suffix: str) -> list[int]:
    return sorted(int(p.name[:20]) for p in Path(path, "_delta_log").glob(f"*{suffix}"))


@pytest.mark.slow
@settings(max_examples=examples(25), deadline=None)
@given(appends=st.integers(3, 24), checkpoint_every=st.integers(1, 8))
def test_log_cleanup_keeps_every_version_from_the_newest_checkpoint(
    tmp_path_factory, appends: int, checkpoint_every: int
) -> None:
    path = str(tmp_path_factory.mktemp("log") / "readings_traffic")
    ensure_table(path, SCHEMA)
    for b in range(appends):
        append_once(path, SCHEMA, [{"station": b, "speed": b / 2}], "w", b)
        if b % checkpoint_every == 0:
            DeltaTable(path).create_checkpoint()
    latest = DeltaTable(path).version()
    checkpoints = log_versions(path, ".checkpoint.parquet")
    cut = max(checkpoints, default=0)
    # Each version's rows as a reader would read them, before the cleanup.
    before = {v: bag_at(path, v) for v in range(cut, latest + 1)}

    deleted = clean_log(DeltaTable(path), settle_s=0)

    # Every version from the newest checkpoint on reads the same rows.
    assert {v: bag_at(path, v) for v in before} == before
    assert DeltaTable(path).transaction_version("w") == appends - 1
    # Below the newest checkpoint, no commit or checkpoint is left.
    assert log_versions(path, ".json")[0] == cut
    assert not checkpoints or log_versions(path, ".checkpoint.parquet")[0] == cut
    assert deleted == cut + sum(c < cut for c in checkpoints)


def bag_at(path: str, version: int) -> Counter:
    table = DeltaTable(path, version=version).to_pyarrow_table()
    return Counter(zip(table.column("station").to_pylist(), table.column("speed").to_pylist(),
                       strict=True))  # fmt: skip


@pytest.mark.slow
def test_log_cleanup_while_another_thread_appends(tmp_path: Path) -> None:
    # The appender opens the table for every append from `_last_checkpoint`; the
    # cleanup waits until a checkpoint is `settle_s` old before removing what precedes
    # it, so no open can find its checkpoint gone (with settle_s=0 this fails).
    path = str(tmp_path / "station_speed")
    appender = threading.Thread(target=append_batches, args=(path, range(200)))
    maintenance = TableMaintenance([path], every_s=0.05, min_files=2, settle_s=0.5)
    appender.start()
    maintenance.start()
    appender.join()
    time.sleep(0.6)
    maintenance.stop()
    maintenance.run_once()

    assert maintenance.errors == {}
    assert bag(path) == Counter((b, v) for b in range(200) for v in (b / 2, b / 3))
    assert maintenance.health()["log_cleaned"][path] > 0
    assert log_versions(path, ".json")[0] > 0
