"""From sensor to Delta: the PIPES congestion rule through every real part.

Readings of three stations are published to a real mosquitto (some one by one, some as
gateway batches, shuffled within the 2-second slack), landed by the real ingest, and
evaluated by the Spark job. The alerts read back from the Delta table must be exactly
the ones an independent oracle computes — DuckDB's SQL:2003 window functions over the
same readings: per station, the 15-minute RANGE average at the last reading of each
minute, kept where it is below 15 m/s.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import orjson
import pytest

from lookout.replay import run_replay
from rules.language.loader import RuleSet, load_rules
from tests.pipeline import delta_rows, publish, running_engine, running_ingest, table_rows, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]

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


def oracle_alerts(readings: list[dict]) -> list[tuple[int, int, float]]:
    """(station, ts, avg_speed) by DuckDB window functions (the semantics in docs/engine.md)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE r (station INT, speed DOUBLE, ts BIGINT, source VARCHAR, seq BIGINT)")
    con.executemany(
        "INSERT INTO r VALUES (?, ?, ?, ?, ?)",
        [(r["station"], r["speed"], r["ts"], r["source"], r["seq"]) for r in readings],
    )
    rows = con.execute("""
        SELECT station, ts, avg_speed FROM (
          SELECT station, ts,
                 avg(speed) OVER (PARTITION BY station ORDER BY ts
                                  RANGE BETWEEN 900000 PRECEDING AND CURRENT ROW) AS avg_speed,
                 row_number() OVER (PARTITION BY station, ts // 60000
                                    ORDER BY ts DESC, source DESC, seq DESC) AS yield_rank
          FROM r)
        WHERE yield_rank = 1 AND avg_speed < 15
        ORDER BY station, ts""").fetchall()
    return [(s, t, a) for s, t, a in rows]


def test_congestion_alerts_equal_the_oracle(spark, mosquitto, lookout_config, tmp_path):
    rules_file = tmp_path / "congestion.sql"
    rules_file.write_text(CONGESTION_RULES)
    rule_set = load_rules([rules_file])
    readings = make_readings(seed=7)
    expected = oracle_alerts(readings)
    assert {s for s, _, _ in expected} == {1, 3}, "the data must jam stations 1 and 3 only"

    # Then the gateway falls quiet; its heartbeat says nothing older than an hour later
    # will come, which moves event time past every window so the last minutes close.
    heartbeat = {"source": "gateway-1", "ts": T0 + 80 * 60_000}
    messages = as_messages(arrival_order(readings, seed=8, max_delay_ms=1_500), seed=9)
    messages.append(("lookout/traffic/gateway-1/heartbeat", orjson.dumps(heartbeat)))

    with (
        running_ingest(lookout_config, rule_set),
        running_engine(lookout_config, rule_set, spark) as engine,
    ):
        publish(mosquitto, messages)
        wait_for(
            lambda: len(delta_rows(lookout_config, "alerts")) >= len(expected),
            180,
            f"{len(expected)} congestion alerts",
            engine=engine,
        )
        stored = wait_for(
            lambda: len(delta_rows(lookout_config, "readings_traffic")) == len(readings),
            60,
            "every reading in readings_traffic",
            engine=engine,
        )

    alerts = table_rows(spark, lookout_config, "alerts")
    got = sorted(
        (p["station"], p["ts"], p["avg_speed"])
        for p in (orjson.loads(a["payload"]) for a in alerts)
    )
    assert [(s, t) for s, t, _ in got] == [(s, t) for s, t, _ in expected]
    for (_, _, avg_got), (_, _, avg_expected) in zip(got, expected, strict=True):
        assert avg_got == pytest.approx(avg_expected, rel=1e-9)
    assert len({a["alert_id"] for a in alerts}) == len(alerts), "alert ids must be unique"
    assert {a["rule"] for a in alerts} == {"congestion"}
    assert all(a["key"] in ("station=1", "station=3") for a in alerts)
    assert all(
        a["message"].startswith(f"station {orjson.loads(a['payload'])['station']}: ")
        for a in alerts
    )
    assert table_rows(spark, lookout_config, "late_readings") == []
    assert stored
