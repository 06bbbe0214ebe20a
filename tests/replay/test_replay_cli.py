"""`lookout replay` on a simulator's file: `STREAM=FILE` takes every line as that stream's,
a bare `FILE` sends each line to the source stream whose columns it carries (a traffic
recording with accidents mixes loop-detector readings and position reports). The RFID
simulator as `lookout demo` runs it raises its theft alarm within the demo's first
minutes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.core.output_order import Runs
from engine.core.partitions import partitioning
from engine.core.replay import run_arrivals, run_split, sink_tables
from lookout.replay import run_replay, start_workers
from lookout.replay_inputs import Readings, parse_inputs
from lookout.replay_workers import WorkerFailed, WorkerProcess
from rules.language.loader import RULES_DIR, load_rules
from simulators.cli import FILE_START
from tests.engine.test_output_order import handed_rows, own_rows
from tests.simulators.test_cli import demo_simulators


def simulate(tmp_path: Path, duration_s: int = 600) -> Path:
    out = tmp_path / "traffic.jsonl"
    subprocess.run(
        [sys.executable, "-m", "simulators.cli", "traffic", "--out", str(out), "--duration",
         str(duration_s), "--rate", "20", "--stations", "10", "--accident", "8@120", "--quiet"],
        check=True,
    )  # fmt: skip
    return out


def test_a_bare_file_is_split_by_columns_and_a_named_stream_refuses_the_others(
    tmp_path: Path, capsys
) -> None:
    recording = simulate(tmp_path)
    lines = [orjson.loads(x) for x in recording.read_bytes().splitlines()]
    positions = [r for r in lines if "vid" in r]
    assert positions and len(positions) < len(lines)
    rules = str(RULES_DIR / "traffic.sql")

    assert run_replay([rules], [str(recording)], str(tmp_path / "mixed")) == 0
    accidents = (tmp_path / "mixed" / "accident.jsonl").read_bytes().splitlines()
    assert accidents, "the position reports reached the accident rule"
    # The same rows as two files named by stream.
    (tmp_path / "pos.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in positions))
    loops = [r for r in lines if "vid" not in r]
    (tmp_path / "loops.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in loops))
    inputs = [f"traffic={tmp_path / 'loops.jsonl'}", f"positions={tmp_path / 'pos.jsonl'}"]
    assert run_replay([rules], inputs, str(tmp_path / "split")) == 0
    for name in ("accident.jsonl", "congestion.jsonl", "stopped_vehicles.jsonl"):
        assert (tmp_path / "mixed" / name).read_bytes() == (tmp_path / "split" / name).read_bytes()

    assert run_replay([rules], [f"traffic={recording}"], str(tmp_path / "named")) == 2
    first = next(i for i, r in enumerate(lines, start=1) if "vid" in r)
    assert f"{recording}:{first}: missing field 'station'" in capsys.readouterr().err


def test_workers_split_by_station_write_the_files_one_process_writes(tmp_path: Path) -> None:
    """Two worker processes (traffic split by station, the positions' part whole in one
    of them): every output file byte for byte as one process writes it."""
    recording = simulate(tmp_path)
    rules = [str(RULES_DIR / "traffic.sql")]
    assert run_replay(rules, [str(recording)], str(tmp_path / "one"), workers=1) == 0
    assert run_replay(rules, [str(recording)], str(tmp_path / "two"), workers=2) == 0
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir())
    assert {"accident.jsonl", "speeding.jsonl", "incidents.jsonl"} <= set(names)
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_worker_processes_hand_back_their_rows_as_the_run_goes(tmp_path: Path) -> None:
    """Drained every two batches of 2,000 readings, worker processes hand back rows that,
    with the rest at the end, are one process's rows in its order."""
    recording = simulate(tmp_path)
    plan = load_rules([RULES_DIR / "traffic.sql"]).plan

    def batches() -> Iterator[dict[str, pa.Table]]:
        return Readings(parse_inputs([str(recording)], plan), batch=2_000).batches()

    expected = sink_tables(run_arrivals(plan, batches()).emitted)
    assert expected is not None
    processes = start_workers(plan, 2)
    handed: list[Runs] = []
    try:
        run_split(plan, batches(), partitioning(plan, 2), processes,
                  finished=handed.append, drain_every=2)  # fmt: skip
    finally:
        for process in processes:
            process.close()
    assert len(handed) > 2
    assert handed_rows(handed) == own_rows(expected)


def test_a_worker_that_fails_is_reported_with_its_traceback() -> None:
    plan = load_rules([RULES_DIR / "traffic.sql"]).plan
    worker = WorkerProcess(plan, {0: frozenset(range(len(plan.stages())))})
    try:
        worker.feed({0: {"traffic": pa.table({"lane": [1]})}}, {"traffic": 0, "positions": 0})
        worker.end(None)
        with pytest.raises(WorkerFailed, match=r"(?s)Traceback.*station"):
            worker.produced()
    finally:
        worker.close()


