"""Each library rule on small readings with known answers, through the engine core's
replay runner (the same evaluator as the live job)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.pipeline import Pipeline
from engine.core.plan import ExtentWindow, Plan
from engine.core.replay import arrival_table, run
from engine.core.state import MemoryStore
from rules.language.loader import RULES_DIR, RuleSet, load_rules

S = 1_000
M = 60 * S


@pytest.fixture(scope="module")
def library() -> RuleSet:
    return load_rules([RULES_DIR])


def outputs(
    rules: RuleSet, sinks: tuple[str, ...], readings: list[tuple[str, dict[str, Any]]], want: str
) -> list[tuple[int, dict[str, Any]]]:
    """Run only the queries writing `sinks` and return (event time, row) of sink `want`."""
    keep = {s.name for s in rules.plan.sources()} | set(sinks)
    plan = Plan(
        streams={n: s for n, s in rules.plan.streams.items() if n in keep},
        queries=tuple(q for q in rules.plan.queries if q.sink.name in sinks),
    )
    return [(o.ts, o.row) for o in run(plan, readings).outputs if o.sink == want]


def traffic(
    station: int, speed: float, ts: int, lane: int = 1, length: float = 4.0
) -> tuple[str, dict[str, Any]]:
    return "traffic", {"station": station, "lane": lane, "speed": speed, "length": length, "ts": ts}


def tag(tagid: str, tagtype: str, door: str, ts: int) -> tuple[str, dict[str, Any]]:
    return "tag_readings", {"tagid": tagid, "tagtype": tagtype, "door": door, "ts": ts}


def test_congestion(library: RuleSet) -> None:
    # Station 1 slows from 20 to 10 m/s, one reading every 30 s; station 2 stays fast.
    speeds = [20, 20, 10, 10, 10, 10]
    readings = [traffic(1, s, i * 30 * S) for i, s in enumerate(speeds)]
    readings += [traffic(2, 25.0, i * 30 * S + 1) for i in range(6)]
    readings.sort(key=lambda r: r[1]["ts"])
    got = outputs(library, ("station_speed", "congestion"), readings, "congestion")
    # One yield tuple per minute slot; the averages over 15 minutes are 20, 15, 13.33, 12.5.
    assert got == [(150 * S, {"station": 1, "ts": 150 * S, "avg_speed": pytest.approx(40 / 3)})]


def test_station_volume(library: RuleSet) -> None:
    readings = [traffic(1, 20.0, i * S, length=12.0 if i % 4 == 0 else 4.0) for i in range(250)]
    got = outputs(library, ("station_volume",), readings, "station_volume")
    assert got == [
        (99 * S, {"station": 1, "ts": 99 * S, "vehicles": 100, "long_vehicles": 25}),
        (199 * S, {"station": 1, "ts": 199 * S, "vehicles": 200, "long_vehicles": 50}),
    ]


def test_silent_detector(library: RuleSet) -> None:
    # Station 1 reports until 2 min; station 2 keeps event time moving until 10 min.
    readings = [traffic(1, 20.0, t) for t in (0, 1 * M, 2 * M)]
    readings += [traffic(2, 20.0, t * M + 1) for t in range(11)]
    readings.sort(key=lambda r: r[1]["ts"])
    got = outputs(library, ("silent_detector",), readings, "silent_detector")
    # Station 1 is silent from 2 min: alarm at 7 min; station 2's last (10 min) at 15 min.
    assert got == [
        (7 * M, {"station": 1, "last_reading": 2 * M}),
        (15 * M + 1, {"station": 2, "last_reading": 10 * M + 1}),
    ]


def test_stopped_vehicle(library: RuleSet) -> None:
    readings = [
        traffic(3, s, i * 10 * S, lane=2) for i, s in enumerate([12.0, 0.5, 0.2, 0.0, 0.4, 9.0])
    ]
    readings += [traffic(3, 0.0, i * 10 * S + 1, lane=1) for i in range(3)]
    readings.sort(key=lambda r: r[1]["ts"])
    got = outputs(library, ("lane_reports", "stopped_vehicle"), readings, "stopped_vehicle")
    assert got == [(40 * S, {"station": 3, "lane": 2, "ts": 40 * S, "max_speed": 0.5})]


def position(vid: int, pos: int, ts: int, seg: int = 1) -> tuple[str, dict[str, Any]]:
    row = {"vid": vid, "speed": 0.0, "xway": 0, "lane": 1, "dir": 0, "seg": seg, "pos": pos}
    return "positions", {**row, "ts": ts}


def test_accident(library: RuleSet) -> None:
    # Reports every 30 s (Linear Road): vehicles 1 and 2 stand at 100 from t = 0, vehicle
    # 3 stands alone at 500, vehicle 4 drives on, vehicle 5 stops at 100 for two reports.
    readings = []
    for i in range(5):
        t = i * 30 * S
        readings += [position(1, 100, t), position(2, 100, t + 5 * S), position(3, 500, t),
                     position(4, 1000 + 800 * i, t, seg=2)]  # fmt: skip
    readings += [position(5, 100, 100 * S), position(5, 100, 130 * S)]
    readings.sort(key=lambda r: r[1]["ts"])
    sinks = ("last_reports", "stopped_vehicles", "accident")
    got = outputs(library, sinks, readings, "accident")
    # Stopped from the 4th report (90 s, 95 s): tumbles [90, 120) and [120, 150) hold
    # both; vehicle 5 never makes four reports, vehicle 3 is alone.
    row = {"xway": 0, "dir": 0, "seg": 1, "pos": 100, "vehicles": 2}
    assert got == [(e * S, {**row, "window_end": e * S}) for e in (120, 150)]


def test_larceny(library: RuleSet) -> None:
    # rules/doors.csv: door 4 is the shipping exit, door 1 receiving.
    readings = [
        tag("i1", "item", "4", 0),  # nobody authorised at the exit: alarm at 5 s
        tag("i2", "item", "4", 20 * S),  # cleared by p2, 3 s later
        tag("p2", "ap", "4", 23 * S),
        tag("p1", "ap", "4", 40 * S),
        tag("i3", "item", "4", 44 * S),  # covered by p1, 4 s earlier
        tag("i4", "item", "1", 60 * S),  # receiving, not an exit: never an alarm
        tag("c1", "case", "4", 100 * S),  # a case is not an item
    ]
    got = outputs(library, ("larceny",), readings, "larceny")
    assert got == [(5 * S, {"tagid": "i1", "door": "4", "tagtime": 0, "alarm": "larceny alarm"})]


def test_larceny_forgets_the_items_persons_clear(library: RuleSet) -> None:
    # A busy exit: an item every second and an authorised person every 2 s, for 10
    # minutes. Every item is covered (a person came before it) and then cleared (the
    # next person), so none alarms, and what the door's state holds stays the size of
    # its 5 s window, however long the door is busy.
    plan = library.plan
    store = MemoryStore()
    pipeline = Pipeline(plan, store=store)
    schema = plan.streams["tag_readings"]

    def larceny_bytes() -> int:
        return sum(len(v) for k, v in store.entries.items() if k[1] == "larceny")

    sizes = []
    for minute in range(10):
        rows = []
        for second in range(minute * 60, (minute + 1) * 60):
            rows.append({"tagid": f"i{second}", "tagtype": "item", "door": "4", "ts": second * S})
            if second % 2:
                rows.append({"tagid": "p", "tagtype": "ap", "door": "4", "ts": second * S + 1})
        for seq, row in enumerate(rows, start=len(rows) * minute):
            row.update(source="exit", seq=seq)
        result = pipeline.process({"tag_readings": arrival_table(schema, rows)})
        assert not [o for o in result.outputs if o.sink == "larceny"]
        pipeline.save()
        sizes.append(larceny_bytes())
    assert sizes[-1] < 1.2 * sizes[1]


def test_missed_shipping(library: RuleSet) -> None:
    readings = [
        tag("t1", "item", "1", 0),  # door 1 receives, door 4 ships (rules/doors.csv)
        tag("t2", "item", "1", 1 * S),
        tag("t3", "case", "4", 2 * S),  # shipping only: nothing to miss
        tag("t4", "item", "2", 3 * S),  # an aisle door: neither starts nor settles
        tag("t2", "item", "1", 5 * M),  # a repeat: the 30 minutes restart
        tag("t1", "item", "4", 10 * M),  # t1 made it in time
    ]
    got = outputs(library, ("missed_shipping",), readings, "missed_shipping")
    assert got == [(35 * M, {"tagid": "t2", "last_door": "receiving"})]


def test_packing_groups(library: RuleSet) -> None:
    times = [0, 1 * S, 2500, 10 * S, 11 * S]
    readings = [tag(f"i{n}", "item", "0", t) for n, t in enumerate(times)]  # 0: packing
    readings.insert(2, tag("p", "ap", "0", 1500))  # not an item: filtered out
    readings.insert(3, tag("x", "item", "2", 2000))  # not a packing table: filtered out
    got = outputs(library, ("packing_groups",), readings, "packing_groups")
    assert [row["group_no"] for _, row in got] == [0, 0, 0, 1, 1]


def test_segment_minmax(library: RuleSet) -> None:
    minmax = next(q for q in library.plan.queries if q.sink.name == "segment_minmax").window
    assert isinstance(minmax, ExtentWindow)
    assert (minmax.range_ms, minmax.slide_ms, minmax.group_by) == (5 * M, M, ("station",))
    readings = [
        traffic(1, speed, ts) for speed, ts in [(10.0, 30 * S), (30.0, 90 * S), (20.0, 150 * S)]
    ]
    got = outputs(library, ("segment_minmax",), readings, "segment_minmax")
    # Extents [e - 5 min, e) for every whole minute e holding a reading.
    assert [(ts // M, row["max_speed"], row["min_speed"]) for ts, row in got] == [
        (1, 10.0, 10.0),
        (2, 30.0, 10.0),
        (3, 30.0, 10.0),
        (4, 30.0, 10.0),
        (5, 30.0, 10.0),
        (6, 30.0, 20.0),
        (7, 20.0, 20.0),
    ]
    assert all(row["window_end"] == ts for ts, row in got)


def test_door_day_totals(library: RuleSet) -> None:
    day = 1440 * M
    readings = [
        tag("x", "item", door, ts) for door, ts in [("A", 10), ("B", 20), ("A", 30), ("A", day + 5)]
    ]
    got = outputs(library, ("door_day_totals",), readings, "door_day_totals")
    assert got == [
        (day, {"door": "A", "window_end": day, "readings": 2}),
        (day, {"door": "B", "window_end": day, "readings": 1}),
        (2 * day, {"door": "A", "window_end": 2 * day, "readings": 1}),
    ]


def test_daily_door_counts_reset_at_midnight(library: RuleSet) -> None:
    day = 1440 * M
    readings = [
        tag("x", "item", door, ts)
        for door, ts in [
            ("A", day - 2 * S),
            ("A", day - S),
            ("B", day - 500),
            ("A", day),
            ("A", day + 5),
        ]
    ]
    got = outputs(library, ("door_days", "daily_door_counts"), readings, "daily_door_counts")
    assert [(row["door"], row["day"], row["readings"]) for _, row in got] == [
        ("A", 0, 1),
        ("A", 0, 2),
        ("B", 0, 1),
        ("A", day, 1),
        ("A", day, 2),
    ]


def test_speeding_against_the_station_registry(library: RuleSet) -> None:
    # rules/stations.csv: stations 1-20, limit 36.1 m/s. Exactly at the limit is not
    # speeding; station 99 is not in the registry, so it has no limit.
    readings = [
        traffic(1, 40.0, 1 * S, lane=2),
        traffic(1, 36.1, 2 * S),
        traffic(5, 36.2, 3 * S),
        traffic(99, 50.0, 4 * S),
    ]
    got = outputs(library, ("speeding",), readings, "speeding")
    assert got == [
        (1 * S, {"station": 1, "segment": "A1 km 002-004", "lane": 2, "ts": 1 * S,
                 "speed": 40.0, "speed_limit": 36.1}),
        (3 * S, {"station": 5, "segment": "A1 km 010-012", "lane": 1, "ts": 3 * S,
                 "speed": 36.2, "speed_limit": 36.1}),
    ]  # fmt: skip
