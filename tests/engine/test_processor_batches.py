"""The engine query's stateful step (`engine.spark.processor`), its decisions one at a
time, with no SparkSession: how a batch's landed files become the pipeline's arrivals
and the quarantine, what its health row says, the values it stores, and when a Python
worker reuses the pipeline it kept in memory. The processor runs under PySpark's
`TwsTester` (in-memory state variables); a failed batch is modelled as Spark handles
one: its state writes are dropped and the batch runs again.
"""

from __future__ import annotations

import copy
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import Row
from pyspark.sql.streaming.tws_tester import TwsTester

from engine import tables
from engine.core.pipeline import Pipeline
from engine.landed_files import QUARANTINE_FOLDER
from engine.spark import step as step_module
from engine.spark.batch_figures import BatchFigures, rebuilt
from engine.spark.commit import table_schemas
from engine.spark.landing_source import (
    FilesPartition,
    LandingReader,
    landing_files,
    source_options,
)
from engine.spark.processor import ENTRIES, PIECES, EngineProcessor
from engine.spark.step import SparkStore, _arrivals, pack_value, unpack_value
from ingest.landing import LandingWriter
from lookout.config import Config, IngestConfig
from tests.e2e.helpers import T0
from tests.engine.test_processor import _LIBRARY, PARTS, WALL_CLOCK

TOPIC = "lookout/traffic/1/readings"


def reading(ts: int, seq: int, speed: float = 30.0, source: str = "station-1") -> dict[str, Any]:
    """A traffic reading at ``T0 + ts``."""
    return {
        "station": 1,
        "lane": 1,
        "speed": speed,
        "length": 4.0,
        "ts": T0 + ts,
        "source": source,
        "seq": seq,
    }


class Landing:
    """Files landed one at a time, read back by the engine's source as the stateful
    step gets them: one list of rows per file."""

    def __init__(self, root: Path) -> None:
        self.root = str(root / "landing")
        self.writer = LandingWriter(self.root, "t")
        streams = {"traffic": [_LIBRARY.plan.streams["traffic"]]}
        options = source_options(self.root, "", Config().s3, streams, "traffic")
        self.reader = LandingReader(options)
        self.read: set[str] = set()

    def land(self, readings: list[dict[str, Any]], rejected: int = 0) -> list[Row]:
        """One file of ``readings`` (and ``rejected`` payloads for the quarantine)."""
        if readings:
            self.writer.add_readings("traffic", [dict(r) for r in readings], TOPIC, T0)
        for i in range(rejected):
            self.writer.add_rejection(TOPIC, "not JSON", b"{" * (i + 1), T0)
        self.writer.flush()
        files = landing_files(pafs.LocalFileSystem(), self.root, ["traffic", QUARANTINE_FOLDER])
        new = sorted(f for f in files if f not in self.read)
        self.read.update(new)
        table = next(iter(self.reader.read(FilesPartition(tuple(new)))))
        return [Row(**row) for row in table.to_pylist()]


class Step:
    """One processor under `TwsTester`, writing its tables below ``lakehouse``."""

    def __init__(self, lakehouse: Path, memo_id: str = "memo") -> None:
        # The files `Landing(lakehouse.parent)` lands.
        landing = IngestConfig(landing_url=str(lakehouse.parent / "landing"))
        self.config = Config(lakehouse=str(lakehouse), ingest=landing)
        for name, schema in table_schemas(_LIBRARY.plan, ("traffic", "positions")).items():
            tables.ensure_table(self.config.table(name), schema)
        self.processor = EngineProcessor(PARTS, self.config, memo_id=memo_id)
        self.tester = TwsTester(self.processor)

    def run(self, rows: list[Row]) -> tuple[dict[str, Any], dict[str, list[dict]]]:
        """A batch: its health figures and the rows it wrote, per table."""
        figures: dict[str, Any] = {}
        written: dict[str, list[dict]] = {}
        for out in self.tester.test("traffic", rows):
            if out["kind"] == "health":
                figures = orjson.loads(out["stats"])
                continue
            found = pq.read_table(f"{self.config.table(out['table'])}/{out['path']}")
            rows_of = [
                {k: v for k, v in r.items() if k not in WALL_CLOCK} for r in found.to_pylist()
            ]
            written.setdefault(out["table"], []).extend(rows_of)
        return figures, written

    def state(self) -> Any:
        """The state variables' contents (what Spark's state store would commit)."""
        return copy.deepcopy(self.tester.handle.map_states[ENTRIES].state), copy.deepcopy(
            self.tester.handle.map_states[PIECES].state
        )

    def set_state(self, saved: Any) -> None:
        """Put the state variables back as they were (Spark drops a failed batch's)."""
        self.tester.handle.map_states[ENTRIES].state = copy.deepcopy(saved[0])
        self.tester.handle.map_states[PIECES].state = copy.deepcopy(saved[1])