def test_congestion_that_stops_resolves_at_the_first_row_above_the_limit(tmp_path: Path) -> None:
    """Station 3 is slow (10 m/s) for 30 minutes, then fast (30 m/s): its congestion
    incident opens at the first station_speed row below 15 m/s and resolves at the first
    one that is not, both read from the replay's own station_speed rows; it stands for
    every congestion alert of the station. Station 4 is never slow: no incident."""
    readings = [
        {"station": station, "lane": 1, "speed": speed, "length": 4.0, "ts": ts}
        for ts in range(0, 60 * 60_000, 10_000)
        for station, speed in ((3, 10.0 if ts < 30 * 60_000 else 30.0), (4, 30.0))
    ]
    recording = tmp_path / "traffic.jsonl"
    recording.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in readings))
    out = tmp_path / "out"
    assert run_replay([str(RULES_DIR / "traffic.sql")], [f"traffic={recording}"], str(out)) == 0

    def lines(name: str) -> list[dict]:
        return [orjson.loads(x) for x in (out / f"{name}.jsonl").read_bytes().splitlines()]

    speeds = [r for r in lines("station_speed") if r["station"] == 3]
    opened = next(i for i, r in enumerate(speeds) if r["avg_speed"] < 15)
    resolved = next(i for i, r in enumerate(speeds) if i > opened and r["avg_speed"] >= 15)
    congestion = [r for r in lines("incidents") if r["rule"] == "congestion"]
    assert congestion == [
        {
            "incident_id": congestion[0]["incident_id"],
            "rule": "congestion",
            "key": "station=3",
            "severity": "warning",
            "message": f"station 3: {speeds[resolved - 1]['avg_speed']:.2f} m/s over 15 minutes",
            "opened_at": speeds[opened]["ts"],
            "last_report_at": speeds[resolved - 1]["ts"],
            "resolved_at": speeds[resolved]["ts"],
            "reports": len(lines("congestion")),
        }
    ]


def test_the_demos_rfid_simulator_raises_a_larceny_alarm_within_two_minutes(
    tmp_path: Path,
) -> None:
    """The demo's RFID simulator, written to a file for one episode period (whose
    schedule is then the endless run's first), through rules/rfid.sql: the theft it
    plants is a `larceny` alert and incident by two minutes in; the authorised exit is
    none."""
    args = demo_simulators()["rfid-simulator"]
    recording, truth = tmp_path / "rfid.jsonl", tmp_path / "truth.jsonl"
    args.duration, args.out, args.truth, args.quiet = args.period, str(recording), str(truth), True
    assert args.func(args) == 0
    episodes = [orjson.loads(x) for x in truth.read_bytes().splitlines()]
    thefts = [e["tagid"] for e in episodes if e.get("kind") == "theft"]
    exits = [e["tagid"] for e in episodes if e.get("kind") == "authorised_exit"]
    assert thefts and exits

    out = tmp_path / "out"
    assert run_replay([str(RULES_DIR / "rfid.sql")], [str(recording)], str(out)) == 0
    alarms = [orjson.loads(x) for x in (out / "larceny.jsonl").read_bytes().splitlines()]
    assert [a["tagid"] for a in alarms] == thefts
    incidents = [orjson.loads(x) for x in (out / "incidents.jsonl").read_bytes().splitlines()]
    opened = [datetime.fromisoformat(i["opened_at"]) for i in incidents if i["rule"] == "larceny"]
    assert opened and opened[0] - datetime.fromisoformat(FILE_START) <= timedelta(minutes=2)


@pytest.mark.slow
def test_replay_quarantines_what_the_engine_cap_on_live_keys_would(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """lookout.toml's `[engine.streams.traffic] max_live_keys = 4`: the rule keyed by
    station and lane sees four lanes, those keyed by station no more stations (a reading
    one rule has no room for is quarantined for all); the other readings go to
    quarantine.jsonl, each with its reason; positions keep the default cap."""
    config = tmp_path / "lookout.toml"
    config.write_text("[engine.streams.traffic]\nmax_live_keys = 4\n")
    monkeypatch.setenv("LOOKOUT_CONFIG", str(config))
    # Short: with a cap of 4 a batch is 2 readings (half the cap), each a step of its own.
    recording = simulate(tmp_path, duration_s=300)
    rules = str(RULES_DIR / "traffic.sql")
    # Split among workers, the readings a cap could quarantine are seen before any is,
    # and one process evaluates them instead.
    assert run_replay([rules], [str(recording)], str(tmp_path / "out"), workers=2) == 0
    assert "evaluating again in one process" in capsys.readouterr().err
    assert run_replay([rules], [str(recording)], str(tmp_path / "one"), workers=1) == 0
    for name in ("quarantine.jsonl", "station_speed.jsonl", "incidents.jsonl"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()

    def rows(name: str) -> list[dict]:
        return [orjson.loads(x) for x in (tmp_path / "out" / name).read_bytes().splitlines()]

    lines = rows("quarantine.jsonl")
    assert lines and {line["stream"] for line in lines} == {"traffic"}
    assert all(
        line["reason"].startswith("stream traffic: max_live_keys = 4 reached by rule ")
        for line in lines
    )
    assert "quarantined by a cap on live keys" in capsys.readouterr().err
    assert len({row["station"] for row in rows("station_speed.jsonl")}) <= 4
    assert len({(row["station"], row["lane"]) for row in rows("lane_reports.jsonl")}) == 4
    assert rows("accident.jsonl"), "the position reports are not capped"

    # Parquet holds the same readings set aside, with the reason as a column.
    tables = tmp_path / "tables"
    assert run_replay([rules], [str(recording)], str(tables), output_format="parquet") == 0
    quarantine = pq.read_table(tables / "quarantine.parquet").to_pylist()
    assert [(q["source"], q["seq"], q["reason"]) for q in quarantine] == [
        (line["source"], line["seq"], line["reason"]) for line in lines
    ]
