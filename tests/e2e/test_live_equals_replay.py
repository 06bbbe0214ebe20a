"""Live = replay: the Spark job and `lookout replay` write the same rows for the same readings.

For each rule library (`rules/traffic.sql`, `rules/rfid.sql`) the simulator records a
file that raises every rule of it (bounded disorder within the slack, a fraction of
readings later than the slack). The file is published line by line to a real
mosquitto — so its line order is the arrival order — and run live through ingest and
the Spark job with every rule of the library;
a final heartbeat far ahead plays the part of replay's end of input. Then `lookout
replay` runs the same rules over the same file. Every derived stream, every alert,
every incident (in its final state) and the late readings must be the same rows.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import orjson
import pytest

from engine.core.plan import ColumnType
from lookout.replay import run_replay
from rules.language.loader import load_rules
from tests.e2e.helpers import normalised
from tests.pipeline import delta_rows, publish, running_engine, running_ingest, table_rows, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]

RULES = Path(__file__).resolve().parents[2] / "rules"


@dataclass(frozen=True)
class Library:
    """A rule file, the simulator run that exercises it, and what that run must raise."""

    rules: str
    stream: str
    simulate: tuple[str, ...]
    topic: Callable[[dict], str]
    heartbeat_topic: str
    must_raise: tuple[str, ...]


TRAFFIC = Library(
    rules="traffic.sql",
    stream="traffic",
    # a congested station, a silent detector, a speeding one
    simulate=(
        "traffic",
        "--rate",
        "8",
        "--duration",
        "900",
        "--stations",
        "4",
        "--congestion",
        "2",
        "--silent",
        "3@300+400",
        "--speeding",
        "1",
    ),
    topic=lambda r: f"lookout/traffic/{r['station']}/readings",
    heartbeat_topic="lookout/traffic/gateway/heartbeat",
    must_raise=("congestion", "speeding", "silent_detector", "late_readings"),
)
RFID = Library(
    rules="rfid.sql",
    stream="tag_readings",
    # packing groups, thefts, authorised exits and a missing item (ESL examples 17, 18)
    simulate=(
        "rfid",
        "--rate",
        "5",
        "--duration",
        "900",
        "--packing",
        "2",
        "--theft",
        "2",
        "--authorised-exit",
        "2",
        "--missing",
        "2",
    ),
    topic=lambda r: f"lookout/rfid/{r['door']}/readings",
    heartbeat_topic="lookout/rfid/gateway/heartbeat",
    must_raise=("packing_groups", "larceny", "missed_shipping", "door_day_totals", "late_readings"),
)


def record(tmp_path: Path, library: Library) -> Path:
    """The simulator's recording: bounded disorder within the 2 s slack, 1 % late."""
    out = tmp_path / f"{library.stream}.jsonl"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "lookout.cli",
            "simulate",
            *library.simulate,
            "--out",
            str(out),
            "--truth",
            str(tmp_path / "truth.jsonl"),
            "--seed",
            "11",
            "--disorder",
            "bounded:1.5",
            "--late-fraction",
            "0.01",
            "--quiet",
        ],
        check=True,
    )
    return out


