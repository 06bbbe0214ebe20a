"""UNION ALL live: a window over the union of two streams with different slacks gives,
on Spark, the rows `lookout replay` gives.

Two source streams (north, slack 2 s; south, slack 5 s, its own column names) are
merged by `UNION ALL` into `both_ways`, which a partitioned window and an alert read.
The union's readers must hold their watermark to the slower producer: if the live job
let north's event time run ahead, south's rows would reach the window after it had
moved on (Spark drops them), and the merge order would follow arrival, not event time.
Readings are random (seeded), disordered within each stream's slack, with a few late
ones; stations overlap between the streams so the merge decides the window contents.
"""

from __future__ import annotations

import random

import orjson
import pytest

from engine.core.plan import ColumnType
from lookout.replay import run_replay
from rules.language.loader import load_rules
from tests.e2e.helpers import normalised
from tests.pipeline import delta_rows, publish, running_engine, running_ingest, table_rows, wait_for
from tests.rules.helpers import STREAMS

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]

# The union of tests/rules/test_union.py, read by a row window, a time window, an alert.
RULES = (
    STREAMS
    + """\
CREATE STREAM smoothed AS
  SELECT station, ts, avg(speed) OVER (PARTITION BY station ROWS 2 PRECEDING) AS avg_speed
  FROM both_ways;
CREATE STREAM busy AS
  SELECT ts, count(*) OVER (RANGE 10 SECONDS PRECEDING) AS recent FROM both_ways;
CREATE ALERT slow SEVERITY warning MESSAGE 'station {station}: {avg_speed} m/s'
  AS SELECT station, ts, avg_speed FROM smoothed WHERE avg_speed < 15;
"""
)
START = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def readings(rng: random.Random, n: int, stream: str, slack_ms: int) -> list[dict]:
    """`n` readings 200 ms apart on average, shuffled within `slack_ms`, 2 % late."""
    ts_name, key, value = (
        ("ts", "station", "speed") if stream == "north" else ("at", "detector", "velocity")
    )
    out, t = [], START
    for seq in range(n):
        t += rng.randint(0, 400)
        arrival = t + rng.randint(0, slack_ms - 100)
        if rng.random() < 0.02:
            arrival = t + slack_ms + rng.randint(3_000, 8_000)  # beyond the slack
        speed = rng.choice([rng.uniform(5, 14), rng.uniform(20, 35), 0.0])  # 0: south drops it
        out.append(
            (arrival, {key: rng.randint(1, 4), value: round(speed, 3), ts_name: t,
                       "source": f"{stream}-gw", "seq": seq})
        )  # fmt: skip
    out.sort(key=lambda pair: pair[0])
    return [reading for _, reading in out]


def test_a_window_over_a_union_runs_live_as_in_replay(spark, mosquitto, lookout_config, tmp_path):
    rules = tmp_path / "union.sql"
    rules.write_text(RULES)
    rule_set = load_rules([rules])
    plan = rule_set.plan
    rng = random.Random(7)
    north = readings(rng, 1500, "north", 2_000)
    south = readings(rng, 1500, "south", 5_000)
    (tmp_path / "north.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in north))
    (tmp_path / "south.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in south))
    out = tmp_path / "replay"
    inputs = [f"north={tmp_path / 'north.jsonl'}", f"south={tmp_path / 'south.jsonl'}"]
    assert run_replay([str(rules)], inputs, str(out)) == 0
    replayed = {
        p.stem: [orjson.loads(x) for x in p.read_bytes().splitlines()] for p in out.glob("*.jsonl")
    }
    assert replayed["slow"] and replayed["late_readings"], "the data must exercise both"

    # Each stream keeps its own arrival order; the two interleave as they come.
    messages = []
    for n, s in zip(north, south, strict=True):
        messages.append((f"lookout/north/{n['station']}/readings", orjson.dumps(n)))
        messages.append((f"lookout/south/{s['detector']}/readings", orjson.dumps(s)))
    end = START + 86_400_000  # the final heartbeats: replay's end of input
    messages.append(("lookout/north/gw/heartbeat", orjson.dumps({"source": "gw", "ts": end})))
    messages.append(("lookout/south/gw/heartbeat", orjson.dumps({"source": "gw", "ts": end})))

    with (
        running_ingest(lookout_config, rule_set),
        running_engine(lookout_config, rule_set, spark) as engine,
    ):
        publish(mosquitto, messages)
        for name in ("both_ways", "smoothed", "busy"):
            want = len(replayed[name])
            wait_for(
                lambda s=name, n=want: len(delta_rows(lookout_config, s)) >= n,
                300,
                f"{want} rows of {name}",
                engine=engine,
            )
        want = len(replayed["slow"])
        wait_for(
            lambda: len(delta_rows(lookout_config, "alerts")) >= want,
            120,
            f"{want} alerts",
            engine=engine,
        )

    for name in ("both_ways", "smoothed", "busy"):
        schema = plan.streams[name]
        stamps = {c.name for c in schema.columns if c.type == ColumnType.TIMESTAMP}
        columns = [c.name for c in schema.columns]
        live = [{c: r[c] for c in columns} for r in table_rows(spark, lookout_config, name)]
        assert normalised(live, stamps) == normalised(replayed[name], stamps), name
    alerts = [orjson.loads(a["payload"]) for a in table_rows(spark, lookout_config, "alerts")]
    assert normalised(alerts, {"ts"}) == normalised(replayed["slow"], {"ts"})
    late = {(r["source"], r["seq"]) for r in table_rows(spark, lookout_config, "late_readings")}
    assert late == {(r["source"], r["seq"]) for r in replayed["late_readings"]}
