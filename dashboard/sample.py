"""A demo-like lakehouse written without Spark, to preview and test the dashboard.

`python -m dashboard.sample DIR` writes every table the dashboard reads (with the
schemas of `engine/tables.py` and the shipped rules) and the health files, ending at
the current time:
eight traffic stations (3 and 7 congested, 5 silent for the last ten minutes), four
RFID doors with packing groups and a theft alarm, the incidents of those alerts (firing
and resolved), some late and quarantined readings.
`--readings` and `--alerts` scale it up for the load benchmark.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from engine import tables
from engine.alerts import incident_id
from rules.language.loader import RULES_DIR, load_rules

TS = tables.TIMESTAMP
STATIONS = 8
CONGESTED = (3, 7)
SILENT = 5
DOORS = ("1", "2", "3", "4")

# The tables' own schemas, from the engine and the shipped rules.
_SOURCES = load_rules([RULES_DIR]).plan.streams
ALERTS = tables.ALERTS
LATE_READINGS = tables.LATE_READINGS
QUARANTINE = tables.QUARANTINE
READINGS_TRAFFIC = tables.readings_schema(_SOURCES["traffic"])
READINGS_TAGS = tables.readings_schema(_SOURCES["tag_readings"])
# Derived streams: only the columns the pages read (the real tables add source, seq).
STATION_SPEED = pa.schema([("station", pa.int32()), ("ts", TS), ("avg_speed", pa.float64())])
PACKING_GROUPS = pa.schema(
    [("tagid", pa.string()), ("door", pa.string()), ("ts", TS), ("group_no", pa.int64())]
)


def _ts(ms: np.ndarray | list[int]) -> pa.Array:
    return pa.array(np.asarray(ms, dtype="int64") * 1000, type=pa.int64()).cast(TS)


def _write(root: Path, name: str, table: pa.Table) -> None:
    write_deltalake(str(root / name), table, mode="append")


def _arrival(ts_ms: np.ndarray, stream: str) -> pa.Array:
    """The landing's stamp for readings arriving in `ts_ms` order: the stream's
    watermark once each had arrived."""
    return _ts(np.maximum.accumulate(ts_ms) - _SOURCES[stream].slack_ms)


def traffic_readings(end_ms: int, rows: int, seed: int = 7) -> pa.Table:
    """`rows` vehicles spread over the 8 stations during the hour before `end_ms`."""
    rng = np.random.default_rng(seed)
    station = rng.integers(1, STATIONS + 1, rows).astype("int32")
    ts = np.sort(rng.integers(end_ms - 3_600_000, end_ms, rows))
    speed = rng.normal(28, 4, rows).clip(2, 45)
    recent = ts > end_ms - 1_200_000
    for s in CONGESTED:  # the last 20 minutes crawl at ~8 m/s
        slow = (station == s) & recent
        speed[slow] = rng.normal(8, 2, slow.sum()).clip(1, 14)
    keep = ~((station == SILENT) & (ts > end_ms - 600_000))  # station 5 went quiet
    station, ts, speed = station[keep], ts[keep], speed[keep]
    n = len(ts)
    lane = rng.integers(1, 4, n).astype("int32")
    length = np.where(rng.random(n) < 0.1, rng.uniform(10, 18, n), rng.uniform(3.5, 5.5, n))
    source = np.char.add("station-", station.astype(str))
    return pa.table(
        {
            "station": station,
            "lane": lane,
            "speed": speed.round(2),
            "length": length.round(2),
            "ts": _ts(ts),
            "source": source,
            "epoch": [""] * n,
            "seq": np.arange(n, dtype="int64"),
            "topic": np.char.add(np.char.add("lookout/traffic/", station.astype(str)), "/readings"),
            "received_at": _ts(ts + 40),
            "arrival_watermark": _arrival(ts, "traffic"),
        },
        schema=READINGS_TRAFFIC,
    )


def _alert_rows(end_ms: int, count: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Congestion alerts each minute at stations 3 and 7, a silent detector, a stopped
    vehicle and a theft; older congestion alerts repeat to reach `count` rows."""
    rows: list[dict[str, Any]] = []  # one alert's columns

    def add(
        rule: str, severity: str, key: str, event_ms: int, message: str, payload: dict[str, object]
    ) -> None:
        digest = hashlib.sha256(f"{rule}|{key}|{event_ms}|{len(rows)}".encode()).hexdigest()
        rows.append(
            {
                "alert_id": digest[:32],
                "rule": rule,
                "severity": severity,
                "key": key,
                "event_time": event_ms,
                "detected_at": event_ms + 900,
                "message": message,
                "payload": orjson.dumps(payload).decode(),
            }
        )

    add(
        "silent_detector",
        "warning",
        f"station={SILENT}",
        end_ms - 300_000,
        f"station {SILENT}: no reading since 10 minutes ago",
        {"station": SILENT},
    )
    add(
        "stopped_vehicle",
        "critical",
        "station=2, lane=1",
        end_ms - 2_400_000,
        "station 2 lane 1: vehicle stopped (4 reports under 1 m/s)",
        {"station": 2, "lane": 1},
    )
    add(
        "larceny",
        "critical",
        "door=4",
        end_ms - 420_000,
        "item item-0042 left through door 4 without an authorised person",
        {"tagid": "item-0042", "door": "4"},
    )
    minute = 0
    while len(rows) < count:
        for s in CONGESTED:
            speed = round(float(rng.normal(10, 2)), 1)
            add(
                "congestion",
                "warning",
                f"station={s}",
                end_ms - 60_000 * (minute + 1),
                f"station {s}: {speed} m/s over 15 minutes",
                {"station": s, "avg_speed": speed},
            )
        minute += 1
    return rows[:count]


