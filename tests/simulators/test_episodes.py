"""The ground truth names exactly the episodes planted, and the readings show them."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import pytest

from simulators.traffic import FREE_FLOW_MIN, SPEED_LIMIT
from tests.simulators.helpers import load, simulate, truth_of

START = 1_767_225_600_000  # the --out default start, 2026-01-01T00:00:00Z


def test_traffic_episodes(tmp_path: Path) -> None:
    out, truth = simulate(
        tmp_path,
        "traffic",
        "--rate",
        "200",
        "--duration",
        "1200",
        "--stations",
        "10",
        "--congestion",
        "3,7@300+600",
        "--silent",
        "2:3@100+200,9@600+60",
        "--accident",
        "5@400+300",
        "--speeding",
        "4@0+600",
    )
    eps = [
        (e["kind"], e["station"], e["start"] - START, e["end"] and e["end"] - START)
        for e in truth_of(truth, "episode")
    ]
    assert sorted(eps) == sorted(
        [
            ("congestion", 3, 0, None),
            ("congestion", 7, 300_000, 900_000),
            ("silent_detector", 2, 100_000, 300_000),
            ("silent_detector", 9, 600_000, 660_000),
            ("accident", 5, 400_000, 700_000),
            ("speeding", 4, 0, 600_000),
        ]
    )
    readings, bad = load(out)
    assert not bad
    loops = [r for r in readings if "station" in r]
    # Congestion: well under 15 m/s on average where planted, well over it elsewhere.
    speeds: dict[tuple[int, bool], list[float]] = defaultdict(list)
    for r in loops:
        off = r["ts"] - START
        hot = (
            r["station"] == 3
            or (r["station"] == 7 and 300_000 <= off < 900_000)
            or (r["station"] == 5 and 400_000 <= off < 700_000)
        )
        speeds[r["station"], hot].append(r["speed"])
    for (station, hot), v in speeds.items():
        avg = sum(v) / len(v)
        assert (avg < 10) if hot else (avg > 25), (station, hot, avg)
    # Normal traffic never reads below 16.5 m/s: no window of it can average under 15.
    normal = [r["speed"] for r in loops if r["station"] in (1, 2, 4, 6, 8, 9, 10)]
    assert min(normal) >= FREE_FLOW_MIN
    # Silent detectors: nothing from them while silent, readings before and after.
    for station, lane, a, b in ((2, 3, 100_000, 300_000), (9, None, 600_000, 660_000)):
        hit = [
            r["ts"] - START for r in loops if r["station"] == station and lane in (None, r["lane"])
        ]
        assert not [t for t in hit if a <= t < b]
        assert any(t < a for t in hit) and any(t >= b for t in hit)
    # Speeding: exactly the readings in the truth are over the limit.
    over = {(r["source"], r["seq"]) for r in loops if r["speed"] > SPEED_LIMIT}
    planted = {(s["source"], s["seq"]) for s in truth_of(truth, "speeding")}
    assert over == planted and len(planted) > 10
    assert all(
        r["station"] == 4 and r["ts"] - START < 600_000
        for r in loops
        if (r["source"], r["seq"]) in over
    )
    # Accident: both vehicles report every 30 s and stand still at the same position;
    # the 20 tracked vehicles keep moving (slower past the accident).
    reports = [r for r in readings if "vid" in r]
    crashed = {1_000_000, 1_000_001}
    assert crashed < {r["vid"] for r in reports}
    stopped = [r for r in reports if r["speed"] == 0]
    assert {r["vid"] for r in stopped} == crashed
    assert {(r["seg"], r["pos"]) for r in stopped} == {(5, 5 * 1609 + 500)}
    assert len(stopped) == 2 * 10  # 300 s / 30 s, both vehicles
    assert all(400_000 <= r["ts"] - START < 700_000 for r in stopped)
    last: dict[int, int] = {}
    for r in reports:
        if r["vid"] not in crashed:
            assert last.get(r["vid"]) != r["pos"]
            last[r["vid"]] = r["pos"]
    slowed = {r["vid"] for r in reports if r["vid"] not in crashed and r["speed"] == 8.0}
    assert slowed and all(
        r["seg"] == 5 for r in reports if r["vid"] in slowed and r["speed"] == 8.0
    )
    assert len(reports) > 20 * 1200 / 30


@pytest.mark.slow
def test_rfid_episodes(tmp_path: Path) -> None:
    window, gap = 5000, 2000
    out, truth = simulate(
        tmp_path,
        "rfid",
        "--rate",
        "60",
        "--duration",
        "1800",
        "--doors",
        "4",
        "--packing",
        "2",
        "--theft",
        "3",
        "--authorised-exit",
        "2",
        "--missing",
        "2",
    )
    eps = truth_of(truth, "episode")
    kinds = defaultdict(int)
    for e in eps:
        kinds[e["kind"]] += 1
    assert kinds["theft"] == 3 and kinds["authorised_exit"] == 2 and kinds["missing_item"] == 2
    assert 4 <= kinds["packing_group"] <= 6  # 2 episodes of 2-3 groups
    assert set(kinds) == {"theft", "authorised_exit", "missing_item", "packing_group"}
    readings, bad = load(out)
    assert not bad
    exit_reads = [r for r in readings if r["door"] == 4]
    aps = sorted(r["ts"] for r in exit_reads if r["tagtype"] == "ap")

    def ap_near(t: int) -> bool:
        return any(abs(a - t) <= window for a in aps)

    # ESL example 18: exactly the planted thefts have no ap within the window.
    thefts = {e["tagid"] for e in eps if e["kind"] == "theft"}
    unguarded = {r["tagid"] for r in exit_reads if r["tagtype"] == "item" and not ap_near(r["ts"])}
    assert unguarded == thefts
    authorised = {e["tagid"] for e in eps if e["kind"] == "authorised_exit"}
    assert authorised <= {r["tagid"] for r in exit_reads}
    # ESL example 17: gaps inside a group are under t1, between groups over it.
    table = [r for r in readings if r["door"] == 0]
    groups, current = [], [table[0]]
    for a, b in itertools.pairwise(table):
        if b["ts"] - a["ts"] > gap:
            groups.append(current)
            current = []
        current.append(b)
    groups.append(current)
    planted = [e["tagids"] for e in eps if e["kind"] == "packing_group"]
    assert [[r["tagid"] for r in g] for g in groups] == planted
    # Missing items: seen up to last_door, never at a later door.
    doors_of = defaultdict(set)
    for r in readings:
        doors_of[r["tagid"]].add(r["door"])
    for e in eps:
        if e["kind"] == "missing_item":
            assert doors_of[e["tagid"]] == set(range(1, e["last_door"] + 1))


def test_rfid_in_order_with_authorised_exits(tmp_path: Path) -> None:
    # An authorised exit's badge is read up to 2 s before its item; it used to be sent
    # after newer readings, so `--disorder none` was not in order (and with heartbeats
    # or a slack under 2 s the badge went late and the exit raised a larceny alarm).
    out, truth = simulate(
        tmp_path, "rfid", "--rate", "20", "--duration", "1800", "--authorised-exit", "6"
    )
    readings, bad = load(out)
    assert not bad
    ts = [r["ts"] for r in readings]
    assert ts == sorted(ts)
    assert len(truth_of(truth, "episode")) >= 6 + 1 + 1 + 2
