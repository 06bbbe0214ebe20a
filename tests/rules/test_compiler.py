"""The compiler's output: the congestion plan the engine accepts, and expression
closures with SQL NULL semantics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.core.evaluator import KeyedEvaluator
from engine.core.plan import (
    DEFAULT_SOURCE_IDLE_MS,
    ColumnType,
    Filter,
    FrameUnits,
    OverWindow,
    Project,
    SinkKind,
)
from rules.language import ast
from rules.language.compiler import compile_expr
from rules.language.loader import RULES_DIR, load_rules
from rules.language.parser import parse_text
from tests.rules.helpers import TRAFFIC


def test_congestion_plan() -> None:
    plan = load_rules([RULES_DIR / "traffic.sql"]).plan
    traffic = plan.streams["traffic"]
    assert (traffic.timestamp, traffic.slack_ms, traffic.topic) == (
        "ts",
        2000,
        "lookout/traffic/+/readings",
    )
    assert [(c.name, c.type) for c in traffic.columns] == [
        ("station", ColumnType.INT),
        ("lane", ColumnType.INT),
        ("speed", ColumnType.DOUBLE),
        ("length", ColumnType.DOUBLE),
        ("ts", ColumnType.TIMESTAMP),
    ]
    speed_schema = plan.streams["station_speed"]
    assert speed_schema.timestamp == "ts" and speed_schema.topic is None
    assert [(c.name, c.type) for c in speed_schema.columns] == [
        ("station", ColumnType.INT),
        ("ts", ColumnType.TIMESTAMP),
        ("avg_speed", ColumnType.DOUBLE),
    ]

    queries = {q.sink.name: q for q in plan.queries}
    speed = queries["station_speed"]
    assert (speed.input, speed.sink.kind, speed.pre) == ("traffic", SinkKind.STREAM, ())
    window = speed.window
    assert isinstance(window, OverWindow)
    assert (
        window.units,
        window.preceding,
        window.partition_by,
        window.slide_ms,
        window.slide_rows,
        window.active_expiration,
        window.lag,
    ) == (FrameUnits.RANGE, 900_000, ("station",), 60_000, None, False, 0)
    (avg,) = window.aggregates
    # Aggregates travel under internal aliases so they never shadow an input column.
    assert (avg.name, avg.alias, avg.factory) == ("avg", "__agg0", None)
    assert avg.args[0]({"speed": 12.5}) == 12.5
    (project,) = speed.post
    assert isinstance(project, Project)
    row = {"station": 4, "ts": 60_000, "speed": 3.0, avg.alias: 14.0}
    assert {n: f(row) for n, f in project.columns} == {
        "station": 4,
        "ts": 60_000,
        "avg_speed": 14.0,
    }

    assert plan.streams["congestion"].timestamp == "ts"  # alerts have a schema too
    assert {s.name for s in plan.sources()} == {"traffic", "positions"}
    congestion = queries["congestion"]
    assert (congestion.input, congestion.sink.kind, congestion.window) == (
        "station_speed",
        SinkKind.ALERT,
        None,
    )
    (where,) = congestion.pre
    assert isinstance(where, Filter)
    assert where.predicate({"avg_speed": 14.9}) is True
    assert where.predicate({"avg_speed": 15.0}) is False
    assert where.predicate({"avg_speed": None}) is None

    # The engine accepts the plan: stages cut, and an evaluator per stage builds.
    stages = {s.name: s for s in plan.stages()}
    assert [q.sink.name for q in stages["station_speed"].downstream] == ["congestion"]
    assert stages["station_speed"].key == ("station",)
    KeyedEvaluator(stages["station_speed"])


def _expr(text: str) -> ast.Expr:
    statements, errors = parse_text(f"CREATE STREAM e AS SELECT {text} AS v FROM s;")
    assert errors == []
    expr = statements[0].query.selects[0].items[0].expr
    assert expr is not None
    return expr


@pytest.mark.parametrize(
    ("text", "row", "value"),
    [
        ("a + b * 2", {"a": 1, "b": 3}, 7),
        ("a / b", {"a": 7, "b": 2}, 3.5),
        ("a / b", {"a": 7, "b": 0}, None),
        ("a % b", {"a": -7, "b": 3}, -1),
        ("-a", {"a": 2}, -2),
        # Integer results beyond BIGINT's 64 bits are NULL, like division by zero.
        ("a * a", {"a": 3_037_000_500}, None),
        ("a * a", {"a": 3_037_000_499}, 3_037_000_499**2),
        ("a + 1", {"a": 2**63 - 1}, None),
        ("a - 1", {"a": -(2**63)}, None),
        ("-a", {"a": -(2**63)}, None),
        ("abs(a)", {"a": -(2**63)}, None),
        ("a * 2.0", {"a": 2**62}, 2.0**63),
        ("a + b", {"a": 1, "b": None}, None),
        ("a > 1 AND b > 1", {"a": 0, "b": None}, False),
        ("a > 1 AND b > 1", {"a": 2, "b": None}, None),
        ("a > 1 OR b > 1", {"a": 2, "b": None}, True),
        ("a > 1 OR b > 1", {"a": 0, "b": None}, None),
        ("NOT a = 1", {"a": 1}, False),
        ("NOT a = 1", {"a": None}, None),
        ("a IS NULL", {"a": None}, True),
        ("a IS NOT NULL", {"a": None}, False),
        ("a IN (1, 2)", {"a": 2}, True),
        ("a NOT IN (1, 2)", {"a": 3}, True),
        ("a IN (1, NULL)", {"a": 3}, None),
        ("CASE WHEN a > 10 THEN 'fast' WHEN a > 5 THEN 'ok' ELSE 'slow' END", {"a": 7}, "ok"),
        ("CASE WHEN a > 10 THEN 'fast' END", {"a": 7}, None),
        ("ts - INTERVAL 1 MINUTE", {"ts": 120_000}, 60_000),
        ("ts > TIMESTAMP '1970-01-01T00:01:00Z'", {"ts": 60_001}, True),
        ("coalesce(a, b, 3)", {"a": None, "b": None}, 3),
        ("round(abs(a), 1)", {"a": -2.26}, 2.3),
        ("upper(concat(s, '-', a))", {"s": "ab", "a": 1}, "AB-1"),
        ("greatest(a, b)", {"a": 1, "b": 4}, 4),
        ("time_bucket(INTERVAL 1 MINUTE, ts)", {"ts": 150_000}, 120_000),
        ("'it''s'", {}, "it's"),
    ],
)
def test_expression_closures(text: str, row: dict[str, Any], value: Any) -> None:
    assert compile_expr(_expr(text))(row) == value


@pytest.mark.parametrize(
    ("clause", "idle_ms"),
    [
        ("", None),
        (" PER SOURCE", DEFAULT_SOURCE_IDLE_MS),
        (" PER SOURCE IDLE 30 SECONDS", 30_000),
        (" per source idle 2 minutes", 120_000),
    ],
)
def test_per_source_clocks_reach_the_plan(tmp_path: Path, clause: str, idle_ms: int | None) -> None:
    path = tmp_path / "s.sql"
    path.write_text(
        "CREATE STREAM s (station INT, ts TIMESTAMP)\n"
        f"  ORDER BY ts SLACK 2 SECONDS{clause} SOURCE 'lookout/s/+/readings';"
    )
    stream = load_rules([path]).plan.streams["s"]
    assert (stream.slack_ms, stream.source_idle_ms) == (2_000, idle_ms)


def test_non_blocking_uda_with_group_by_runs_unbounded(tmp_path: Path) -> None:
    path = tmp_path / "g.sql"
    path.write_text(
        TRAFFIC + "CREATE AGGREGATE grp(t TIMESTAMP) RETURNS BIGINT LANGUAGE PYTHON "
        "AS 'rules.udas:PackingGroup';\nCREATE STREAM g AS SELECT station, ts, "
        "grp(ts) AS n FROM traffic GROUP BY station;"
    )
    (query,) = load_rules([path]).plan.queries
    window = query.window
    assert isinstance(window, OverWindow)
    assert (window.units, window.preceding, window.partition_by) == (
        FrameUnits.ROWS,
        None,
        ("station",),
    )
    assert window.aggregates[0].factory is not None


COPYING = """
CREATE STREAM plain AS SELECT station, window_end, avg(speed) AS avg_speed
  FROM traffic [RANGE 15 MINUTES SLIDE 1 MINUTE] GROUP BY station;