def alerts_table(end_ms: int, count: int, seed: int = 7) -> pa.Table:
    """`count` alerts ending at `end_ms` (see `_alert_rows`)."""
    rows = _alert_rows(end_ms, count, np.random.default_rng(seed))
    table = pa.Table.from_pylist(
        [{**r, "event_time": None, "detected_at": None} for r in rows], schema=ALERTS
    )
    for column in ("event_time", "detected_at"):
        table = table.set_column(
            table.schema.get_field_index(column), column, _ts([r[column] for r in rows])
        )
    return table


def incident_rows(end_ms: int) -> list[dict[str, object]]:
    """The incidents of the sample's alerts, as the engine leaves them (times in epoch ms):
    firing congestion at stations 3 and 7, the silent station 5 and the theft at door 4;
    resolved, the stopped vehicle (after 2 minutes) and an earlier congestion at station 7
    (after 30 minutes)."""

    def incident(
        rule: str,
        severity: str,
        key: str,
        opened_ms: int,
        last_ms: int,
        resolved_ms: int | None,
        reports: int,
        message: str,
    ) -> dict[str, object]:
        return {
            "incident_id": incident_id(rule, key, opened_ms),
            "rule": rule,
            "severity": severity,
            "key": key,
            "message": message,
            "opened_at": opened_ms,
            "last_report_at": last_ms,
            "resolved_at": resolved_ms,
            "reports": reports,
        }

    minute = 60_000
    return [
        *(
            incident(
                "congestion",
                "warning",
                f"station={s}",
                end_ms - 20 * minute,
                end_ms - minute,
                None,
                19,
                f"station {s}: {9.5 + s / 10:.1f} m/s over 15 minutes",
            )
            for s in CONGESTED
        ),
        incident(
            "silent_detector",
            "warning",
            f"station={SILENT}",
            end_ms - 5 * minute,
            end_ms - 5 * minute,
            None,
            1,
            f"station {SILENT}: no reading since 10 minutes ago",
        ),
        incident(
            "larceny",
            "critical",
            "door=4",
            end_ms - 7 * minute,
            end_ms - 7 * minute,
            None,
            1,
            "item item-0042 left through door 4 without an authorised person",
        ),
        incident(
            "stopped_vehicle",
            "critical",
            "station=2, lane=1",
            end_ms - 40 * minute,
            end_ms - 40 * minute,
            end_ms - 38 * minute,
            1,
            "station 2 lane 1: vehicle stopped (4 reports under 1 m/s)",
        ),
        incident(
            "congestion",
            "warning",
            "station=7",
            end_ms - 180 * minute,
            end_ms - 151 * minute,
            end_ms - 150 * minute,
            29,
            "station 7: 12.4 m/s over 15 minutes",
        ),
    ]


def write_incidents(root: Path, rows: list[dict[str, object]]) -> None:
    """Merge incident states (times in epoch ms) into `root`'s `incidents` table by id, as
    the engine's batches do (`engine.tables.merge_files`), as the next batch of a writer
    named `sample`."""
    location = str(root / "incidents")
    tables.ensure_table(location, tables.INCIDENTS)
    batch = (DeltaTable(location).transaction_version("sample") or 0) + 1
    data = tables.ms_table(rows, tables.INCIDENTS)
    files = [tables.write_data_file("incidents", location, data)]
    tables.merge_files(
        location, tables.INCIDENTS, files, *tables.MERGED["incidents"], "sample", batch
    )


