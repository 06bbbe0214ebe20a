"""The Rules page's helpers: statement text, inline error layout, the rule set read and
explained, and the Alerts page's SQL filter."""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from dashboard.alert_filters import where_clause
from dashboard.data import VERSION_TTL_S, query, table_version
from dashboard.rulebook import Watched, annotate, read_book, statement_text
from dashboard.trends import key_sql
from engine.alerts import format_key
from rules.language.errors import RuleError

FILE = """-- a stream
CREATE STREAM s (x INT, ts TIMESTAMP) ORDER BY ts SLACK 1 SECOND SOURCE 'a/+/b';

-- the alert on it
-- (two comment lines)
CREATE ALERT big SEVERITY info AS SELECT x, ts FROM s WHERE x > 3;
"""


def test_statement_text_takes_its_comments_and_leaves_the_next_ones() -> None:
    lines = FILE.splitlines()
    assert statement_text(lines, 1, 5) == "-- a stream\n" + lines[1]
    assert statement_text(lines, 5, len(lines)).startswith("-- the alert on it\n-- (two")


def test_annotate_puts_a_caret_under_the_column_then_the_message() -> None:
    text = "CREATE ALERT a\n  AS SELECT nope;\n"
    out = annotate(text, [RuleError("a.sql", 2, 13, "unknown column 'nope'")])
    assert out.splitlines() == [
        "1 | CREATE ALERT a",
        "2 |   AS SELECT nope;",
        "  |             ^",
        "  | 2:13: unknown column 'nope'",
    ]


def test_read_book_explains_each_statement(tmp_path: Path) -> None:
    (tmp_path / "mine.sql").write_text(FILE)
    book = read_book([tmp_path])
    assert not book.errors
    assert [(r.name, r.kind, r.line) for r in book.rules] == [
        ("s", "source stream", 2),
        ("big", "alert", 6),
    ]
    assert book.rules[1].severity == "info"
    assert "slack 1 second" in book.rules[0].explanation


def test_where_clause_quotes_what_the_operator_typed() -> None:
    since = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    sql = where_clause(["o'brien"], ["critical"], since, "station=3'", "open")
    assert "rule IN ('o''brien')" in sql
    assert "severity IN ('critical')" in sql
    assert "event_time >= '2026-01-02T03:04:05Z'" in sql
    assert "strpos(key, 'station=3''') > 0" in sql
    assert sql.endswith("acked_at IS NULL")


KEYED = """CREATE STREAM s (site INT, lane INT, x INT, ts TIMESTAMP)
  ORDER BY ts SLACK 1 SECOND SOURCE 'a/+/b';
CREATE STREAM per_site AS
  SELECT site, ts, avg(x) OVER (PARTITION BY site RANGE 1 MINUTE PRECEDING) AS m FROM s;
CREATE ALERT high SEVERITY info AS SELECT site, ts, m FROM per_site WHERE m > 3;
CREATE ALERT lane_high SEVERITY info RESOLVE AFTER 1 MINUTE AS
  SELECT site, lane, ts, max(x) OVER (PARTITION BY site, lane ROWS 3 PRECEDING) AS top FROM s;
CREATE ALERT any_high SEVERITY info AS SELECT x, ts FROM s WHERE x > 9;
"""


def test_alert_keys_come_from_the_partitioning_upstream(tmp_path: Path) -> None:
    (tmp_path / "k.sql").write_text(KEYED)
    book = read_book([tmp_path])
    assert not book.errors
    keys = {r.name: r.key for r in book.rules if r.kind == "alert"}
    # `high` filters a stream partitioned by site, so its alerts are keyed by site too.
    assert keys == {"high": ("site",), "lane_high": ("site", "lane"), "any_high": ()}
    assert book.alerts_keyed_by("site") == ["high", "lane_high"]
    assert book.alert_problem("high", "site") is None
    assert book.alert_problem("lane_high", "site") is None
    assert "no rule `jam`" in (book.alert_problem("jam", "site") or "")
    assert "is a derived stream" in (book.alert_problem("per_site", "site") or "")
    assert "keyed by nothing, not by site" in (book.alert_problem("any_high", "site") or "")
    assert "keyed by site, not by door" in (book.alert_problem("high", "door") or "")


def test_alert_keys_are_unknown_while_the_folder_has_errors(tmp_path: Path) -> None:
    (tmp_path / "k.sql").write_text(KEYED + "CREATE ALERT broken AS SELECT nope FROM s;\n")
    book = read_book([tmp_path])
    assert book.errors
    assert "has errors" in (book.alert_problem("high", "site") or "")


