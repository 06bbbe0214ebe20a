"""Live = replay: the Spark job and `lookout replay` write the same rows for the same readings.

The simulator records a traffic file (bounded disorder within the slack, a fraction of
readings later than the slack, a congested station, a silent detector). The file is
published line by line to a real mosquitto — so its line order is the arrival order —
and run live through ingest and the Spark job with every rule of `rules/traffic.sql`;
a final heartbeat far ahead plays the part of replay's end of input. Then `lookout
replay` runs the same rules over the same file. Every derived stream, every alert and
the late readings must be the same rows.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

import orjson
import pytest

from engine.core.plan import ColumnType
from lookout.replay import run_replay
from rules.language.loader import load_rules
from tests.pipeline import publish, running_engine, running_ingest, table_rows, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]

RULES = Path(__file__).resolve().parents[2] / "rules" / "traffic.sql"


def record(tmp_path: Path) -> Path:
    out = tmp_path / "traffic.jsonl"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "lookout.cli",
            "simulate",
            "traffic",
            "--out",
            str(out),
            "--truth",
            str(tmp_path / "truth.jsonl"),
            "--seed",
            "11",
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
            "--disorder",
            "bounded:1.5",
            "--late-fraction",
            "0.01",
            "--quiet",
        ],
        check=True,
    )
    return out


def _ms(value: object) -> object:
    if isinstance(value, datetime):
        return round(value.timestamp() * 1000)
    if isinstance(value, str):
        return round(datetime.fromisoformat(value).timestamp() * 1000)
    return value


def normalised(rows: list[dict], stamps: set[str]) -> Counter:
    """Rows as hashable tuples: timestamps as epoch ms, floats rounded to 9 digits."""

    def value(key: str, v: object) -> object:
        v = _ms(v) if key in stamps else v
        return round(v, 9) if isinstance(v, float) and math.isfinite(v) else v

    return Counter(tuple(sorted((k, value(k, v)) for k, v in row.items())) for row in rows)


def test_live_rows_equal_replay_rows(spark, mosquitto, lookout_config, tmp_path):
    rule_set = load_rules([RULES])
    plan = rule_set.plan
    recording = record(tmp_path)
    lines = recording.read_bytes().splitlines()
    last_ts = max(orjson.loads(line)["ts"] for line in lines)
    messages = [
        (f"lookout/traffic/{orjson.loads(line)['station']}/readings", line) for line in lines
    ]
    messages.append(
        (
            "lookout/traffic/gateway/heartbeat",
            orjson.dumps({"source": "gateway", "ts": last_ts + 86_400_000}),
        )
    )

    assert run_replay([str(RULES)], [f"traffic={recording}"], str(tmp_path / "replay")) == 0
    replayed = {
        p.stem: [orjson.loads(x) for x in p.read_bytes().splitlines()]
        for p in (tmp_path / "replay").glob("*.jsonl")
    }
    sinks = [q.sink for q in plan.queries]
    alert_names = {s.name for s in sinks if s.kind == "ALERT"}
    assert replayed.get("congestion"), "the recording must raise congestion alerts"
    assert replayed.get("late_readings"), "the recording must hold late readings"
    assert replayed.get("speeding"), "the recording must hold speeding vehicles"
    assert replayed.get("silent_detector"), "the recording must hold a silent detector"

    with (
        running_ingest(lookout_config, rule_set),
        running_engine(lookout_config, rule_set, spark) as engine,
    ):
        publish(mosquitto, messages)
        expected_alerts = sum(len(replayed.get(n, [])) for n in alert_names)
        wait_for(
            lambda: len(table_rows(spark, lookout_config, "alerts")) >= expected_alerts,
            300,
            f"{expected_alerts} alerts",
            engine=engine,
        )
        for sink in sinks:
            if sink.kind == "STREAM":
                want = len(replayed.get(sink.name, []))
                wait_for(
                    lambda s=sink.name, n=want: len(table_rows(spark, lookout_config, s)) >= n,
                    120,
                    f"{want} rows of {sink.name}",
                    engine=engine,
                )

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
