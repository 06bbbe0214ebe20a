"""The engine on a full, then a read-only lakehouse disk: it waits, says so, and resumes by
itself with nothing lost and nothing twice.

`lookout engine` runs as its own process over the congestion rules, its lakehouse on a
16 MB tmpfs of the test's own and its landing folder beside it (`[ingest]
landing_url`), so readings land while the lakehouse takes no writes, as they would
from an ingest on another disk. A third of the readings is landed first; once alerts
are in Delta, the next third is landed a file at a time while a ballast file fills the
disk, so the first write to fail falls wherever the engine is in its batch. The engine
must stay up, stop taking batches (the landing files stay), put `disk full` and the
lakehouse on its health record, and once the ballast is deleted run on by itself. Then
the disk is remounted read-only while the last third and a closing heartbeat land, and
made writable again. The tables must then hold what `lookout replay` computes for the
same readings: every reading once, every alert once (the same ids), every row of the
derived stream once, the late readings, every incident in its final state; and the
failed writes must have left no temporary file and no data file outside its table.
Mounting needs root: elsewhere the test is skipped, saying so.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from engine.core.replay import run
from engine.tables import engine_tables
from ingest.landing import LandingWriter
from lookout.config import Config
from lookout.health import read_health
from lookout.replay import alert_ids, read_readings
from tests.disks import fill, remount, small_disk
from tests.e2e.helpers import (
    T0,
    arrival_order,
    incidents,
    make_readings,
    ms,
    replay_congestion,
    start_engine,
    stop_engine,
)
from tests.pipeline import delta_rows, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FILE_READINGS = 20  # readings per landing file


def land(landing: Path, readings: list[dict], pause_s: float = 0.0) -> None:
    """`readings` landed as ingest lands them, FILE_READINGS to a file, `pause_s` apart."""
    writer = LandingWriter(landing, "test")
    for i in range(0, len(readings), FILE_READINGS):
        chunk = [dict(r) for r in readings[i : i + FILE_READINGS]]
        writer.add_readings("traffic", chunk, "lookout/traffic/1/readings", int(time.time() * 1e3))
        writer.flush()
        time.sleep(pause_s)


def close_windows(landing: Path) -> None:
    """A heartbeat past every window of the readings: they all close."""
    writer = LandingWriter(landing, "test")
    writer.add_heartbeat("traffic", {"source": "gw", "ts": T0 + 80 * 60_000}, 0)
    writer.flush()


def waiting(landing: Path) -> int:
    """Landing files the engine has not committed yet."""
    return len(list(landing.glob("stream=*/part-*")))


def added(config: Config, table: str) -> set[str]:
    """The data files any commit of `table` added (a merge's replaced ones too)."""
    return {
        action["add"]["path"]
        for commit in Path(config.table(table), "_delta_log").glob("*.json")
        for action in map(orjson.loads, commit.read_bytes().splitlines())
        if "add" in action
    }


def leftovers(config: Config, tables: list[str]) -> list[str]:
    """Temporary files anywhere in the lakehouse (Spark's hidden `.tmp`, delta-rs's
    staged `#` uploads, a health record's), and data files no commit of their table
    ever added."""
    found = [
        str(p)
        for p in Path(config.lakehouse).rglob("*")
        if p.is_file() and ((p.name.startswith(".") and ".tmp" in p.name) or "#" in p.name)
    ]
    for name in tables:
        folder = Path(config.table(name))
        found += [str(p) for p in folder.glob("*.parquet") if p.name not in added(config, name)]
    return found


def test_a_full_then_read_only_disk_pauses_the_engine_and_it_resumes_exactly(tmp_path):
    readings = arrival_order(make_readings(seed=31), seed=32, max_delay_ms=1_500)
    # A few readings far behind the slack: late capture across the faults too.
    late = [dict(r, seq=10_000 + i, ts=r["ts"] - 30_000) for i, r in enumerate(readings[150::150])]
    stream = readings[:150] + late[:1] + readings[150:] + late[1:]
    parts = [stream[: len(stream) // 3], stream[len(stream) // 3 : 2 * len(stream) // 3]]
    parts.append(stream[2 * len(stream) // 3 :])
    replayed = replay_congestion(tmp_path, stream)
    rule_set = replayed.rule_set
    want_late = [(r["source"], r["seq"]) for r in map(orjson.loads, replayed.rows("late_readings"))]
    assert want_late
    want_incidents = incidents([orjson.loads(x) for x in replayed.rows("incidents")])
    outputs = run(
        rule_set.plan, read_readings([((rule_set.plan.streams["traffic"],), replayed.recording)])
    )
    want_ids = sorted(alert_ids(rule_set.plan, outputs.outputs))
    assert len(want_ids) == len(replayed.alerts)

    landing = tmp_path / "landing"
    log = tmp_path / "engine.log"
    with small_disk(tmp_path / "disk", "16m") as disk:
        lakehouse = disk / "lakehouse"
        config = Config(lakehouse=str(lakehouse))

        def health() -> dict:
            return read_health(str(lakehouse), "engine") or {}

        def alive() -> bool:
            assert engine.poll() is None, f"lookout engine exited:\n{log.read_text()[-3000:]}"
            return True

        def stored() -> int:
            return len(delta_rows(config, "readings_traffic")) + len(
                delta_rows(config, "late_readings")
            )

        land(landing, parts[0])
        engine = start_engine(
            config,
            replayed.rules_file,
            log,
            LOOKOUT_INGEST_LANDING_URL=str(landing),
            LOOKOUT_ENGINE_METRICS_PORT="0",
            LOOKOUT_ENGINE_DRIVER_MEMORY="1g",
        )
        try:
            wait_for(lambda: alive() and delta_rows(config, "alerts"), 240, "the first alerts")
            # The disk fills while the second third lands, a file every 0.1 s.
            lander = threading.Thread(target=land, args=(landing, parts[1], 0.1))
            lander.start()
            time.sleep(0.5)
            ballast = fill(disk, "ballast")
            lander.join()
            wait_for(
                lambda: alive() and (health().get("storage") or {}).get("problem") == "disk full",
                60,
                "the health record to say the disk is full",
            )
            record = health()
            assert record["storage"]["path"] == str(lakehouse), record["storage"]
            assert not record["ready"]
            time.sleep(4)  # retries (1 s doubling): none may start the query on a full disk
            assert alive() and waiting(landing) > 0, "the landing files must wait"
            text = log.read_text()
            assert text.count("the engine cannot write: disk full") == 1, text[-3000:]
            assert "starts again from its checkpoint" not in text

            ballast.unlink()
            wait_for(
                lambda: alive() and "the engine writes again" in log.read_text(),
                60,
                "the engine to write again",
            )
            wait_for(
                lambda: alive() and stored() >= len(parts[0]) + len(parts[1]),
                60,
                "the second third stored",
            )
            wait_for(lambda: health().get("ready") and not health().get("storage"), 10, "health")

            remount(disk, "ro")
            try:
                land(landing, parts[2])
                close_windows(landing)
                wait_for(
                    lambda: alive() and "the engine cannot write: read-only" in log.read_text(),
                    60,
                    "the read-only disk in the log",
                )
                time.sleep(2)
                assert alive() and waiting(landing) > 0
            finally:
                remount(disk, "rw")
            wait_for(lambda: alive() and stored() >= len(stream), 120, "every reading stored")
            wait_for(
                lambda: incidents(delta_rows(config, "incidents")) == want_incidents,
                60,
                "the incidents replay gives",
            )
            wait_for(lambda: health().get("ready") and not health().get("storage"), 30, "health")
        finally:
            stop_engine(engine)
        assert engine.returncode == 0, log.read_text()[-3000:]
        assert log.read_text().count("the engine writes again") == 2

        alerts = delta_rows(config, "alerts")
        assert sorted(a["alert_id"] for a in alerts) == want_ids, "each alert once, none missing"
        rows = delta_rows(config, "readings_traffic")
        assert Counter((r["source"], r["seq"]) for r in rows).most_common(1)[0][1] == 1
        assert len(rows) == len(stream) - len(want_late)
        late_rows = delta_rows(config, "late_readings")
        assert sorted((r["source"], r["seq"]) for r in late_rows) == sorted(want_late)
        speeds = Counter(
            (r["station"], ms(r["ts"]), round(r["avg_speed"], 9))
            for r in delta_rows(config, "station_speed")
        )
        want_speeds = Counter(
            (r["station"], ms(r["ts"]), round(r["avg_speed"], 9))
            for r in map(orjson.loads, replayed.rows("station_speed"))
        )
        assert speeds == want_speeds, "the derived stream's rows, each once"
        tables = engine_tables(rule_set.plan)
        assert not leftovers(config, tables), leftovers(config, tables)
        # Each batch's files are named after it: how a batch that never committed is told.
        assert all(name.startswith("part-b") for name in added(config, "readings_traffic"))
        assert (lakehouse / "_health" / ".engine.reserve").stat().st_size > 0
        # Checksum files, whose stream kept a failed file open, are written nowhere (the
        # state store's changelogs are written by the executors' tasks).
        assert not list((lakehouse / "_checkpoints").rglob("*.crc"))
