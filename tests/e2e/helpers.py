"""Helpers shared by the end-to-end tests (and by engine tests that reuse their data):
the congestion rule with its readings, messages and replay; `lookout engine` started
and stopped as its own process; live rows made comparable with replay's; and the
running-count readings and replay of the rule-edit tests.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson

from lookout.demo import stop_process
from lookout.replay import run_replay
from rules.language.loader import RuleSet, load_rules

# The congestion rule (tests/e2e/test_congestion.py and the tests that reuse its data).

CONGESTION_RULES = """
CREATE STREAM traffic (station INT, lane INT, speed DOUBLE, length DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings';
CREATE STREAM station_speed AS
  SELECT station, ts,
         avg(speed) OVER (PARTITION BY station RANGE 15 MINUTES PRECEDING
                          SLIDE 1 MINUTE) AS avg_speed
  FROM traffic;
CREATE ALERT congestion SEVERITY warning
  MESSAGE 'station {station}: {avg_speed} m/s over 15 minutes'
  AS SELECT station, ts, avg_speed FROM station_speed WHERE avg_speed < 15;
"""

T0 = int(datetime(2026, 3, 2, 8, 0, tzinfo=UTC).timestamp() * 1000)


def make_readings(seed: int) -> list[dict]:
    """Twenty minutes at three stations: jammed, free-flowing, and one that jams midway."""
    rng = random.Random(seed)
    readings = []
    for station, speed_at in (
        (1, lambda t: rng.uniform(5, 11)),
        (2, lambda t: rng.uniform(25, 33)),
        (3, lambda t: rng.uniform(20, 28) if t < 10 * 60_000 else rng.uniform(2, 7)),
    ):
        t, seq = 0, 0
        while t < 20 * 60_000:
            lanes = [rng.randint(1, 5)] * (2 if rng.random() < 0.1 else 1)  # ties in ts
            for lane in lanes:
                readings.append(
                    {
                        "station": station,
                        "lane": lane,
                        "speed": round(speed_at(t), 3),
                        "length": round(rng.uniform(3.5, 18), 2),
                        "ts": T0 + t,
                        "source": f"station-{station}",
                        "seq": seq,
                    }
                )
                seq += 1
            t += rng.randint(2_000, 9_000)
    return readings


def arrival_order(readings: list[dict], seed: int, max_delay_ms: int) -> list[dict]:
    """Each reading delayed by up to max_delay_ms (< the slack): disorder within slack."""
    rng = random.Random(seed)
    return sorted(readings, key=lambda r: r["ts"] + rng.randint(0, max_delay_ms))


def as_messages(readings: list[dict], seed: int) -> list[tuple[str, bytes]]:
    """One message per reading, except runs of a station sent as a gateway batch."""
    rng = random.Random(seed)
    messages, i = [], 0
    while i < len(readings):
        run = 1 if rng.random() < 0.7 else rng.randint(2, 6)
        group = [readings[i]]
        while (
            len(group) < run
            and i + len(group) < len(readings)
            and readings[i + len(group)]["station"] == group[0]["station"]
        ):
            group.append(readings[i + len(group)])
        topic = f"lookout/traffic/{group[0]['station']}/readings"
        messages.append((topic, orjson.dumps(group if len(group) > 1 else group[0])))
        i += len(group)
    return messages


# A gateway heartbeat past every window of make_readings: it closes them all.
CLOSING_HEARTBEAT = (
    "lookout/traffic/gw/heartbeat",
    orjson.dumps({"source": "gw", "ts": T0 + 80 * 60_000}),
)


@dataclass(frozen=True)
class Replayed:
    """The congestion rule over a recorded stream, as `lookout replay` computes it."""

    rules_file: Path
    rule_set: RuleSet
    recording: Path
    out: Path  # replay's output folder: one <sink>.jsonl per sink
    alerts: list[dict]  # its congestion alerts

    def rows(self, sink: str) -> list[bytes]:
        """Replay's lines for `sink`."""
        return (self.out / f"{sink}.jsonl").read_bytes().splitlines()


def replay_congestion(tmp_path: Path, stream: list[dict]) -> Replayed:
    """Write the congestion rule and `stream` (in arrival order) under `tmp_path` and
    run `lookout replay` over them: what a live run over the same stream must give."""
    rules_file = tmp_path / "congestion.sql"
    rules_file.write_text(CONGESTION_RULES)
    recording = tmp_path / "arrivals.jsonl"
    recording.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in stream))
    out = tmp_path / "replay"
    assert run_replay([str(rules_file)], [f"traffic={recording}"], str(out)) == 0
    alerts = [orjson.loads(x) for x in (out / "congestion.jsonl").read_bytes().splitlines()]
    assert alerts, "the stream must raise congestion alerts"
    return Replayed(rules_file, load_rules([rules_file]), recording, out, alerts)