@pytest.fixture(autouse=True)
def empty_memo() -> Iterator[None]:
    step_module._PIPELINES.clear()
    yield
    step_module._PIPELINES.clear()


def minutes(start: int, count: int, seq: int = 0) -> list[dict[str, Any]]:
    """One reading every 10 s from minute ``start``."""
    return [reading(start * 60_000 + i * 10_000, seq + i, 20.0 + i % 7) for i in range(count)]


def test_arrivals_are_the_files_in_landing_order_and_the_quarantine_apart(tmp_path: Path) -> None:
    landing = Landing(tmp_path)
    first = landing.land(minutes(0, 3))
    second = landing.land(minutes(1, 2, seq=3), rejected=2)
    config = Config(ingest=IngestConfig(landing_url=landing.root))
    # Spark's order is any order
    arrivals, quarantine = _arrivals([*second, *first], config, PARTS[-1])
    traffic = arrivals["traffic"]
    assert traffic.column("seq").to_pylist() == [0, 1, 2, 3, 4]
    assert traffic.column("seq").num_chunks == 1  # one chunk: compute runs per chunk
    assert [q["reason"] for q in quarantine] == ["not JSON", "not JSON"]
    assert set(arrivals) == {"traffic"}


@given(st.binary(max_size=2_000))
def test_stored_values_unpack_to_what_was_packed(value: bytes) -> None:
    packed = pack_value(value)
    assert int.from_bytes(packed[:8], "little") == len(value)
    assert unpack_value(packed) == value


def test_the_health_row_counts_what_the_batch_did(tmp_path: Path) -> None:
    landing, step = Landing(tmp_path), Step(tmp_path / "lake")
    figures, _ = step.run(landing.land(minutes(0, 12)))
    traffic = figures["streams"]["traffic"]
    assert (traffic["readings"], traffic["late"], traffic["duplicates"]) == (12, 0, 0)
    assert traffic["max_event_ms"] == T0 + 110_000
    assert traffic["watermark_ms"] == T0 + 110_000 - 2_000  # SLACK 2 SECONDS
    assert figures["reused"] is False and figures["quarantined"] == 0
    assert "part traffic rebuilt from the state store" in rebuilt(figures)
    assert "for 12 readings" in rebuilt(figures)
    again = reading(50_000, 5, 20.0 + 5)  # the sixth reading, landed again
    conflict = reading(60_000, 6, 99.0)  # the seventh's id, another speed
    late = reading(100_000, 40)  # 10 s behind the newest, slack 2 s
    newer = reading(120_000, 12)
    figures, written = step.run(landing.land([again, conflict, late, newer], rejected=1))
    traffic = figures["streams"]["traffic"]
    assert (traffic["readings"], traffic["late"]) == (1, 1)
    assert (traffic["duplicates"], traffic["conflicts"]) == (1, 1)
    assert figures["reused"] is True and figures["quarantined"] == 1
    assert len(written["quarantine"]) == 1