CREATE STREAM computed AS SELECT station, max(speed) * 3.6 AS kmh
  FROM traffic [RANGE 1 MINUTE] GROUP BY station;
CREATE STREAM renamed AS SELECT t.station AS where_, t.speed AS v, t.ts
  FROM traffic AS t WHERE t.speed > 1;
"""


def test_a_projection_copies_exactly_the_keys_its_columns_read(tmp_path: Path) -> None:
    # `copies` lets results leave as whole columns: each named key must be what the
    # column's own expression reads, on any row; a computed column means no copies.
    rules = tmp_path / "copying.sql"
    rules.write_text(TRAFFIC + COPYING)
    library = load_rules([RULES_DIR]).plan.queries
    queries = {q.sink.name: q for q in (*load_rules([rules]).plan.queries, *library)}
    seen = 0
    for name, query in queries.items():
        project = query.post[-1]
        assert isinstance(project, Project)
        if project.copies is None:
            continue
        seen += 1
        keys = {*project.copies, "other"}
        row = {key: f"{key}-value" for key in keys}
        got = [expr(row) for _, expr in project.columns]
        assert got == [row[key] for key in project.copies], name
    assert queries["computed"].post[-1].copies is None  # type: ignore[union-attr]
    assert queries["renamed"].post[-1].copies == ("station", "speed", "ts")  # type: ignore[union-attr]
    assert seen >= 8


DEFINED = """
CREATE AGGREGATE silence(ts TIMESTAMP) RETURNS TIMESTAMP LANGUAGE PYTHON AS 'rules.udas:Silence';
CREATE STREAM avg_speed AS SELECT station, ts,
    avg(speed) OVER (PARTITION BY station RANGE 5 MINUTES PRECEDING) AS v FROM traffic;
