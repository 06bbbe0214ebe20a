"""The Flink peer benchmark: its window-count oracle against brute force, and the
subprocess wrapper with and without the Flink virtualenv (never starts Spark)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flink_peer import flink_python, flink_rates
from flink_windows import window_count
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.examples import examples


def brute_force_count(station: list[int], ts_ms: list[int], slide_ms: int, range_ms: int) -> int:
    """Every grid end from before the first reading to past the last, tried one by one."""
    count = 0
    for s in set(station):
        t = [x for k, x in zip(station, ts_ms, strict=True) if k == s]
        for end in range(0, max(t) + range_ms + slide_ms + 1, slide_ms):
            count += any(end - range_ms <= x < end for x in t)
    return count


@settings(max_examples=examples(200), deadline=None)
@given(
    readings=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 400)), min_size=1, max_size=30),
    slide_ms=st.sampled_from([1, 3, 5, 15, 30, 60]),
)
def test_window_count_is_brute_force(readings: list[tuple[int, int]], slide_ms: int) -> None:
    """Unsorted, repeated and gappy timestamps; slides dividing the 60 ms range."""
    station, ts_ms = (list(c) for c in zip(*readings, strict=True))
    got = window_count(np.array(station), np.array(ts_ms), slide_ms, 60)
    assert got == brute_force_count(station, ts_ms, slide_ms, 60)


def test_missing_flink_venv_gives_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No Flink virtualenv: no rates, and a line saying how to make one."""
    assert flink_rates("rows.parquet", [("tumble", 900)], str(tmp_path / "python")) == {}
    assert "flink_setup.sh" in capsys.readouterr().out


def test_flink_python_prefers_argument_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOKOUT_FLINK_PYTHON", "/env/python")
    assert flink_python("/arg/python") == Path("/arg/python")
    assert flink_python() == Path("/env/python")
    monkeypatch.delenv("LOOKOUT_FLINK_PYTHON")
    assert flink_python().parts[-3:] == (".flink-venv", "bin", "python")


@pytest.mark.slow
@pytest.mark.skipif(not flink_python().is_file(), reason="no Flink virtualenv (flink_setup.sh)")
def test_flink_rates_on_real_flink(tmp_path: Path) -> None:
    """A real Flink run over 20,000 readings: flink_windows.py checks each slide's windows
    against the oracle (it fails the run otherwise) and a rate comes back per label."""
    rng = random.Random(5)
    n = 20_000
    rows = pa.table({
        "station": pa.array([i % 7 + 1 for i in range(n)], pa.int32()),
        "speed": pa.array([rng.uniform(5, 35) for _ in range(n)], pa.float64()),
        "ts": pa.array([1_767_225_600_000 + i * 50 for i in range(n)], pa.timestamp("ms"))
        .cast(pa.timestamp("us", tz="UTC")),
    })  # fmt: skip
    parquet = tmp_path / "rows.parquet"
    pq.write_table(rows, parquet)
    rates = flink_rates(str(parquet), [("10 seconds", 10), ("tumble", 900)])
    assert rates.keys() == {"10 seconds", "tumble"}
    assert all(rate > 0 for rate in rates.values())