@pytest.mark.parametrize("library", [TRAFFIC, RFID], ids=lambda lib: lib.rules)
def test_live_rows_equal_replay_rows(spark, mosquitto, lookout_config, tmp_path, library):
    # Tables compacted, and their logs cleaned, every second while the queries append
    # and read them: a compaction's rewritten files must not reach a streaming reader
    # twice, and no reader may find a commit it still needs gone.
    engine_config = replace(lookout_config.engine, compact_every_seconds=1.0, compact_min_files=2)
    lookout_config = replace(lookout_config, engine=engine_config)
    rules = RULES / library.rules
    rule_set = load_rules([rules])
    plan = rule_set.plan
    recording = record(tmp_path, library)
    lines = recording.read_bytes().splitlines()
    last_ts = max(orjson.loads(line)["ts"] for line in lines)
    messages = [(library.topic(orjson.loads(line)), line) for line in lines]
    messages.append(
        (
            library.heartbeat_topic,
            orjson.dumps({"source": "gateway", "ts": last_ts + 86_400_000}),
        )
    )

    out = tmp_path / "replay"
    assert run_replay([str(rules)], [f"{library.stream}={recording}"], str(out)) == 0
    replayed = {
        p.stem: [orjson.loads(x) for x in p.read_bytes().splitlines()] for p in out.glob("*.jsonl")
    }
    sinks = [q.sink for q in plan.queries]
    alert_names = {s.name for s in sinks if s.kind == "ALERT"}
    for name in library.must_raise:
        assert replayed.get(name), f"the recording must raise {name} rows"

    with (
        running_ingest(lookout_config, rule_set),
        running_engine(lookout_config, rule_set, spark) as engine,
    ):
        # In two parts, the second once the first is in Delta, so the readings table
        # holds at least two files for a compaction to merge, however the landing
        # batches the first part.
        half = len(messages) // 2
        publish(mosquitto, messages[:half])
        wait_for(
            lambda: delta_rows(lookout_config, f"readings_{library.stream}"),
            120,
            f"the first readings in readings_{library.stream}",
            engine=engine,
        )
        publish(mosquitto, messages[half:])
        expected_alerts = sum(len(replayed.get(n, [])) for n in alert_names)
        wait_for(
            lambda: len(delta_rows(lookout_config, "alerts")) >= expected_alerts,
            300,
            f"{expected_alerts} alerts",
            engine=engine,
        )
        for sink in sinks:
            if sink.kind == "STREAM":
                want = len(replayed.get(sink.name, []))
                wait_for(
                    lambda s=sink.name, n=want: len(delta_rows(lookout_config, s)) >= n,
                    120,
                    f"{want} rows of {sink.name}",
                    engine=engine,
                )
        # Incidents, merged batch after batch while compaction rewrites the table, end
        # in replay's final states.
        stamps = {"opened_at", "last_report_at", "resolved_at"}
        columns = list(replayed["incidents"][0])
        want_incidents = normalised(replayed["incidents"], stamps)
        wait_for(
            lambda: (
                normalised(
                    [{c: r[c] for c in columns} for r in delta_rows(lookout_config, "incidents")],
                    stamps,
                )
                == want_incidents
            ),
            120,
            "the incidents replay gives",
            every=1.0,
            engine=engine,
        )
        # A compaction round runs every second: the last rows may land before one has
        # seen two files of a table.
        readings = lookout_config.table(f"readings_{library.stream}")
        derived = {lookout_config.table(s.name) for s in sinks if s.kind == "STREAM"}
        wait_for(
            lambda: readings in engine.maintenance.last and derived & set(engine.maintenance.last),
            60,
            "a compaction of the readings table and of a derived stream",
            engine=engine,
        )
        assert not engine.maintenance.errors

    live_alerts = table_rows(spark, lookout_config, "alerts")
    for sink in sinks:
        schema = plan.streams[sink.name]
        stamps = {c.name for c in schema.columns if c.type == ColumnType.TIMESTAMP}
        if sink.kind == "ALERT":
            live = [orjson.loads(a["payload"]) for a in live_alerts if a["rule"] == sink.name]
        else:
            columns = [c.name for c in schema.columns]  # the table adds (source, seq)
            live = [
                {c: r[c] for c in columns} for r in table_rows(spark, lookout_config, sink.name)
            ]
        assert normalised(live, stamps) == normalised(replayed.get(sink.name, []), stamps), (
            sink.name
        )
    assert len({a["alert_id"] for a in live_alerts}) == len(live_alerts)

    late_live = {
        (r["source"], r["seq"]) for r in table_rows(spark, lookout_config, "late_readings")
    }
    late_replay = {(r["source"], r["seq"]) for r in replayed["late_readings"]}
    assert late_live == late_replay