def test_the_steps_phases_are_timed_one_after_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clock that moves 1 s each time it is read: a phase timed inside another, or
    one left untimed, would not take exactly 1 s."""
    ticks = itertools.count()
    monkeypatch.setattr(step_module.time, "perf_counter", lambda: float(next(ticks)))
    figures, _ = Step(tmp_path / "lake").run(Landing(tmp_path).land(minutes(0, 3)))
    phases = ("read_ms", "restore_ms", "evaluate_ms", "save_ms", "write_ms")
    assert {p: figures[p] for p in phases} == dict.fromkeys(phases, 1000.0)
    assert "rebuilt from the state store in 1.0 s" in rebuilt(figures)
    assert "its step took 5.0 s" in rebuilt(figures)


def test_the_step_says_when_it_began_and_the_log_how_long_into_the_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rebuild batch's log line says how long the job ran before the step began: a
    cold start's worker, state store load and input read, apart from the step's own."""
    before = int(time.time() * 1000)
    figures, _ = Step(tmp_path / "lake").run(Landing(tmp_path).land(minutes(0, 3)))
    assert before <= figures["began_ms"] <= int(time.time() * 1000)
    assert "began" not in rebuilt(figures)
    assert rebuilt({**figures, "waited_ms": 9_140}).endswith(
        ", and began 9.1 s into the batch's job"
    )

    class Batch:  # the query's batch as `foreachBatch` gets it: the step's rows back
        def toArrow(self) -> pa.Table:
            stats = {**figures, "began_ms": int(time.time() * 1000) + 2_000}
            return pa.Table.from_pylist([{"kind": "health", "stats": orjson.dumps(stats).decode()}])

    with caplog.at_level(logging.INFO, "lookout.engine"):
        BatchFigures("engine")(Batch(), 7)  # type: ignore[arg-type]
    said = [r.message for r in caplog.records if "batch 7: part traffic rebuilt" in r.message]
    assert len(said) == 1 and said[0].endswith(" s into the batch's job")
    assert 1.5 <= float(said[0].split("began ")[1].split(" s")[0]) <= 2.0