def rfid_readings(end_ms: int, seed: int = 7) -> tuple[pa.Table, pa.Table]:
    """Tag readings of consignments walking doors 1 -> 4, and their packing groups."""
    rng = np.random.default_rng(seed)
    reads: list[tuple[str, str, str, int]] = []
    groups: list[tuple[str, str, int, int]] = []
    group_no = dict.fromkeys(DOORS, 0)
    for c in range(12):
        t0 = end_ms - 3_000_000 + c * 240_000
        items = [f"item-{c * 10 + i:04d}" for i in range(int(rng.integers(3, 7)))]
        for d, door in enumerate(DOORS):
            t = t0 + d * 60_000
            reads.append((f"ap-{c % 3}", "ap", door, t - 1000))
            reads.append((f"case-{c:03d}", "case", door, t))
            group_no[door] += 1
            for i, item in enumerate(items):
                ts = t + 300 * (i + 1)
                reads.append((item, "item", door, ts))
                groups.append((item, door, ts, group_no[door]))
    reads.append(("item-0042", "item", "4", end_ms - 425_000))  # the theft
    reads.sort(key=lambda r: r[3])
    n = len(reads)
    readings = pa.table(
        {
            "tagid": [r[0] for r in reads],
            "tagtype": [r[1] for r in reads],
            "door": [r[2] for r in reads],
            "ts": _ts([r[3] for r in reads]),
            "source": [f"door-{r[2]}" for r in reads],
            "epoch": [""] * n,
            "seq": np.arange(n, dtype="int64"),
            "topic": [f"lookout/rfid/{r[2]}/readings" for r in reads],
            "received_at": _ts([r[3] + 30 for r in reads]),
            "arrival_watermark": _arrival(np.array([r[3] for r in reads]), "tag_readings"),
        },
        schema=READINGS_TAGS,
    )
    packing = pa.table(
        {
            "tagid": [g[0] for g in groups],
            "door": [g[1] for g in groups],
            "ts": _ts([g[2] for g in groups]),
            "group_no": pa.array([g[3] for g in groups], type=pa.int64()),
        },
        schema=PACKING_GROUPS,
    )
    return readings, packing


def station_speed(readings: pa.Table) -> pa.Table:
    """Per station and minute, the mean speed (a stand-in for the rule's 15-minute avg)."""
    frame = readings.select(["station", "ts", "speed"]).to_pandas()
    frame["ts"] = frame["ts"].dt.floor("min")
    out = frame.groupby(["station", "ts"], as_index=False)["speed"].mean()
    out = out.rename(columns={"speed": "avg_speed"})
    return pa.Table.from_pandas(out, schema=STATION_SPEED, preserve_index=False)


def side_tables(end_ms: int) -> dict[str, pa.Table]:
    """Late readings and quarantined payloads (a few, like a healthy feed has)."""
    late = pa.table(
        {
            "stream": ["traffic", "traffic", "tag_readings"],
            "source": ["station-2", "station-6", "door-3"],
            "epoch": ["", "", ""],
            "seq": pa.array([101, 202, 33], type=pa.int64()),
            "ts": _ts([end_ms - 900_000, end_ms - 600_000, end_ms - 300_000]),
            "watermark": _ts([end_ms - 895_000, end_ms - 590_000, end_ms - 297_000]),
            "late_by_ms": pa.array([5000, 10000, 3000], type=pa.int64()),
            "reading": [
                '{"station": 2, "speed": 25.1}',
                '{"station": 6, "speed": 31.0}',
                '{"tagid": "item-0007", "door": "3"}',
            ],
            "topic": [
                "lookout/traffic/2/readings",
                "lookout/traffic/6/readings",
                "lookout/rfid/3/readings",
            ],
            "received_at": _ts([end_ms - 890_000, end_ms - 580_000, end_ms - 296_000]),
        },
        schema=LATE_READINGS,
    )
    payloads = [
        "\x00\x01garbage",
        '{"station": 1, "speed": "fast", "ts": 0}',
        '{"tagid": "item-9", "door": "2"}',
    ]
    quarantine = pa.table(
        {
            "topic": [
                "lookout/traffic/4/readings",
                "lookout/traffic/1/readings",
                "lookout/rfid/2/readings",
            ],
            "reason": [
                "not JSON: unexpected character at byte 0",
                "field 'speed': expected a number, got 'fast'",
                "missing field 'ts'",
            ],
            "payload": payloads,
            "payload_b64": [None, None, None],
            "received_at": _ts([end_ms - 1_500_000, end_ms - 700_000, end_ms - 60_000]),
            "payload_bytes": [len(text.encode()) for text in payloads],
            "payload_sha256": [hashlib.sha256(text.encode()).hexdigest() for text in payloads],
        },
        schema=QUARANTINE,
    )
    return {"late_readings": late, "quarantine": quarantine}


