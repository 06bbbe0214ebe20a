"""From sensor to Delta: the PIPES congestion rule through every real part.

Readings of three stations are published to a real mosquitto (some one by one, some as
gateway batches, shuffled within the 2-second slack), landed by the real ingest, and
evaluated by the Spark job. The alerts read back from the Delta table must be exactly
the ones an independent oracle computes — DuckDB's SQL:2003 window functions over the
same readings: per station, the 15-minute RANGE average at the last reading of each
minute, kept where it is below 15 m/s.
"""

from __future__ import annotations

import duckdb
import orjson
import pytest

from rules.language.loader import load_rules
from tests.e2e.helpers import CONGESTION_RULES, T0, arrival_order, as_messages, make_readings
from tests.pipeline import delta_rows, publish, running_engine, running_ingest, table_rows, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]


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