def test_the_admitted_readings_are_written_while_the_stages_evaluate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The readings table's file is written on a thread of its own while the stages
    evaluate (the stages wait for it here: written after them, it never comes), and the
    batch's files hold what they held written one after another."""
    landing = Landing(tmp_path)
    batches = [landing.land(minutes(m, 6, seq=6 * m)) for m in range(3)]
    serial = Step(tmp_path / "serial", memo_id="serial")
    expected = [serial.run(rows)[1] for rows in batches]
    step_module._PIPELINES.clear()

    readings_written = threading.Event()
    writers: list[str] = []
    write, evaluate = tables.write_data_file, Pipeline.evaluate

    def noting_write(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "readings_traffic":
            writers.append(threading.current_thread().name)
            readings_written.set()
        return write(name, *args, **kwargs)

    def waiting_evaluate(pipeline: Pipeline, result: Any) -> Any:
        assert readings_written.wait(timeout=10), "the readings were not written meanwhile"
        readings_written.clear()
        return evaluate(pipeline, result)

    monkeypatch.setattr(tables, "write_data_file", noting_write)
    monkeypatch.setattr(Pipeline, "evaluate", waiting_evaluate)
    step = Step(tmp_path / "overlapped", memo_id="overlapped")
    got = [step.run(rows)[1] for rows in batches]
    assert len(writers) == 3 and threading.current_thread().name not in writers
    assert got == expected


def test_a_pipeline_is_reused_only_by_the_worker_that_saved_the_state(tmp_path: Path) -> None:
    landing, step = Landing(tmp_path), Step(tmp_path / "lake")
    batches = [landing.land(minutes(m, 6, seq=6 * m)) for m in range(4)]
    assert step.run(batches[0])[0]["reused"] is False
    memo = step_module._PIPELINES
    key = f"{step.processor.memo_id}#traffic"
    maps = step.tester.handle.map_states
    assert memo[key][0] == SparkStore(maps[ENTRIES], maps[PIECES]).token()
    assert step.run(batches[1])[0]["reused"] is True
    # Another worker ran a batch since: the state is not the one this worker saved.
    memo[key] = ("another", memo[key][1])
    assert step.run(batches[2])[0]["reused"] is False
    assert memo[key][0] == SparkStore(maps[ENTRIES], maps[PIECES]).token()
    assert step.run(batches[3])[0]["reused"] is True
    # Other rules, another plan: another pipeline, whatever the memo holds.
    edited = [replace(p, plan=replace(p.plan, queries=p.plan.queries[1:])) for p in PARTS]
    assert step.processor.memo_id != EngineProcessor(edited, step.config, "memo").memo_id


def test_a_batch_that_fails_half_way_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = Landing(tmp_path)
    batches = [landing.land(minutes(m, 6, seq=6 * m)) for m in range(20)]
    whole = Step(tmp_path / "whole")
    expected: dict[str, list[dict]] = {}
    for rows in batches:
        for table, found in whole.run(rows)[1].items():
            expected.setdefault(table, []).extend(found)
    step_module._PIPELINES.clear()

    step = Step(tmp_path / "failing", memo_id="failing")
    got: dict[str, list[dict]] = {}
    write = tables.write_data_file
    for number, rows in enumerate(batches):
        if number in (5, 13):
            # The pipeline has evaluated and saved the batch; writing its files fails.
            def failing(*args: Any, **kwargs: Any) -> Any:
                raise OSError("disk full")

            saved = step.state()
            monkeypatch.setattr(tables, "write_data_file", failing)
            with pytest.raises(OSError):
                step.run(rows)
            monkeypatch.setattr(tables, "write_data_file", write)
            assert not step_module._PIPELINES  # nothing half-changed kept in memory
            step.set_state(saved)  # Spark drops the failed batch's state writes
        figures, written = step.run(rows)
        assert figures["reused"] is (number not in (0, 5, 13))
        for table, found in written.items():
            got.setdefault(table, []).extend(found)
    assert sum(map(len, expected.values())) > len(batches) * 6  # derived rows too
    assert {t: sorted(map(repr, r)) for t, r in got.items()} == {
        t: sorted(map(repr, r)) for t, r in expected.items()
    }


def _table_rows(config: Config, name: str) -> int:
    return DeltaTable(config.table(name)).to_pyarrow_table().num_rows


def _data_files(config: Config, name: str) -> set[str]:
    return {p.name for p in Path(config.table(name)).glob("*.parquet")}


def test_a_task_commits_its_files_once_at_its_end_and_a_rerun_deletes_its_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The processor's `close` (a task's end) commits every file its components wrote,
    each table once, tagged with the batch: a batch run again from the state before it
    (Spark drops a failed task's state) finds its commits done and deletes its copies."""
    monkeypatch.setattr(step_module, "_batch_id", lambda: 7)
    step = Step(tmp_path / "lake")
    rows = Landing(tmp_path).land(minutes(0, 6))
    before = step.state()
    _, written = step.run(rows)
    assert _table_rows(step.config, "readings_traffic") == 0  # not before the task's end
    step.processor.close()
    assert _table_rows(step.config, "readings_traffic") == len(written["readings_traffic"]) == 6
    committed = _data_files(step.config, "readings_traffic")
    assert step.processor.pending == {}

    step.set_state(before)
    step_module._PIPELINES.clear()
    step.run(rows)
    step.processor.close()
    assert _table_rows(step.config, "readings_traffic") == 6
    assert _data_files(step.config, "readings_traffic") == committed


def test_each_state_store_partition_commits_as_a_writer_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tasks of one batch on different partitions both commit to a shared table."""
    monkeypatch.setattr(step_module, "_batch_id", lambda: 3)
    step = Step(tmp_path / "lake")
    landing = Landing(tmp_path)
    for partition, rows in enumerate(
        [landing.land(minutes(0, 3)), landing.land(minutes(1, 3, seq=3))]
    ):
        monkeypatch.setattr(step_module, "_partition", lambda p=partition: p)
        step.run(rows)
        step.processor.close()
    table = DeltaTable(step.config.table("readings_traffic"))
    assert table.to_pyarrow_table().num_rows == 6
    assert table.transaction_version("lookout-engine-readings_traffic-p0") == 3
    assert table.transaction_version("lookout-engine-readings_traffic-p1") == 3