def write_health(root: Path, now_ms: int) -> None:
    """Health files as a running engine and ingester write them."""
    folder = root / "_health"
    folder.mkdir(parents=True, exist_ok=True)
    queries = [
        {
            "name": "engine",
            "active": True,
            "batch_id": 120,
            "batches": 118,
            "input_rows_per_s": 6.0,
            "processed_rows_per_s": 18.0,
            "batch_ms": 510,
            "evaluate_ms": 120.5,
            "commit_ms": 31.0,
            "restore_ms": 2.1,
            "reused": True,
            "keys": {"station_speed": 8, "larceny": 17},
        }
    ]
    streams = [
        {
            "stream": name,
            "max_event_ms": now_ms - lag,
            "watermark_ms": now_ms - lag - 2000,
            "lag_ms": lag,
            "readings": readings,
            "late": late,
            "duplicates": duplicates,
            "conflicts": 0,
            "capped": 0,
            "live_keys": live_keys,
            "max_live_keys": 500_000,
            # The last minute, within the [health] limits.
            "recent": {
                "readings": per_minute,
                "late": 1,
                "duplicates": recent,
                "conflicts": 0,
                "capped": 0,
            },
            "clock_still_ms": 600,
            "arrived_while_still": 3,
        }
        for name, lag, readings, late, duplicates, per_minute, recent, live_keys in (
            ("traffic", 400, 19_593, 2, 5, 18_600, 2, 40),
            ("tag_readings", 900, 333, 1, 0, 270, 0, 212),
        )
    ]
    engine = {
        "updated_at_ms": now_ms,
        "queries": queries,
        "memory": {"driver": 180 << 20, "jvm": 1900 << 20, "python_workers": 420 << 20},
        "streams": streams,
        "quarantined": 3,
        "window_ms": 60_000,
        "recent_quarantined": 1,
        "heartbeats": 3_600,
        "maintenance": {
            "every_s": 300.0,
            "compactions": [
                {
                    "table": str(root / "readings_traffic"),
                    "at_ms": now_ms - 60_000,
                    "files_before": 612,
                    "files_removed": 611,
                    "files_added": 1,
                    "seconds": 0.4,
                }
            ],
            "vacuumed": {str(root / "readings_traffic"): 1_204},
            "log_cleaned": {str(root / "readings_traffic"): 2_310},
            "errors": {},
        },
    }
    ingest = {
        "ingester": "0",
        "messages": 51_230,
        "readings": 1_020_400,
        "heartbeats": 3_600,
        "quarantined": 3,
        "files": 1_800,
        "connected": True,
        "last_landing_lag_ms": 35.0,
        "started_at_ms": now_ms - 3_600_000,
        "messages_per_s": 14.0,
        "readings_per_s": 310.0,
        "updated_at_ms": now_ms,
    }
    (folder / "engine.json").write_bytes(orjson.dumps(engine))
    (folder / "ingest-0.json").write_bytes(orjson.dumps(ingest))


def write_red_health(root: Path, now_ms: int) -> None:
    """Health files as `write_health`'s, but red: the traffic stream takes a restarted
    gateway's readings for duplicates, and its clock has stood still for 270 s; the
    tag_readings stream's rules hold their cap of keys and 12 new tags were quarantined."""
    write_health(root, now_ms)
    path = root / "_health" / "engine.json"
    record = orjson.loads(path.read_bytes())
    traffic = record["streams"][0]
    traffic["recent"] = {"readings": 30, "late": 0, "duplicates": 50_705, "conflicts": 0}
    traffic |= {"clock_still_ms": 270_000, "arrived_while_still": 50_735}
    tags = record["streams"][1]
    tags |= {"capped": 12, "live_keys": 5_000, "max_live_keys": 5_000}
    tags["recent"] |= {"capped": 12}
    path.write_bytes(orjson.dumps(record))


def write_sample(
    root: Path, readings: int = 20_000, alerts: int = 60, end_ms: int | None = None
) -> None:
    """Write the sample lakehouse under `root` (appending if the tables exist)."""
    end_ms = end_ms or int(time.time() * 1000)
    traffic = traffic_readings(end_ms, readings)
    _write(root, "readings_traffic", traffic)
    _write(root, "station_speed", station_speed(traffic))
    _write(root, "alerts", alerts_table(end_ms, alerts))
    write_incidents(root, incident_rows(end_ms))
    tags, packing = rfid_readings(end_ms)
    _write(root, "readings_tag_readings", tags)
    _write(root, "packing_groups", packing)
    for name, table in side_tables(end_ms).items():
        _write(root, name, table)
    write_health(root, end_ms)


def main() -> None:
    """Command line: write a sample lakehouse to preview the dashboard."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lakehouse", type=Path)
    parser.add_argument("--readings", type=int, default=20_000)
    parser.add_argument("--alerts", type=int, default=60)
    args = parser.parse_args()
    write_sample(args.lakehouse, args.readings, args.alerts)
    print(f"wrote a sample lakehouse to {args.lakehouse}")


if __name__ == "__main__":
    main()
