"""The grammar: every library file and every window form parses; syntax errors are
located and say what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from rules.language import ast
from rules.language.loader import RULES_DIR
from rules.language.parser import parse_text

LIBRARY = sorted(RULES_DIR.glob("*.sql"))


def test_library_is_present() -> None:
    assert {p.name for p in LIBRARY} >= {"traffic.sql", "rfid.sql"}


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.name)
def test_library_file_parses(path: Path) -> None:
    statements, errors = parse_text(path.read_text(), str(path))
    assert errors == []
    assert statements


def test_traffic_is_design_section_3() -> None:
    statements, _ = parse_text((RULES_DIR / "traffic.sql").read_text())
    traffic = statements[0]
    assert isinstance(traffic, ast.CreateStream)
    assert traffic.name.name == "traffic"
    assert [(c.name.name, c.type.name) for c in traffic.columns] == [
        ("station", "INT"),
        ("lane", "INT"),
        ("speed", "DOUBLE"),
        ("length", "DOUBLE"),
        ("ts", "TIMESTAMP"),
    ]
    assert (traffic.order_by.name, traffic.slack_ms, traffic.source) == (
        "ts",
        2000,
        "lookout/traffic/+/readings",
    )
    speed = statements[1]
    assert isinstance(speed, ast.CreateDerived) and speed.name.name == "station_speed"
    call = speed.query.selects[0].items[2].expr
    assert isinstance(call, ast.Call) and call.over is not None
    assert (call.over.kind, call.over.range_ms, call.over.slide_ms) == ("range", 900_000, 60_000)
    assert [p.name for p in call.over.partition] == ["station"]
    alert = statements[2]
    assert isinstance(alert, ast.CreateAlert)
    assert (alert.name.name, alert.severity) == ("congestion", "warning")
    assert alert.message == "station {station}: {avg_speed} m/s over 15 minutes"


def _over(spec: str) -> ast.WindowSpec:
    text = f"CREATE STREAM o AS SELECT ts, sum(speed) OVER ({spec}) AS s FROM traffic;"
    statements, errors = parse_text(text)
    assert errors == [], errors[0].format()
    call = statements[0].query.selects[0].items[1].expr
    assert isinstance(call, ast.Call) and call.over is not None
    return call.over


def _from(spec: str) -> ast.WindowSpec:
    statements, errors = parse_text(f"CREATE STREAM f AS SELECT count(*) AS n FROM s [{spec}];")
    assert errors == [], errors[0].format()
    window = statements[0].query.selects[0].sources[0].window
    assert window is not None
    return window


def test_over_window_forms() -> None:
    assert _over("ROWS 49 PRECEDING SLIDE 10").rows == 49
    assert _over("PARTITION BY a, b ROWS 3 PRECEDING").partition[1].name == "b"
    assert _over("RANGE 5 SECONDS PRECEDING ACTIVE EXPIRATION").active_expiration
    assert _over("RANGE 10 MINUTES PRECEDING LAG 1 MINUTE").lag_ms == 60_000
    assert _over("RANGE UNBOUNDED PRECEDING").kind == "unbounded"
    rows_unbounded = _over("ROWS UNBOUNDED PRECEDING")  # physical: ROWS with no count
    assert (rows_unbounded.kind, rows_unbounded.rows) == ("rows", None)
    assert _over("RANGE UNBOUNDED PRECEDING RESET EVERY 1 DAY").reset_ms == 86_400_000
    since = _over("RANGE SINCE TIMESTAMP '2026-01-01T00:00:00Z'")
    assert (since.kind, since.lower_ms) == ("since", 1_767_225_600_000)
    assert _over("RANGE UNTIL TIMESTAMP '2026-01-02 00:00:00'").upper_ms == 1_767_312_000_000
    band = _over("RANGE BETWEEN TIMESTAMP '2026-01-01' AND TIMESTAMP '2026-01-02'")
    assert (band.lower_ms, band.upper_ms) == (1_767_225_600_000, 1_767_312_000_000)
    assert _over("RANGE 2 HOURS PRECEDING SLIDE 500 MILLISECONDS").slide_ms == 500


def test_cql_window_forms() -> None:
    assert _from("NOW").kind == "now"
    assert (_from("ROWS 1000 SLIDE 100").rows, _from("ROWS 1000 SLIDE 100").slide_rows) == (
        1000,
        100,
    )
    assert _from("PARTITION BY station ROWS 1").partition[0].name == "station"
    assert (_from("RANGE 5 MINUTES SLIDE 1 MINUTE").range_ms, _from("RANGE 1 DAY").slide_ms) == (
        300_000,
        None,
    )
    assert _from("RANGE 5 MINUTES LAG 30 SECONDS").lag_ms == 30_000
    assert _from("RANGE UNBOUNDED RESET EVERY 1 DAY").reset_ms == 86_400_000
    assert _from("SINCE TIMESTAMP '2026-01-01'").kind == "since"
    assert _from("UNTIL TIMESTAMP '2026-01-01'").kind == "until"
    assert _from("BETWEEN TIMESTAMP '2026-01-01' AND TIMESTAMP '2026-01-02'").kind == "band"


def test_relation_to_stream_union_and_join() -> None:
    text = """
    -- comments are ignored
    create stream x as
      select istream(t.station, s.limit_ms) from traffic [now] as t
        join stations s on t.station = s.id
      union all
      select rstream(*) from traffic [partition by station rows 1];
    """
    statements, errors = parse_text(text)
    assert errors == []
    query = statements[0].query
    assert [s.r2s for s in query.selects] == ["ISTREAM", "RSTREAM"]
    first = query.selects[0]
    assert [s.label for s in first.sources] == ["t", "s"]
    assert isinstance(first.joins[1], ast.Binary)


def test_expressions() -> None:
    text = (
        "CREATE STREAM e AS SELECT -speed * 2 + 1 AS a, "
        "CASE WHEN speed > 10 THEN 'fast' ELSE 'slow' END AS b, "
        "lane NOT IN (1, 2) AND speed IS NOT NULL OR NOT (lane <> 3) AS c, "
        "ts - INTERVAL 5 MINUTES AS d, 'it''s' AS q FROM traffic"
    )
    statements, errors = parse_text(text)
    assert errors == []
    items = statements[0].query.selects[0].items
    a = items[0].expr
    assert isinstance(a, ast.Binary) and a.op == "+"
    c = items[2].expr
    assert isinstance(c, ast.Binary) and c.op == "OR"
    d = items[3].expr
    assert isinstance(d, ast.Binary) and d.right == ast.Literal(300_000, "INTERVAL", d.right.pos)
    assert items[4].expr.value == "it's"


def test_create_table_and_aggregate() -> None:
    text = (
        "CREATE TABLE stations (id INT, limit_ms DOUBLE) FROM CSV 'data/stations.csv';\n"
        "CREATE AGGREGATE mx(x DOUBLE) RETURNS DOUBLE LANGUAGE PYTHON AS 'm:C' ALGEBRAIC;"
    )
    (table, agg), errors = parse_text(text)
    assert errors == []
    assert isinstance(table, ast.CreateTable) and (table.format, table.path) == (
        "CSV",
        "data/stations.csv",
    )
    assert isinstance(agg, ast.CreateAggregate) and agg.algebraic and agg.target == "m:C"


@pytest.mark.parametrize(
    ("text", "where", "reason"),
    [
        (
            "CREATE STREAM x (a INT) ORDER BY a SLACK 2 SECONDS;",
            "1:51",
            "syntax error: unexpected ';'; expected one of IDLE, PER or SOURCE",
        ),
        (
            "CREATE STREAM y AS\n  SELECT a, FROM b;",
            "2:13",
            "syntax error: unexpected 'FROM'; expected one of an expression or '*'",
        ),
        (
            "CREATE ALERT a SEVERITY high AS SELECT a FROM b;",
            "1:25",
            "syntax error: unexpected 'high'; expected one of CRITICAL, INFO or WARNING",
        ),
        (
            "CREATE STREAM y AS SELECT avg(a) OVER (RANGE 5 PRECEDING) AS v FROM b;",
            "1:48",
            "syntax error: unexpected 'PRECEDING'; expected a time unit (MILLISECONDS, SECONDS",
        ),
        (
            "CREATE STREAM y AS SELECT a FROM b WHERE a = $;",
            "1:46",
            "syntax error: unexpected character '$'; expected an expression",
        ),
        (
            "CREATE STREAM y AS SELECT a FROM b WHERE a >",
            "1:45",
            "syntax error: unexpected the end of the file; expected an expression",
        ),
        (
            "CREATE STREAM y AS SELECT a FROM b [RANGE SINCE TIMESTAMP 'soon']",
            "1:43",
            "syntax error: unexpected 'SINCE'; expected one of a whole number or UNBOUNDED",
        ),
        (  # the ';' belongs after the source's topic, not before the next CREATE
            "CREATE STREAM x (a INT) ORDER BY a SLACK 2 SECONDS SOURCE 'x--y' -- the topic\n"
            "\n"
            "CREATE STREAM y AS SELECT a FROM x;",
            "1:65",
            "syntax error: missing ';' at the end of this statement (the next one begins at "
            "line 3)",
        ),
        (
            "CREATE STREAM y AS SELECT a b, c FROM x;",
            "1:28",
            "syntax error: probably a missing ',' here, before 'b'",
        ),
        (
            "CREATE AGGREGATE f(a INT b INT) RETURNS INT LANGUAGE PYTHON AS 'm:C';",
            "1:25",
            "syntax error: probably a missing ',' here, before 'b'",
        ),
        (  # at most five expectations, punctuation first
            "CREATE STREAM y AS SELECT a FROM b WHERE a ] 1;",
            "1:44",
            "syntax error: unexpected ']'; expected one of ';', ',', ')', an operator or 27 more",
        ),
        (
            "CREATE STREAM y AS SELECT a FROM b [SINCE TIMESTAMP 'soon']",
            "1:53",
            "'soon' is not an ISO-8601 timestamp",
        ),
    ],
)
def test_syntax_errors_are_located(text: str, where: str, reason: str) -> None:
    _, errors = parse_text(text, "f.sql")
    assert len(errors) == 1
    error = errors[0]
    assert str(error).startswith(f"f.sql:{where}: {reason}")
    line, caret = error.format().splitlines()[1:]
    assert line == text.splitlines()[error.line - 1]
    assert caret == " " * (error.col - 1) + "^"
