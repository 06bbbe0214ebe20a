"""A standby's rehearsal (`engine.spark.rehearsal`): its readings are landed records the
engine reads like ingest's, and the rehearsal runs the engine query over a scratch
lakehouse, keeps its engine log lines out, and leaves nothing behind."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from engine.landed_files import read_stream_file
from engine.spark.rehearsal import PREFIX, SOURCE, Rehearsal, rehearsal_reading, remove_abandoned
from ingest.landing import LandingWriter
from lookout.config import Config
from lookout.services import alert_specs
from rules.language.loader import RULES_DIR, load_rules
from tests.waiting import wait_for

RULES = [RULES_DIR / "traffic.sql", RULES_DIR / "rfid.sql"]


def test_every_source_streams_rehearsal_reading_is_a_landed_record(tmp_path: Path) -> None:
    plan = load_rules(RULES).plan
    for stream in plan.sources():
        writer = LandingWriter(tmp_path, "t")
        reading = rehearsal_reading(stream, 1_767_225_600_000, 7)
        writer.add_readings(stream.name, [reading], stream.topic or stream.name, 0)
        (file,) = writer.flush()
        arrivals, bad = read_stream_file(stream, file.name, file.read_bytes())
        assert bad == [], stream.name
        (row,) = arrivals.to_pylist()
        assert row[stream.timestamp] == 1_767_225_600_000
        assert (row["source"], row["seq"], row["heartbeat"]) == (SOURCE, 7, False)
        assert all(row[c.name] is not None for c in stream.columns), row


def test_the_folders_of_rehearsals_whose_process_died_are_removed(tmp_path: Path) -> None:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    dead = tmp_path / f"{PREFIX}{ended.stdout.strip()}-abc"
    alive = tmp_path / f"{PREFIX}{os.getpid()}-def"
    other = tmp_path / "lookout-faults-123"
    for folder in (dead, alive, other):
        (folder / "lakehouse").mkdir(parents=True)
    assert remove_abandoned(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and alive.exists() and other.exists()


@pytest.mark.spark
def test_the_rehearsal_runs_the_query_on_a_scratch_lakehouse_and_leaves_nothing(
    spark, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rule_set = load_rules(RULES)
    config = Config(lakehouse=str(tmp_path / "lakehouse"))
    rehearsal = Rehearsal(spark, config, rule_set.plan, alert_specs(rule_set), every_s=0.5)
    with caplog.at_level(logging.INFO):
        rehearsal.start()
        try:
            wait_for(lambda: rehearsal.batches >= 2, 180, "two rehearsal batches")
            scratch = Path(str(rehearsal._folder))
            readings = DeltaTable(str(scratch / "readings_traffic")).to_pyarrow_table()
            assert readings.column("source").to_pylist() == [SOURCE]
            assert [q.name for q in spark.streams.active] == ["engine"]
        finally:
            rehearsal.stop()
    assert spark.streams.active == []
    assert not scratch.exists()
    assert not (tmp_path / "lakehouse").exists()
    engine_lines = [r for r in caplog.records if r.name == "lookout.engine"]
    assert all(r.levelno >= logging.WARNING for r in engine_lines), engine_lines
    assert any("rehearsed the query" in r.getMessage() for r in caplog.records)
    assert logging.getLogger("lookout.engine").filters == []