# `lookout engine` as its own process (tests/e2e/test_engine_restart.py and others).


def start_engine(config, rules_file: Path, log: Path, **settings: str) -> subprocess.Popen:
    """`lookout engine` as its own process; `settings` are extra LOOKOUT_* variables."""
    env = {
        **os.environ,
        "LOOKOUT_LAKEHOUSE_PATH": config.lakehouse,
        "LOOKOUT_RULES_PATHS": str(rules_file),
        "LOOKOUT_ENGINE_SHUFFLE_PARTITIONS": "2",
        "LOOKOUT_ENGINE_TRIGGER_SECONDS": "0.5",
        **settings,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "lookout.cli", "engine"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_engine(engine: subprocess.Popen, timeout: float = 120) -> None:
    """Stop `lookout engine` as the demo and an operator should (`stop_process`: its own
    process first, then its group); it must end within `timeout`."""
    assert stop_process(engine, timeout), f"lookout engine did not stop within {timeout} s"


def ms(value: str | datetime | None) -> int | None:
    """An ISO-8601 text (replay) or a datetime (Delta) as epoch ms."""
    if value is None:
        return None
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    return round(when.timestamp() * 1000)


def incidents(rows: list[dict]) -> list[tuple]:
    """The incidents table's rows as comparable with replay's lines."""
    return sorted(
        (r["incident_id"], r["key"], ms(r["opened_at"]), ms(r["resolved_at"]), r["reports"])
        for r in rows
    )


# Live rows against replay's (tests/e2e/test_live_equals_replay.py and others).


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


# Running counts per station (tests/e2e/test_rule_edits.py, test_live_rules.py).

STREAM = """\
CREATE STREAM traffic (station INT, speed DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings';
"""
STATIONS = 3


def readings(first_ts: int, first_seq: int, per_station: int) -> list[dict]:
    """Readings of every station every 500 ms, in order, speeds all positive."""
    return [
        {"station": s, "speed": 10.0 + s + i, "ts": first_ts + 500 * i, "source": "gw",
         "seq": first_seq + i * STATIONS + s}
        for i in range(per_station)
        for s in range(STATIONS)
    ]  # fmt: skip


def messages(rows: list[dict], heartbeat_ts: int) -> list[tuple[str, bytes]]:
    """The rows as MQTT messages, then a heartbeat that makes them all final."""
    out = [(f"lookout/traffic/{r['station']}/readings", orjson.dumps(r)) for r in rows]
    out.append(("lookout/traffic/gw/heartbeat", orjson.dumps({"source": "gw", "ts": heartbeat_ts})))
    return out


def replay(tmp_path, name: str, rules: str, rows: list[dict]) -> dict[str, list[dict]]:
    """`lookout replay` of `rules` over `rows`: each sink's rows."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "rules.sql").write_text(rules)
    (folder / "traffic.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = folder / "out"
    assert (
        run_replay([str(folder / "rules.sql")], [f"traffic={folder / 'traffic.jsonl'}"], str(out))
        == 0
    )
    return {
        p.stem: [orjson.loads(x) for x in p.read_bytes().splitlines()] for p in out.glob("*.jsonl")
    }
