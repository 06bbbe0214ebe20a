"""A stored history to preview on: `readings_traffic` written with delta-rs in the
engine's schema, several files, and the rule file under preview.

Four stations send one reading a second for 30 minutes and a second; station 2 is slow
(3 m/s) in minutes 10-11 and from minute 28 on, station 3 falls silent at minute 20,
station 4 one minute before the end. The last readings arrived after heartbeats had
moved the clock on, so the stored watermark (`END`) is higher than the readings alone
would make it: the window ending at minute 30 is final only at the stored watermark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deltalake import write_deltalake

from engine.tables import ms_table, readings_schema
from rules.language.loader import RULES_DIR, load_rules

T0 = 1_700_000_040_000
"""A whole minute: the first reading's second."""
SLACK_MS = 2_000
SECONDS = 1_802
FILES = 6

RULE = """-- under preview
CREATE ALERT slow_minute SEVERITY warning MESSAGE 'station {station}: {avg_speed} m/s'
  RESOLVE AFTER 90 SECONDS
  AS SELECT station, window_end, avg(speed) AS avg_speed
     FROM traffic [RANGE 1 MINUTE] GROUP BY station HAVING avg(speed) < 10;
CREATE ALERT crawl SEVERITY info MESSAGE 'station {station}: {speed} m/s'
  AS SELECT station, ts, speed FROM traffic WHERE speed < 5;
CREATE ALERT quiet SEVERITY warning RESOLVE WHEN TRUE
  AS SELECT station,
            silence(ts) OVER (PARTITION BY station RANGE 2 MINUTES PRECEDING ACTIVE EXPIRATION)
              AS last_reading
     FROM traffic;
"""
TIMESTAMPS = ("ts", "window_end", "last_reading")


def _speed(station: int, second: int) -> float:
    minute = second // 60
    slow = station == 2 and (minute in (10, 11) or minute >= 28)
    return 3.0 if slow else 30.0


def readings() -> list[dict[str, Any]]:
    """The readings in arrival (event-time) order, as `lookout replay` reads them."""
    rows = []
    for second in range(SECONDS):
        for station in (1, 2, 3, 4):
            if (station == 3 and second >= 20 * 60) or (station == 4 and second >= 29 * 60):
                continue
            ts = T0 + second * 1000 + 250 + station * 10
            speed = _speed(station, second)
            rows.append({"station": station, "lane": 1, "speed": speed, "length": 4.5, "ts": ts})
    return rows


LAST_TS = readings()[-1]["ts"]
END = LAST_TS - 500
"""The stored watermark: heartbeats had the clock 0.5 s behind the last reading."""


def write_history(lakehouse: Path) -> list[dict[str, Any]]:
    """Write `readings_traffic` under `lakehouse` in `FILES` appends; the readings."""
    schema = readings_schema(load_rules([RULES_DIR]).plan.streams["traffic"])
    rows = readings()
    stored, clock = [], None
    for seq, row in enumerate(rows):
        clock = max(clock or row["ts"] - SLACK_MS, row["ts"] - SLACK_MS)
        if seq >= len(rows) - 3:  # the last ones came after heartbeats
            clock = max(clock, END)
        stored.append(
            {**row, "source": "sim", "epoch": "e1", "seq": seq, "topic": "t",
             "received_at": row["ts"], "arrival_watermark": clock}
        )  # fmt: skip
    size = -(-len(stored) // FILES)
    for start in range(0, len(stored), size):
        table = ms_table(stored[start : start + size], schema)
        write_deltalake(str(lakehouse / "readings_traffic"), table, mode="append")
    return rows
