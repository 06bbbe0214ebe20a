"""`lookout replay` of a stream with per-source clocks (`SLACK d PER SOURCE IDLE i`):
one sensor's clock nine years ahead sets none of the others' readings aside (with one
clock for the stream, it sets aside all of them), and replay gives the rows the live
pipeline gives for the same arrivals: landed by ingest's writer, read back by the
engine's reader, in batches with the state saved and restored between them."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from engine.core.pipeline import Pipeline
from engine.core.replay import ordered_outputs, run
from engine.core.state import MemoryStore
from engine.landed_files import read_stream_file
from ingest.landing import LandingWriter
from lookout.replay import run_replay
from lookout.replay_inputs import Readings, parse_inputs
from rules.language.loader import load_rules

BASE = 1_767_225_600_000  # 2026-01-01T00:00:00Z
YEAR = 365 * 86_400_000
RULES = """\
CREATE STREAM s (station INT, speed DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS{clock} SOURCE 'lookout/s/+/readings';
CREATE ALERT slow SEVERITY warning AS SELECT station, ts, speed FROM s WHERE speed < 5;
CREATE STREAM per_minute AS SELECT station, window_end, count(*) AS n
  FROM s [RANGE 1 MINUTE SLIDE 1 MINUTE] GROUP BY station;
"""
PER_SOURCE = " PER SOURCE IDLE 10 SECONDS"


def recording() -> list[dict[str, Any]]:
    """Stations 1 and 2 (gateways g1, g2; g2 1.5 s behind) every second for five
    minutes, with some disorder; station 9's gateway jumps nine years ahead at 40 s."""
    rng = random.Random(7)
    readings = []
    for second in range(300):
        for station, source, lag in ((1, "g1", 0), (2, "g2", 1_500)):
            ts = BASE + second * 1_000 - lag - rng.choice([0, 0, 500, 1_500])
            speed = 3.0 if second % 17 == 0 else 20.0
            readings.append({"station": station, "speed": speed, "ts": ts, "source": source})
        if second % 10 == 0:
            ahead = 9 * YEAR if second >= 40 else 0
            readings.append({"station": 9, "speed": 20.0, "ts": BASE + second * 1_000 + ahead,
                             "source": "g9"})  # fmt: skip
    counters: dict[str, int] = {}
    for r in readings:
        r["seq"] = counters[r["source"]] = counters.get(r["source"], 0) + 1
    return readings


def replayed(tmp_path: Path, clock: str) -> dict[str, list[dict[str, Any]]]:
    rules = tmp_path / f"rules{len(clock)}.sql"
    rules.write_text(RULES.format(clock=clock))
    recorded = tmp_path / "s.jsonl"
    recorded.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recording()))
    out = tmp_path / f"out{len(clock)}"
    assert run_replay([str(rules)], [f"s={recorded}"], str(out), progress=False) == 0
    return {
        name: [orjson.loads(x) for x in (out / f"{name}.jsonl").read_bytes().splitlines()]
        if (out / f"{name}.jsonl").exists()
        else []
        for name in ("late_readings", "per_minute", "slow")
    }


def test_a_sensor_years_ahead_sets_no_other_sensors_readings_aside(tmp_path: Path) -> None:
    per_source = replayed(tmp_path, PER_SOURCE)
    assert {r["station"] for r in per_source["late_readings"]} <= {9}
    counts = {(r["station"], r["window_end"]): r["n"] for r in per_source["per_minute"]}
    assert sum(n for (station, _), n in counts.items() if station in (1, 2)) == 600
    assert len([r for r in per_source["slow"] if r["station"] in (1, 2)]) == 2 * 18

    one_clock = replayed(tmp_path, "")
    assert len([r for r in one_clock["late_readings"] if r["station"] in (1, 2)]) > 500


def live(plan: Any, readings: list[dict[str, Any]], tmp_path: Path) -> list[Any]:
    """The outputs of the live path: ingest lands the readings (a file every 13), the
    engine reads the files back three at a time into a pipeline rebuilt from its store
    before each batch; the end of input closes every window."""
    writer = LandingWriter(tmp_path / "landing", "test")
    files: list[Path] = []
    for start in range(0, len(readings), 13):
        writer.add_readings("s", readings[start : start + 13], "lookout/s/g/readings", 0)
        files += writer.flush()
    files.sort()
    schema = plan.streams["s"]
    store = MemoryStore()
    emitted = []
    for start in range(0, len(files), 3):
        pipeline = Pipeline(plan, store=store)
        parts = [
            read_stream_file(schema, f.name, f.read_bytes())[0] for f in files[start : start + 3]
        ]
        emitted += pipeline.process({"s": pa.concat_tables(parts)}).outputs
        pipeline.save()
    emitted += Pipeline(plan, store=store).finish().outputs
    return ordered_outputs(emitted)


def test_replay_gives_the_live_pipelines_rows(tmp_path: Path) -> None:
    rules = tmp_path / "rules.sql"
    rules.write_text(RULES.format(clock=PER_SOURCE))
    plan = load_rules([rules]).plan
    readings = recording()
    replay = run(plan, [("s", r) for r in readings], batch=50)
    assert replay.late == []
    found = [(o.sink, o.ts, o.row) for o in live(plan, readings, tmp_path)]
    assert found == [(o.sink, o.ts, o.row) for o in replay.outputs]
    assert len(found) == 2 * 18 + 3 * 6  # the slow readings and per-minute counts


def test_a_readings_table_of_a_per_source_stream_says_what_it_lacks(tmp_path: Path) -> None:
    """An engine readings table holds no heartbeats: for a stream with a clock per
    source the summary says its replay may set readings aside."""
    rows = [{**r, "arrival_watermark": r["ts"] - 2_000} for r in recording()[:10]]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "readings_s.parquet")
    for clock, says in ((PER_SOURCE, True), ("", False)):
        rules = tmp_path / "rules.sql"
        rules.write_text(RULES.format(clock=clock))
        plan = load_rules([rules]).plan
        notes = Readings(parse_inputs([f"s={tmp_path / 'readings_s.parquet'}"], plan)).notes
        assert ("has a clock per source and the table holds no heartbeats" in notes[0]) == says