def test_an_alert_that_fires_below_a_bound_says_which(tmp_path: Path) -> None:
    (tmp_path / "k.sql").write_text(
        KEYED
        + "CREATE ALERT slow SEVERITY info AS\n"
        + "  SELECT site, x, ts FROM s WHERE site = 1 AND x < 2.5;\n"
        + "CREATE ALERT slower SEVERITY info AS SELECT site, x, ts FROM s WHERE x <= 2;\n"
        + "CREATE ALERT either SEVERITY info AS SELECT x, ts FROM s WHERE x < 2 OR x > 9;\n"
    )
    bounds = {r.name: r.fires_below for r in read_book([tmp_path]).rules if r.kind == "alert"}
    assert bounds["slow"] == ("x", 2.5)
    assert bounds["slower"] == ("x", 2.0)
    assert bounds["either"] is None  # not "only while x < 2"
    assert bounds["high"] is None  # m > 3


def test_what_an_alert_watches_is_the_stored_input_column_it_compares(tmp_path: Path) -> None:
    (tmp_path / "k.sql").write_text(
        KEYED
        + "CREATE TABLE sites (site INT, limit_x INT) FROM CSV 'sites.csv';\n"
        + "CREATE ALERT low SEVERITY info AS\n"
        + "  SELECT p.site, p.ts, p.m FROM per_site p WHERE p.site <> 2 AND 1.5 >= p.m;\n"
        + "CREATE ALERT above_limit SEVERITY info AS SELECT s.site, s.ts, s.x FROM s\n"
        + "  JOIN sites t ON s.site = t.site WHERE s.x > t.limit_x;\n"
        + "CREATE ALERT both_ways SEVERITY info AS SELECT x, ts FROM s WHERE x < 2 OR x > 9;\n"
    )
    (tmp_path / "sites.csv").write_text("site,limit_x\n1,5\n")
    book = read_book([tmp_path])
    assert not book.errors, book.errors
    watched = {r.name: r.watched for r in book.rules if r.kind == "alert"}
    # A derived stream's own table, keyed as the alert is.
    assert watched["high"] == Watched("per_site", "ts", "m", ("site",), "m > 3")
    # The first comparison with a number, the number on either side (`1.5 >= m` is
    # `m <= 1.5`), a qualified column.
    assert watched["low"] == Watched("per_site", "ts", "m", ("site",), "m <= 1.5")
    # A source stream's readings table; unkeyed.
    assert watched["any_high"] == Watched("readings_s", "ts", "x", (), "x > 9")
    # A window's aggregate is in no table; a bound from a joined table is no number;
    # an OR is not one condition.
    assert watched["lane_high"] is None
    assert watched["above_limit"] is None
    assert watched["both_ways"] is None


def test_the_key_text_built_in_sql_is_the_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOKOUT_LAKEHOUSE_PATH", str(tmp_path))
    rows = [(3, "4", 1), (12, "a b", -7), (0, "x=y, z", 2**40)]
    table = pa.table(
        {
            "station": pa.array([r[0] for r in rows], pa.int32()),
            "door": [r[1] for r in rows],
            "big": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    write_deltalake(str(tmp_path / "keys"), table)
    for names in [("station",), ("door",), ("station", "door", "big"), ()]:
        got = query(f"SELECT {key_sql(names)} AS key FROM keys ORDER BY station", "keys")
        assert got is not None
        index = [("station", "door", "big").index(n) for n in names]
        want = sorted(rows)
        assert list(got["key"]) == [format_key(names, tuple(r[i] for i in index)) for r in want], (
            names
        )


def test_a_table_deleted_or_recreated_under_the_dashboard_is_seen_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOKOUT_LAKEHOUSE_PATH", str(tmp_path))
    rows = pa.table({"a": [1]})
    for _ in range(3):
        write_deltalake(str(tmp_path / "t"), rows, mode="append")
    assert table_version("t") == 2
    shutil.rmtree(tmp_path / "t")
    write_deltalake(str(tmp_path / "t"), rows, mode="append")
    time.sleep(VERSION_TTL_S + 0.1)
    assert table_version("t") == 0  # not the old table's 2
    shutil.rmtree(tmp_path / "t")
    time.sleep(VERSION_TTL_S + 0.1)
    assert table_version("t") is None