CREATE ALERT quiet SEVERITY warning RESOLVE WHEN TRUE AS SELECT station,
    silence(ts) OVER (PARTITION BY station RANGE 5 SECONDS PRECEDING ACTIVE EXPIRATION) AS s
  FROM traffic;
CREATE STREAM slow AS SELECT station, ts, v FROM avg_speed WHERE v < 10;
"""
# Each edit changes what the named queries' saved state was built by.
EDITS = [
    ("RANGE 5 MINUTES", "RANGE 6 MINUTES", {"avg_speed"}),
    ("avg(speed)", "max(speed)", {"avg_speed"}),
    (") AS s\n", ") AS last_seen\n", {"quiet"}),
    ("AS v FROM traffic;", "AS v FROM traffic WHERE lane = 1;", {"avg_speed"}),
    ("RETURNS TIMESTAMP", "RETURNS BIGINT", {"quiet"}),
    ("WHERE v < 10", "WHERE v < 11", {"slow"}),
    ("length DOUBLE", "length INT", {"avg_speed", "quiet"}),
]


def _definitions(tmp_path: Path, files: dict[str, str]) -> dict[str, str]:
    paths = []
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        paths.append(tmp_path / name)
    return {q.name: q.definition for q in load_rules(paths).plan.queries}


def test_a_query_definition_changes_with_its_rule_and_not_with_the_layout(tmp_path: Path) -> None:
    base = _definitions(tmp_path, {"a.sql": TRAFFIC + DEFINED})
    assert len(set(base.values())) == len(base), "distinct rules, distinct definitions"
    # Comments, line breaks, indentation and file boundaries do not count.
    statements = [s.strip() + ";" for s in DEFINED.split(";") if s.strip()]
    relaid = {
        "b.sql": "-- the traffic stream\n\n" + TRAFFIC.replace("\n  ", "\n        "),
        "c.sql": "\n\n".join(f"-- rule {i}\n\n  {s}" for i, s in enumerate(statements[:2])),
        "d.sql": "\n".join(s.replace("\n", "\n\n") for s in statements[2:]),
    }
    (tmp_path / "relaid").mkdir()
    assert _definitions(tmp_path / "relaid", relaid) == base
    for i, (old, new, changed) in enumerate(EDITS):
        text = TRAFFIC + DEFINED
        assert old in text, old
        folder = tmp_path / f"edit{i}"
        folder.mkdir()
        edited = _definitions(folder, {"a.sql": text.replace(old, new)})
        assert {name for name in base if edited[name] != base[name]} == changed, (old, new)
