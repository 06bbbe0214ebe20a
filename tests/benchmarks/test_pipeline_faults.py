"""The fault benchmark's figures from its samples: counters across engine restarts,
batch phases and CPU shares per span, latency per period and each fault's recovery,
checked against the definitions computed the plain way (never starts a process)."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pipeline_faults import (
    RECOVERED_FOR_S,
    by_period,
    increase,
    per_second,
    percentile,
    phase_totals,
    profile,
    recovery,
)

COUNT = "lookout_engine_batch_seconds_count"
SUM = "lookout_engine_batch_seconds_sum"


def sample(t: float, metrics: dict[str, float] | None, **counters: dict[str, float]) -> dict:
    """A sampler's sample at `t`: batch-phase metrics (phase → [count, seconds]; None:
    the engine did not answer) and counters such as `cpu_s`."""
    scraped: dict[Any, float] = {}
    for phase, (count, seconds) in (metrics or {}).items():
        scraped[(COUNT, (("phase", phase),))] = count
        scraped[(SUM, (("phase", phase),))] = seconds
    return {"t": t, "metrics": scraped, **counters}


def grown(values: list[float | None]) -> float:
    """A counter's growth from its readings (None: no answer): each step up counts, a
    step down is a restart that counted from zero, the first reading is the base."""
    seen = [v for v in values if v is not None]
    return sum(b - a if b >= a else b for a, b in itertools.pairwise(seen))


readings = st.lists(st.one_of(st.none(), st.integers(0, 50).map(float)), max_size=12)


@given(readings)
def test_increase_counts_growth_across_restarts_and_silent_scrapes(values: list[float | None]):
    samples = [
        sample(i, None if v is None else {"evaluate": (v, 0.0)}) for i, v in enumerate(values)
    ]
    assert increase(samples, COUNT, phase="evaluate") == grown(values)


def test_increase_leaves_out_what_the_counter_held_at_the_first_sample():
    samples = [sample(0, {"evaluate": (40, 9.0)}), sample(5, {"evaluate": (43, 9.6)})]
    assert increase(samples, COUNT, phase="evaluate") == 3


def test_phase_totals_are_each_phases_batches_and_seconds_and_skip_idle_phases():
    samples = [
        sample(0, {"evaluate": (10, 2.0), "save": (10, 1.0), "restore": (1, 4.0)}),
        sample(5, {"evaluate": (14, 2.8), "save": (14, 1.6), "restore": (2, 8.0)}),
        sample(10, {"evaluate": (2, 0.5), "save": (2, 0.2), "restore": (1, 3.0)}),  # restart
    ]
    totals = phase_totals(samples)
    assert set(totals) == {"evaluate", "save", "restore"}
    assert totals["evaluate"] == (6, 2.8 - 2.0 + 0.5)
    assert totals["save"] == (6, 1.6 - 1.0 + 0.2)
    assert totals["restore"] == (2, 4.0 + 3.0)  # one rebuild before the restart, one after
    assert phase_totals(samples[:2])["evaluate"] == (4, 2.8 - 2.0)
    assert "restore" not in phase_totals([samples[0], samples[0]])  # no batch ran


def test_per_second_is_each_counters_rate_between_two_samples():
    first = sample(10, None, cpu_s={"engine": 100.0, "ingest": 5.0})
    last = sample(40, None, cpu_s={"engine": 145.0, "ingest": 8.0, "new": 1.0})
    assert per_second(first, last, "cpu_s", 2) == {"engine": 1.5, "ingest": 0.1}
    assert per_second(last, last, "cpu_s", 2) == {}


def test_percentile_is_the_nearest_rank_of_the_sorted_values():
    values = [float(v) for v in range(100, 0, -1)]  # 100 .. 1
    assert percentile(values, 0.5) == 51.0  # rank round(0.5 * 99) = 50 (of 0..99)
    assert percentile(values, 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0


# Wall times in sixteenths of a second: exact in binary, so a span's edge is unambiguous.
timed_alerts = st.lists(
    st.tuples(
        st.integers(0, 300 * 16).map(lambda n: n / 16), st.sampled_from([1.0, 3.5, 4.0, 4.5])
    ),
    max_size=60,
)


@given(timed_alerts, st.sampled_from([10.0, 30.0, 60.0]))
def test_by_period_puts_each_alert_in_the_span_of_its_wall_time(timed, period_s):
    since = 1_000.0
    rows = by_period([(since + at, v) for at, v in timed], since, period_s)
    assert sum(row["alerts"] for row in rows) == len(timed)
    for row in rows:
        inside = [v for at, v in timed if row["from_s"] <= at < row["from_s"] + period_s]
        assert row["alerts"] == len(inside)
        assert row["p50_s"] == percentile(inside, 0.5)
        assert row["p99_s"] == percentile(inside, 0.99)


def test_profile_spans_carry_latency_phases_and_cores_from_the_sample_before_them():
    published_at = 100.0
    # Every 10 s: 10 batches of 0.2 s evaluating, the engine on 1 core; but between 120 s
    # and 130 s, the edge of the first span of 30 s, batches of 0.5 s on 2 cores.
    seconds, cpu = [0.0, 2.0, 4.0, 9.0, 11.0, 13.0], [0.0, 10.0, 20.0, 40.0, 50.0, 60.0]
    samples = [
        sample(published_at + 10 * i, {"evaluate": (10 * i, seconds[i])},
               cpu_s={"engine": cpu[i]}, stalled_s={"cpu": cpu[i] / 4})
        for i in range(6)
    ]  # fmt: skip
    timed = [(2_000.0 + 3, 2.5), (2_000.0 + 4, 3.5), (2_000.0 + 40, 3.0)]
    spans = profile(timed, 2_000.0, samples, published_at, 30.0)
    assert [s["from_s"] for s in spans] == [0, 30]
    first, second = spans
    assert (first["alerts"], first["p50_s"], first["p99_s"]) == (2, 2.5, 3.5)
    assert (second["alerts"], second["p50_s"]) == (1, 3.0)
    assert first["batch_phases_s"] == {"evaluate": 0.2}
    # The second span starts from the first's last sample: what ran between them counts.
    assert second["batch_phases_s"] == {"evaluate": 0.3}
    assert first["cores"] == {"engine": 1.0}
    assert second["cores"] == {"engine": round(40 / 30, 2)}
    assert second["stalled"] == {"cpu": round(10 / 30, 3)}


def brute_recovery(fault_at: float, timed: list[tuple[float, float]], on_time_s: float):
    """From the definition: the first alert at or after the fault such that every alert
    in the next RECOVERED_FOR_S is on time, the run lasting that long after it."""
    last = max((t for t, _ in timed), default=None)
    for t, _ in sorted(timed):
        if t < fault_at or last is None or last < t + RECOVERED_FOR_S:
            continue
        if all(v <= on_time_s for u, v in timed if t <= u <= t + RECOVERED_FOR_S):
            return t - fault_at
    return None


@given(timed_alerts, st.floats(0, 300, allow_nan=False))
def test_recovery_is_the_first_alert_after_which_alerts_stay_on_time(timed, fault_at):
    since = 1_000.0
    shifted = [(since + at, v) for at, v in timed]
    (found,) = recovery([("engine", since + fault_at)], shifted, 4.0, since)
    back = brute_recovery(since + fault_at, shifted, 4.0)
    assert found["on_time_after_s"] == (None if back is None else round(back, 1))
    until = None if back is None else since + fault_at + back
    before = [v for at, v in shifted if since + fault_at <= at and (until is None or at < until)]
    assert found["worst_latency_s"] == (round(max(before), 2) if before else None)
