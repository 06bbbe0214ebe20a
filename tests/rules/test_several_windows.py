"""Several OVER windows in one SELECT, from rule text, against DuckDB evaluating the
same SELECT: each aggregate over its own frame and partition (SQL:2003), on shuffled
streams with many exact ties; equal specs share one frame."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.plan import OverWindow, OverWindows
from engine.core.replay import run
from rules.language.access import DEFAULT_POLICY
from rules.language.explain import explain
from rules.language.loader import RuleCheckError, analyse, load_rules
from tests.examples import examples
from tests.rules.helpers import TRAFFIC
from tests.rules.test_rows_frames import DB, STREAM, assert_same, streams

# Aggregates any frame determines; first/last also under ROWS (RANGE peers leave
# their order open).
PEER_SAFE = {"count(*)": "count(*)", "sum(v)": "sum(v)", "min(v)": "min(v)", "avg(v)": "avg(v)"}
ORDERED = {**PEER_SAFE, "first(v)": "first_value(v)", "last(v)": "last_value(v)"}


@st.composite
def over(draw: st.DrawFn) -> tuple[str, str, str]:
    """(the rule's aggregate with OVER, DuckDB's, the frame as DuckDB spells it)."""
    partition = draw(st.sampled_from(["", "PARTITION BY k "]))
    form = draw(st.sampled_from(["rows", "rows_unbounded", "range", "range_unbounded"]))
    if form.startswith("rows"):
        n = draw(st.integers(0, 3))
        preceding = "UNBOUNDED PRECEDING" if form == "rows_unbounded" else f"{n} PRECEDING"
        rule_frame = f"ROWS {preceding}"
        sql_frame = f"ORDER BY ts, source, seq ROWS BETWEEN {preceding} AND CURRENT ROW"
        aggs = ORDERED
    else:
        t = draw(st.sampled_from([500, 1000, 2500]))
        preceding = "UNBOUNDED PRECEDING" if form == "range_unbounded" else f"{t} PRECEDING"
        spelled = "UNBOUNDED PRECEDING" if form == "range_unbounded" else f"{t} MILLISECONDS"
        rule_frame = f"RANGE {spelled}" + ("" if form == "range_unbounded" else " PRECEDING")
        sql_frame = f"ORDER BY ts RANGE BETWEEN {preceding} AND CURRENT ROW"
        aggs = PEER_SAFE
    agg = draw(st.sampled_from(list(aggs)))
    return f"{agg} OVER ({partition}{rule_frame})", aggs[agg], f"{partition}{sql_frame}"


def engine_rows(tmp_path: Path, rule: str, readings: list[dict[str, Any]]) -> list[tuple]:
    """(id, x0, x1, …) of every row of ``out``."""
    (tmp_path / "r.sql").write_text(STREAM + rule)
    plan = load_rules([tmp_path / "r.sql"]).plan
    outputs = run(plan, [("s", dict(r)) for r in readings]).outputs
    return sorted(tuple(v for k, v in o.row.items() if k != "ts") for o in outputs)


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(readings=streams(), calls=st.lists(over(), min_size=2, max_size=4))
def test_several_windows_against_duckdb(
    tmp_path: Path, readings: list[dict[str, Any]], calls: list[tuple[str, str, str]]
) -> None:
    items = ", ".join(f"{call} AS x{i}" for i, (call, _, _) in enumerate(calls))
    rule = f"CREATE STREAM out AS SELECT id, ts, {items} FROM s;\n"
    DB.execute(
        "CREATE OR REPLACE TEMP TABLE t"
        " (k INT, id INT, v DOUBLE, ts BIGINT, source VARCHAR, seq INT)"
    )
    if readings:
        DB.executemany(
            "INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)",
            [(r["k"], r["id"], r["v"], r["ts"], r["source"], r["seq"]) for r in readings],
        )
    columns = ", ".join(f"{sql} OVER ({frame}) AS x{i}" for i, (_, sql, frame) in enumerate(calls))
    want = sorted(tuple(r) for r in DB.execute(f"SELECT id, {columns} FROM t").fetchall())
    got = engine_rows(tmp_path, rule, readings)
    assert [g[0] for g in got] == [w[0] for w in want], rule
    for i in range(len(calls)):
        assert_same([(g[0], g[i + 1]) for g in got], [(w[0], w[i + 1]) for w in want])


def test_equal_windows_share_one_frame(tmp_path: Path) -> None:
    """Aggregates with one spec are one OverWindow; the evaluators are keyed by the
    partition columns every window has."""
    rule = (
        "CREATE STREAM out AS SELECT id, ts, count(*) OVER (PARTITION BY k ROWS 2 PRECEDING)"
        " AS a, sum(v) OVER (PARTITION BY k RANGE 1 SECONDS PRECEDING) AS b,"
        " max(v) OVER (PARTITION BY k ROWS 2 PRECEDING) AS c FROM s;\n"
    )
    (tmp_path / "r.sql").write_text(STREAM + rule)
    (query,) = load_rules([tmp_path / "r.sql"]).plan.queries
    assert isinstance(query.window, OverWindows)
    rows, ranged = query.window.windows
    assert isinstance(rows, OverWindow) and [c.name for c in rows.aggregates] == ["count", "max"]
    assert [c.name for c in ranged.aggregates] == ["sum"]
    assert query.key == ("k",)


def test_an_esl_shaped_aggregate_next_to_another_window_is_refused(tmp_path: Path) -> None:
    rule = (
        "CREATE AGGREGATE silence(ts TIMESTAMP) RETURNS TIMESTAMP LANGUAGE PYTHON AS "
        "'rules.udas:Silence';\n"
        "CREATE STREAM out AS SELECT id, ts, silence(ts) OVER (RANGE 1 SECONDS PRECEDING) AS a,"
        " count(*) OVER (ROWS 2 PRECEDING) AS b FROM s;\n"
    )
    (tmp_path / "r.sql").write_text(STREAM + rule)
    with pytest.raises(RuleCheckError, match="ESL-shaped aggregate 'silence' next to other"):
        load_rules([tmp_path / "r.sql"])


def test_the_docs_example(tmp_path: Path) -> None:
    """docs/rules.md's timeline: a station's last three readings, the road's last minute."""
    (tmp_path / "r.sql").write_text(
        TRAFFIC + "CREATE STREAM out AS SELECT station, ts, speed,\n"
        "  avg(speed) OVER (PARTITION BY station ROWS 2 PRECEDING) AS recent,\n"
        "  max(speed) OVER (RANGE 1 MINUTE PRECEDING) AS road_max FROM traffic;\n"
    )
    plan = load_rules([tmp_path / "r.sql"]).plan
    readings = [(0, 1, 10.0), (10, 2, 30.0), (20, 1, 20.0), (30, 1, 40.0)]
    data = [
        ("traffic", {"station": k, "lane": 1, "speed": v, "length": 4.0, "ts": t * 1000})
        for t, k, v in readings
    ]
    got = [(o.row["recent"], o.row["road_max"]) for o in run(plan, data).outputs]
    assert got == [(10.0, 10.0), (30.0, 30.0), (15.0, 30.0), (pytest.approx(70 / 3), 40.0)]


def test_explain_names_each_window(tmp_path: Path) -> None:
    rule = (
        "CREATE STREAM out AS SELECT id, ts, count(*) OVER (PARTITION BY k ROWS 2 PRECEDING)"
        " AS a, sum(v) OVER (RANGE 1 SECONDS PRECEDING) AS b,"
        " max(v) OVER (PARTITION BY k ROWS 2 PRECEDING) AS c FROM s;\n"
    )
    (tmp_path / "r.sql").write_text(STREAM + rule)
    analysis = analyse([tmp_path / "r.sql"], DEFAULT_POLICY)
    text = explain(analysis.catalog, "out")
    assert text is not None
    assert "keys: (none: one group)" in text
    assert "window of count, max: count-based window per k" in text
    assert "window of sum: time-based window" in text
