"""Physical ROWS frames, compiled from rule text, against DuckDB as an independent oracle.

A ROWS frame counts rows: ties in time are ordered by (source, seq) and a later tie is
not in an earlier row's frame (SQL:2003 ROWS, unlike RANGE, has no peers). Hypothesis
draws streams on a coarse time grid (many exact ties, both sources, NULL values) in a
shuffled arrival order within the slack; every ROWS form (``n PRECEDING``, ``UNBOUNDED
PRECEDING``, each with a row or time SLIDE, partitioned or not) runs through the
pipeline on the columnar runners and on the per-row runners, and DuckDB evaluates the
same window with ``ORDER BY ts, source, seq``.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.core.planner.runners as planner
from engine.core.replay import run
from rules.language.loader import load_rules
from tests.examples import examples

STREAM = """CREATE STREAM s (k INT, id INT, v DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 1 MINUTE SOURCE 'lookout/s';
"""
# Every aggregate is deterministic under a physical frame, first/last included.
AGGREGATES = {
    "count(*)": "count(*)",
    "count(v)": "count(v)",
    "sum(v)": "sum(v)",
    "avg(v)": "avg(v)",
    "min(v)": "min(v)",
    "max(v)": "max(v)",
    "first(v)": "first_value(v)",
    "last(v)": "last_value(v)",
}
DB = duckdb.connect()


def engine_rows(tmp_path: Path, rule: str, readings: list[dict[str, Any]]) -> list[tuple]:
    """(id, value) of every row the rule's stream ``out`` emits."""
    (tmp_path / "r.sql").write_text(STREAM + rule)
    plan = load_rules([tmp_path / "r.sql"]).plan
    outputs = run(plan, [("s", dict(r)) for r in readings]).outputs
    return sorted((o.row["id"], o.row["x"]) for o in outputs if o.sink == "out")


def oracle_rows(
    readings: list[dict[str, Any]], agg: str, frame: str, partition: str, qualify: str
) -> list[tuple]:
    """(id, value) of the same window in DuckDB."""
    DB.execute(
        "CREATE OR REPLACE TEMP TABLE t"
        " (k INT, id INT, v DOUBLE, ts BIGINT, source VARCHAR, seq INT)"
    )
    if readings:
        DB.executemany(
            "INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)",
            [(r["k"], r["id"], r["v"], r["ts"], r["source"], r["seq"]) for r in readings],
        )
    window = f"{partition} ORDER BY ts, source, seq {frame}"
    query = f"SELECT id, {AGGREGATES[agg]} OVER ({window}) AS x FROM t {qualify}"
    return sorted(tuple(r) for r in DB.execute(query).fetchall())


def assert_same(got: list[tuple], want: list[tuple]) -> None:
    """Same rows; values equal up to the float round-off of delta maintenance."""
    assert [g[0] for g in got] == [w[0] for w in want], (got, want)
    for (_, g), (_, w) in zip(got, want, strict=True):
        if g is None or w is None:
            assert g is None and w is None, (g, w)
        elif isinstance(g, float) or isinstance(w, float):
            assert math.isclose(g, w, abs_tol=1e-9), (g, w)
        else:
            assert g == w


reading = st.tuples(
    st.integers(0, 12).map(lambda n: n * 500),  # a coarse grid: many exact ties
    st.sampled_from(["a", "b"]),
    st.integers(1, 2),
    st.one_of(st.none(), st.sampled_from([0.5, 2.0, 3.0, 7.25])),
)


@st.composite
def streams(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Readings with unique ids and seqs, in a shuffled arrival order (the slack covers
    the whole stream, so every one is on time)."""
    items = draw(st.lists(reading, max_size=30))
    readings = [
        {"k": k, "id": i, "v": v, "ts": 1_000_000 + ts, "source": src, "seq": i}
        for i, (ts, src, k, v) in enumerate(items)
    ]
    random.Random(draw(st.integers(0, 999))).shuffle(readings)
    return readings


@pytest.fixture(params=["columnar", "per-row"])
def runner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run every test on both runners: the columnar one where eligible, and every stage
    forced onto the per-row runner."""
    if request.param == "per-row":
        monkeypatch.setattr(planner, "columnar", lambda stage: False)
    return request.param


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    readings=streams(),
    agg=st.sampled_from(list(AGGREGATES)),
    size=st.one_of(st.none(), st.integers(0, 4)),
    slide=st.sampled_from(["", "rows", "time"]),
    slide_size=st.integers(1, 3),
    partitioned=st.booleans(),
)
def test_rows_frames_against_duckdb(
    tmp_path: Path,
    runner: str,
    readings: list[dict[str, Any]],
    agg: str,
    size: int | None,
    slide: str,
    slide_size: int,
    partitioned: bool,
) -> None:
    preceding = "UNBOUNDED PRECEDING" if size is None else f"{size} PRECEDING"
    partition = "PARTITION BY k" if partitioned else ""
    over = f"{partition} ROWS {preceding}"
    by = "k" if partitioned else "1"
    qualify = ""
    if slide == "rows":
        # ESL's row slide keeps the n-th, 2n-th, ... row of the partition.
        over += f" SLIDE {slide_size}"
        qualify = (
            f"QUALIFY row_number() OVER (PARTITION BY {by} ORDER BY ts, source, seq)"
            f" % {slide_size} = 0"
        )
    elif slide == "time":
        # A time slide keeps the last row of each slot [j*d, (j+1)*d).
        over += f" SLIDE {slide_size} SECONDS"
        qualify = (
            f"QUALIFY row_number() OVER (PARTITION BY {by}, ts // {slide_size * 1000}"
            " ORDER BY ts DESC, source DESC, seq DESC) = 1"
        )
    rule = f"CREATE STREAM out AS SELECT id, ts, {agg} OVER ({over}) AS x FROM s;\n"
    frame = f"ROWS BETWEEN {preceding} AND CURRENT ROW"
    want = oracle_rows(readings, agg, frame, partition, qualify)
    assert_same(engine_rows(tmp_path, rule, readings), want)


def test_a_later_tie_is_not_in_an_unbounded_rows_frame(tmp_path: Path, runner: str) -> None:
    """a at 1 s, b and c at 2 s (one source): b's frame is a and b, not c."""
    readings = [
        {"k": 1, "id": i, "v": 1.0, "ts": ts, "source": "p", "seq": i}
        for i, ts in enumerate([1000, 2000, 2000], start=1)
    ]
    rule = (
        "CREATE STREAM out AS SELECT id, ts, count(*) OVER (ROWS UNBOUNDED PRECEDING) AS x "
        "FROM s;\n"
    )
    assert engine_rows(tmp_path, rule, readings) == [(1, 1), (2, 2), (3, 3)]
    ranged = rule.replace("ROWS", "RANGE")
    assert engine_rows(tmp_path, ranged, readings) == [(1, 1), (2, 3), (3, 3)]


@pytest.mark.parametrize(
    ("frame", "counts"),
    [
        ("ROWS UNBOUNDED PRECEDING", [1, 2, 3]),
        ("ROWS 1 PRECEDING", [1, 2, 2]),
        ("RANGE UNBOUNDED PRECEDING", [1, 3, 3]),
        ("RANGE 1 SECONDS PRECEDING", [1, 3, 3]),
    ],
)
@pytest.mark.parametrize("arrival", ["in order", "ties reversed"])
def test_the_docs_tie_table(
    tmp_path: Path, runner: str, frame: str, counts: list[int], arrival: str
) -> None:
    """docs/rules.md's table: a at 1 s, b and c at 2 s (one source, seq 1, 2, 3). c's
    ROWS 1 PRECEDING frame is b and c (2), whatever order b and c arrive in; a RANGE
    frame holds both peers (3)."""
    readings = [
        {"k": 1, "id": i, "v": 1.0, "ts": ts, "source": "p", "seq": i}
        for i, ts in enumerate([1000, 2000, 2000], start=1)
    ]
    if arrival == "ties reversed":
        readings = [readings[0], readings[2], readings[1]]
    rule = f"CREATE STREAM out AS SELECT id, ts, count(*) OVER ({frame}) AS x FROM s;\n"
    assert engine_rows(tmp_path, rule, readings) == list(zip([1, 2, 3], counts, strict=True))


def test_ties_of_two_sources_follow_the_source_order(tmp_path: Path, runner: str) -> None:
    """Two readings at one instant: source 'a' comes before 'b' whatever their seqs and
    arrival, so a's ROWS 1 PRECEDING frame is a alone and b's starts at a."""
    readings = [
        {"k": 1, "id": 1, "v": 2.0, "ts": 5000, "source": "b", "seq": 1},
        {"k": 1, "id": 2, "v": 3.0, "ts": 5000, "source": "a", "seq": 9},
    ]
    rule = "CREATE STREAM out AS SELECT id, ts, first(v) OVER (ROWS 1 PRECEDING) AS x FROM s;\n"
    assert engine_rows(tmp_path, rule, readings) == [(1, 3.0), (2, 3.0)]
