"""Disorder and fault statistics, measured on the produced file, match the chosen model."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from pathlib import Path

import pytest

from simulators.disorder import DisorderModel, Faults, arrange, messages
from simulators.publish import replay_messages
from simulators.traffic import TrafficConfig, generate_traffic, traffic_sources
from simulators.truth import Truth
from tests.simulators.helpers import lateness, load, simulate, truth_of

RUN = ("traffic", "--rate", "500", "--duration", "120", "--profile", "flat")


def _within(observed: int, n: int, p: float) -> bool:
    """Observed count within 5 binomial standard deviations of n * p."""
    return abs(observed - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1


def test_none_is_in_order(tmp_path: Path) -> None:
    readings, bad = load(simulate(tmp_path, *RUN)[0])
    assert not bad and len(readings) > 50_000
    ts = [r["ts"] for r in readings]
    assert ts == sorted(ts)


@pytest.mark.parametrize("bound", [0.5, 3.0])
def test_bounded_disorder(tmp_path: Path, bound: float) -> None:
    readings, _ = load(simulate(tmp_path, *RUN, "--disorder", f"bounded:{bound}")[0])
    late = lateness(readings)
    d = round(bound * 1000)
    assert max(late) <= d
    assert max(late) >= 0.9 * d  # the bound is reached, not just respected
    # With uniform delays on [0, D] the lateness behind the newest reading is
    # D - (a uniform maximum) spread over [0, D]: a large share is out of order.
    out_of_order = sum(1 for x in late if x > 0) / len(late)
    assert out_of_order > 0.5
    assert 0.2 * d < sum(late) / len(late) < 0.6 * d


def test_block_sorted_disorder(tmp_path: Path) -> None:
    size = 10_000
    readings, _ = load(simulate(tmp_path, *RUN, "--disorder", "blocks:10")[0])
    blocks = [r["ts"] // size for r in readings]
    # Ascending blocks, each sent whole (WID Figure 7) ...
    assert blocks == sorted(blocks)
    # ... and shuffled inside: about half of consecutive pairs inside a block are inverted.
    pairs = [
        (a["ts"], b["ts"])
        for a, b in itertools.pairwise(readings)
        if a["ts"] // size == b["ts"] // size
    ]
    inverted = sum(1 for a, b in pairs if a > b) / len(pairs)
    assert 0.45 < inverted < 0.55
    assert max(lateness(readings)) > 0.9 * size


@pytest.mark.parametrize("model", ["none", "bounded:1", "blocks:5"])
def test_late_readings_are_exactly_the_planted_ones(tmp_path: Path, model: str) -> None:
    out, truth = simulate(
        tmp_path, *RUN, "--disorder", model, "--late-fraction", "0.02", "--slack", "5"
    )
    readings, _ = load(out)
    late = {
        (r["source"], r["seq"])
        for r, x in zip(readings, lateness(readings), strict=True)
        if x > 5000
    }
    planted = {(r["source"], r["seq"]) for r in truth_of(truth, "late")}
    assert late == planted
    assert _within(len(planted), len(readings), 0.02)


def test_duplicates_and_malformed(tmp_path: Path) -> None:
    out, truth = simulate(
        tmp_path, *RUN, "--duplicate-fraction", "0.03", "--malformed-fraction", "0.02"
    )
    readings, bad = load(out)
    counts = Counter((r["source"], r["seq"]) for r in readings)
    dups = {k for k, n in counts.items() if n > 1}
    assert all(n <= 2 for n in counts.values())
    assert dups == {(r["source"], r["seq"]) for r in truth_of(truth, "duplicate")}
    malformed = truth_of(truth, "malformed")
    assert len(bad) == len(malformed)
    # Every seq of every source is either received intact or named as malformed.
    lost = {(r["source"], r["seq"]) for r in malformed}
    for source in {s for s, _ in counts}:
        seqs = {q for s, q in counts if s == source} | {q for s, q in lost if s == source}
        assert seqs == set(range(max(seqs) + 1))
    assert not lost & set(counts)
    n = len(counts) + len(lost)
    assert _within(len(dups), n, 0.03)
    assert _within(len(lost), n, 0.02)
    assert {r["reason"] for r in malformed} == {
        "truncated",
        "missing_field",
        "bad_timestamp",
        "not_utf8",
    }


def test_clock_skew_per_source(tmp_path: Path) -> None:
    out, truth = simulate(tmp_path, *RUN, "--skew", "2", "--duration", "30")
    skews = {r["source"]: r["skew_ms"] for r in truth_of(truth, "skew")}
    assert len(skews) >= 9 and all(abs(s) <= 2000 for s in skews.values())
    readings, _ = load(out)
    # Arrival order is true time; a source's ts is shifted by its skew, so per source the
    # ts stay ordered, and across sources the lateness is bounded by the skew spread.
    for source, skew in skews.items():
        ts = [r["ts"] for r in readings if r["source"] == source]
        assert ts == sorted(ts)
        assert ts[0] >= 1767225600000 + skew
    assert max(lateness(readings)) <= max(skews.values()) - min(skews.values())


class _Recorder(Truth):
    """Ground truth kept in memory: the (source, seq) of the late readings."""

    def __init__(self) -> None:
        super().__init__(None)
        self.late: set[tuple[str, int]] = set()

    def record(self, rec: dict) -> None:
        super().record(rec)
        if rec["type"] == "late":
            self.late.add((rec["source"], rec["seq"]))


@pytest.mark.parametrize("model", ["none", "bounded:2", "blocks:5"])
def test_heartbeats_keep_their_promise(model: str) -> None:
    cfg = TrafficConfig(stations=4, rate=300, profile="flat")
    truth = _Recorder()
    start = 1_767_225_600_000
    msgs = list(
        messages(
            arrange(
                generate_traffic(cfg, start, start + 60_000, random.Random(1), truth),
                DisorderModel.parse(model),
                Faults(late=0.01, duplicate=0.01, skew_ms=500),
                traffic_sources(cfg),
                random.Random(2),
                truth,
                "ms",
                1000,
                start,
            )
        )
    )
    arrivals = [m[0] for m in msgs]
    assert arrivals == sorted(arrivals)
    promise: dict[str, int] = {}
    seen: set[tuple[str, int]] = set()
    hb = 0
    for _, kind, topic, payload in msgs:
        if kind == "heartbeat":
            hb += 1
            assert topic == f"lookout/traffic/{payload['source']}/heartbeat"
            assert payload["ts"] >= promise.get(payload["source"], 0)  # never goes back
            promise[payload["source"]] = payload["ts"]
            continue
        key = (payload["source"], payload["seq"])
        again = key in seen
        seen.add(key)
        if key in truth.late:
            continue
        if not again and payload["ts"] < promise.get(payload["source"], 0):
            pytest.fail(f"{key} breaks its source's heartbeat (late ones excepted)")
    assert hb >= 4 * 60
    # The last heartbeat of each source is the end of the run.
    assert all(p >= start + 59_000 - 500 for p in promise.values())


def test_replay_heartbeats_keep_their_promise(tmp_path: Path) -> None:
    out, _ = simulate(
        tmp_path,
        *RUN,
        "--disorder",
        "bounded:1",
        "--duration",
        "30",
        "--malformed-fraction",
        "0.01",
    )
    with out.open("rb") as fh:
        msgs = list(replay_messages(fh, "lookout/traffic/x/readings", heartbeat_lag_ms=1000))
    kinds = Counter(m[1] for m in msgs)
    assert kinds["reading"] + kinds["malformed"] == len(out.read_bytes().splitlines())
    assert kinds["heartbeat"] >= 10 * 29
    promise: dict[str, int] = {}
    for _, kind, topic, payload in msgs:
        if kind == "heartbeat":
            assert topic == f"lookout/traffic/{payload['source']}/heartbeat"
            promise[payload["source"]] = payload["ts"]
        elif kind == "reading" and "source" in payload:
            assert payload["ts"] >= promise.get(payload["source"], 0)


def test_late_readings_of_a_sparse_stream_are_late(tmp_path: Path) -> None:
    # At 5 readings/s a reading delayed by slack + U(1, 10) s often had nothing newer
    # than slack ahead of it when it arrived, so it was not late though the truth said
    # so; a late reading now waits for one.
    out, truth = simulate(
        tmp_path,
        "rfid",
        "--rate",
        "5",
        "--duration",
        "1800",
        "--disorder",
        "bounded:1",
        "--late-fraction",
        "0.02",
        "--slack",
        "2",
        "--no-heartbeats",
    )
    readings, _ = load(out)
    late = {
        (r["source"], r["seq"])
        for r, x in zip(readings, lateness(readings), strict=True)
        if x > 2000
    }
    planted = {(r["source"], r["seq"]) for r in truth_of(truth, "late")}
    assert late == planted
    assert len(planted) > 50
