"""Every checker error names file:line:col, shows the line with a caret, and says
what is wrong in plain words."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core.replay import arrival_table
from engine.tables import readings_schema
from rules.language.checker import READING_COLUMNS
from rules.language.loader import RULES_DIR, RuleCheckError, check_paths, load_rules
from tests.rules.helpers import TRAFFIC, check_text

RFID = """\
CREATE STREAM tag_readings (tagid STRING, tagtype STRING, door STRING, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/rfid/+/readings';
"""
STATIONS = "CREATE TABLE stations (id INT, speed_limit DOUBLE) FROM CSV 'stations.csv';\n"

CASES = [
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT station, sped FROM traffic;",
        "3:36",
        "unknown column 'sped' in 'traffic'; known columns: station, lane, speed, length, ts",
        id="unknown-column",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT station FROM trafic;",
        "3:40",
        "unknown stream 'trafic'; known stream or tables: traffic",
        id="unknown-stream",
    ),
    pytest.param(
        TRAFFIC + "CREATE ALERT a SEVERITY info AS\n  SELECT station, ts FROM traffic "
        "WHERE speed > 'fast';",
        "4:47",
        "type mismatch: cannot compare DOUBLE with STRING",
        id="type-mismatch-compare",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT ts, station + 'x' AS y FROM traffic;",
        "3:39",
        "type mismatch: '+' cannot combine INT and STRING",
        id="type-mismatch-arith",
    ),
    pytest.param(
        RFID + "CREATE STREAM s AS SELECT ts, avg(tagid) OVER (ROWS 3 PRECEDING) AS a "
        "FROM tag_readings;",
        "3:35",
        "type mismatch: 'avg' needs a number, not STRING",
        id="type-mismatch-agg",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT station FROM traffic WHERE speed;",
        "3:54",
        "type mismatch: WHERE needs a true/false condition, not a DOUBLE value",
        id="type-mismatch-where",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT station, avg(speed) AS a FROM traffic\n"
        "  GROUP BY station;",
        "3:36",
        "'avg' is a blocking aggregate and 'traffic' is an unbounded stream: give it a window",
        id="blocking-aggregate",
    ),
    pytest.param(
        TRAFFIC + STATIONS + "CREATE STREAM s AS SELECT station FROM traffic JOIN "
        "stations [NOW] ON station = id;",
        "4:63",
        "'stations' is a table, and only streams can have a window",
        id="window-on-table",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM counts AS SELECT station, count(*) OVER (ROWS 9 PRECEDING) "
        "AS n FROM traffic;\nCREATE STREAM c2 AS SELECT station, n FROM counts [RANGE 1 MINUTE];",
        "4:44",
        "stream 'counts' has no timestamp column, so no rule can read it",
        id="time-window-without-timestamp",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM gone AS SELECT DSTREAM(station, ts) FROM traffic "
        "[RANGE 10 SECONDS];\nCREATE STREAM g2 AS SELECT station, count(*) OVER "
        "(ROWS 3 PRECEDING) AS n FROM gone;",
        "4:80",
        "stream 'gone' has no timestamp column, so no rule can read it",
        id="rows-window-over-dstream",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT ts, count(*) OVER (ROWS 9 PRECEDING ACTIVE "
        "EXPIRATION) AS n FROM traffic;",
        "3:63",
        "ACTIVE EXPIRATION needs a time-based window (RANGE t PRECEDING), not ROWS",
        id="active-expiration-on-rows",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT ts, count(*) OVER (PARTITION BY road RANGE 1 "
        "MINUTE PRECEDING) AS n FROM traffic;",
        "3:59",
        "unknown column 'road' in PARTITION BY",
        id="unknown-partition-column",
    ),
    pytest.param(
        TRAFFIC + "CREATE ALERT quiet SEVERITY info AS SELECT station, count(*) OVER "
        "(PARTITION BY station RANGE 1 MINUTE PRECEDING) AS n FROM traffic;",
        "3:14",
        "alert 'quiet' reports from a window, so a row its WHERE drops does not mean its "
        "condition stopped: say how its incidents resolve (RESOLVE WHEN condition on its "
        "input rows, or RESOLVE AFTER a quiet interval)",
        id="incidents-of-a-window-unstated",
    ),
    pytest.param(
        TRAFFIC + "CREATE ALERT slow SEVERITY info RESOLVE WHEN speed AS SELECT station, ts "
        "FROM traffic WHERE speed < 3;",
        "3:46",
        "type mismatch: RESOLVE WHEN needs a true/false condition, not a DOUBLE value",
        id="resolve-when-not-a-condition",
    ),
    pytest.param(
        TRAFFIC + "CREATE ALERT slow SEVERITY info RESOLVE WHEN max(speed) > 3 AS SELECT "
        "station, ts FROM traffic WHERE speed < 3;",
        "3:46",
        "aggregate 'max' is not allowed in RESOLVE WHEN",
        id="resolve-when-aggregate",
    ),
    pytest.param(
        TRAFFIC + "CREATE ALERT slow SEVERITY info RESOLVE AFTER 0 SECONDS AS SELECT "
        "station, ts FROM traffic WHERE speed < 3;",
        "3:33",
        "RESOLVE AFTER needs a positive duration",
        id="resolve-after-zero",
    ),
    pytest.param(
        TRAFFIC + "CREATE ALERT slow SEVERITY info RESOLVE WHEN speed > 5 AS SELECT station, "
        "ts FROM traffic WHERE speed < 3 UNION ALL SELECT station, ts FROM traffic WHERE "
        "lane = 9;",
        "3:33",
        "RESOLVE WHEN reads the alert's input rows, and a UNION ALL has several inputs",
        id="resolve-when-union",
    ),
    pytest.param(
        TRAFFIC + "CREATE ALERT slow SEVERITY info KEEP FIRING FOR 1 MINUTE FOR 2 MINUTES "
        "AS SELECT station, ts FROM traffic WHERE speed < 3;",
        "3:58",
        "syntax error: unexpected 'FOR'",
        id="incident-clauses-in-order",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM traffic AS SELECT station FROM traffic;",
        "3:15",
        "duplicate name 'traffic': already defined at ",
        id="duplicate-name",
    ),
    pytest.param(
        "CREATE STREAM t (a INT, a DOUBLE, ts TIMESTAMP) ORDER BY ts SLACK 1 SECOND SOURCE 'x';",
        "1:25",
        "duplicate column 'a'",
        id="duplicate-column",
    ),
    pytest.param(
        "CREATE STREAM t (k INT, seq INT, ts TIMESTAMP) ORDER BY ts SLACK 1 SECOND SOURCE 'x';",
        "1:25",
        "column 'seq' is reserved: every reading carries source, epoch, seq, topic, "
        "received_at, arrival_watermark, heartbeat beside its stream's columns; name it "
        "otherwise",
        id="reserved-column",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT station, lane AS station FROM traffic;",
        "3:44",
        "duplicate column name 'station' in the SELECT list",
        id="duplicate-output",
    ),
    pytest.param(
        "CREATE AGGREGATE f(x INT) RETURNS INT LANGUAGE PYTHON AS 'no_such_module:F';",
        "1:58",
        "cannot import Python aggregate 'no_such_module:F': No module named 'no_such_module'",
        id="uda-import",
    ),
    pytest.param(
        "CREATE AGGREGATE f(x INT) RETURNS INT LANGUAGE PYTHON AS "
        "'tests.rules.uda_fixtures:Missing';",
        "1:58",
        "cannot import Python aggregate 'tests.rules.uda_fixtures:Missing': module "
        "'tests.rules.uda_fixtures' has no class 'Missing'",
        id="uda-no-class",
    ),
    pytest.param(
        "CREATE AGGREGATE f(x INT) RETURNS INT LANGUAGE PYTHON AS "
        "'tests.rules.uda_fixtures:NotAnAggregate';",
        "1:58",
        "Python aggregate 'tests.rules.uda_fixtures:NotAnAggregate' must subclass "
        "engine.core.aggregates.WindowAggregate",
        id="uda-not-aggregate",
    ),
    pytest.param(
        "CREATE AGGREGATE f(x INT) RETURNS INT LANGUAGE PYTHON AS "
        "'tests.rules.uda_fixtures:NoIterate';",
        "1:58",
        "Python aggregate 'tests.rules.uda_fixtures:NoIterate' lacks the iterate state",
        id="uda-lacks-iterate",
    ),
    pytest.param(
        TRAFFIC + "CREATE AGGREGATE f(x INT) RETURNS INT LANGUAGE PYTHON AS "
        "'tests.rules.uda_fixtures:NoExpire';\nCREATE ALERT a SEVERITY info AS SELECT station, "
        "f(lane) OVER (RANGE 1 MINUTE PRECEDING ACTIVE EXPIRATION) AS v FROM traffic;",
        "4:49",
        "'f' is used with ACTIVE EXPIRATION but its Python class lacks the expire state",
        id="uda-lacks-expire",
    ),
    pytest.param(
        TRAFFIC + "CREATE ALERT a SEVERITY info MESSAGE 'slow at {statoin}'\n"
        "  AS SELECT station, ts FROM traffic;",
        "3:47",
        "unknown column 'statoin' in MESSAGE",
        id="message-field",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT station, window_end FROM traffic;",
        "3:36",
        "unknown column 'window_end'",
        id="pseudo-column-without-window",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT lane, window_end, count(*) AS n\n"
        "  FROM traffic [RANGE 1 MINUTE] GROUP BY station;",
        "3:27",
        "column 'lane' must appear in GROUP BY or inside an aggregate",
        id="grouping",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT ts, avg(speed) OVER (ROWS 3 PRECEDING) AS a,\n"
        "  max(speed) OVER (ROWS 4 PRECEDING SLIDE 2) AS m FROM traffic;",
        "4:37",
        "a SELECT with several OVER windows cannot SLIDE",
        id="two-windows-one-sliding",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT station FROM traffic WHERE avg(speed) > 1;",
        "3:54",
        "aggregate 'avg' is not allowed in WHERE",
        id="aggregate-in-where",
    ),
    pytest.param(
        TRAFFIC + STATIONS + "CREATE STREAM s AS SELECT station FROM traffic JOIN stations "
        "ON max(speed) > 1;",
        "4:65",
        "aggregate 'max' is not allowed in the ON condition of 'stations'",
        id="aggregate-in-on",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT station, speed * 2 FROM traffic;",
        "3:36",
        "name this column with AS",
        id="unnamed-column",
    ),
    pytest.param(
        "CREATE STREAM t (a INT, ts STRING) ORDER BY ts SLACK 1 SECOND SOURCE 'x';",
        "1:45",
        "type mismatch: ORDER BY column 'ts' is STRING, not TIMESTAMP",
        id="order-by-not-timestamp",
    ),
    pytest.param(
        "CREATE STREAM t (a INTEGR, ts TIMESTAMP) ORDER BY ts SLACK 1 SECOND SOURCE 'x';",
        "1:20",
        "unknown type 'INTEGR'",
        id="unknown-type",
    ),
    pytest.param(
        TRAFFIC + RFID + "CREATE STREAM s AS SELECT station FROM traffic, tag_readings;",
        "5:49",
        "this query reads two streams ('traffic' and 'tag_readings'); a stream can "
        "only be joined with reference tables",
        id="two-streams",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT station, ts FROM traffic\n"
        "  UNION ALL SELECT station FROM traffic;",
        "4:13",
        "UNION ALL branches must have the same number of columns: 2 and 1",
        id="union-arity",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT station, ts FROM traffic\n"
        "  UNION ALL SELECT ts, station FROM traffic;",
        "4:20",
        "type mismatch: column 'station' is INT in the first branch of UNION ALL and "
        "TIMESTAMP here",
        id="union-types",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM s AS SELECT station FROM traffic HAVING station > 1;",
        "3:55",
        "HAVING needs GROUP BY or a window in FROM",
        id="having-without-grouping",
    ),
    pytest.param(
        TRAFFIC + STATIONS + "CREATE ALERT speeding SEVERITY warning AS\n"
        "  SELECT station, ts, speed FROM traffic JOIN stations ON station = id\n"
        "  WHERE speed > speed_limit;",
        "3:61",
        "cannot load table 'stations': cannot read '",
        id="table-file-missing",
    ),
    pytest.param(
        TRAFFIC + "CREATE STREAM d AS SELECT count(*) AS n "
        "FROM traffic [SINCE TIMESTAMP '2026-01-01 00:00:00'];",
        "3:55",
        "the engine cannot run the CQL window [SINCE] without ISTREAM, DSTREAM or RSTREAM "
        "(its result is a relation) yet",
        id="engine-unsupported-cql-since",
    ),
    pytest.param(
        "CREATE STREAM s (station INT, ts TIMESTAMP)\n"
        "  ORDER BY ts SLACK 2 SECONDS IDLE 30 SECONDS SOURCE 'lookout/s/+/readings';",
        "2:31",
        "IDLE needs PER SOURCE: only a stream whose sources keep clocks of their own has "
        "idle sources",
        id="idle-without-per-source",
    ),
    pytest.param(
        "CREATE STREAM s (station INT, ts TIMESTAMP)\n"
        "  ORDER BY ts SLACK 2 SECONDS PER SOURCE IDLE 0 SECONDS SOURCE 'lookout/s/+/readings';",
        "2:42",
        "IDLE must be positive",
        id="idle-not-positive",
    ),
]


@pytest.mark.parametrize(("text", "where", "reason"), CASES)
def test_error_is_located_and_plain(tmp_path: Path, text: str, where: str, reason: str) -> None:
    path, errors = check_text(tmp_path, text)
    assert errors, "expected an error"
    first = errors[0]
    assert str(first).startswith(f"{path}:{where}: {reason}"), first.format()
    source, caret = first.format().splitlines()[1:]
    assert source == text.splitlines()[first.line - 1]
    assert caret.index("^") == first.col - 1


def test_duplicate_names_across_files(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text(TRAFFIC)
    (tmp_path / "b.sql").write_text("\n" + TRAFFIC)
    errors = check_paths([tmp_path])
    assert [str(e) for e in errors] == [
        f"{tmp_path / 'b.sql'}:2:15: duplicate name 'traffic': already defined at "
        f"{tmp_path / 'a.sql'}:1:15"
    ]


@pytest.mark.parametrize(
    ("select", "reason"),
    [
        ("station, ts, speed AS v, lane AS w FROM trafic", "unknown stream 'trafic'"),
        ("station, ts, speed AS v, sped AS w FROM traffic", "unknown column 'sped'"),
        # perhaps the timestamp, misspelled: no "s has no timestamp column" for t
        ("station, tss, speed AS v, lane AS w FROM traffic", "unknown column 'tss'"),
    ],
)
def test_one_mistake_one_error(tmp_path: Path, select: str, reason: str) -> None:
    """What reads a stream whose definition is in error is not checked against what the
    error left unknown: no type mismatches with its columns, no missing timestamp."""
    text = (
        TRAFFIC
        + f"CREATE STREAM s AS SELECT {select};\n"
        + (
            "CREATE ALERT a SEVERITY warning MESSAGE 'at {station}: {v}' AS SELECT station, ts, v\n"
            "  FROM s WHERE v < 15 AND station = 3 AND w > 3;\n"
            "CREATE STREAM t AS SELECT station, count(*) AS n, window_end FROM s [RANGE 1 MINUTE]\n"
            "  GROUP BY station;\n"
        )
    )
    _, errors = check_text(tmp_path, text)
    assert [reason in e.message for e in errors] == [True], [e.format() for e in errors]


def test_library_checks_clean() -> None:
    assert [e.format() for e in check_paths([RULES_DIR])] == []


def test_load_rules_raises_with_all_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.sql"
    path.write_text(
        TRAFFIC + "CREATE STREAM s AS SELECT nope FROM traffic;\n"
        "CREATE STREAM t AS SELECT station FROM nowhere;"
    )
    with pytest.raises(RuleCheckError) as info:
        load_rules([path])
    assert [(e.line, e.col) for e in info.value.errors] == [(3, 27), (4, 40)]
    assert "unknown column 'nope'" in str(info.value)


def test_unreadable_file_is_an_error(tmp_path: Path) -> None:
    errors = check_paths([tmp_path / "missing.sql"])
    assert len(errors) == 1 and "cannot read the file" in errors[0].message


def test_the_reserved_column_names_are_every_column_a_reading_carries() -> None:
    """The checker's list of reserved names against the engine's own: the columns the
    readings table adds to a stream's and those an arrival table carries."""
    plan = load_rules([RULES_DIR / "traffic.sql"]).plan
    traffic = plan.streams["traffic"]
    declared = {c.name for c in traffic.columns}
    added = set(readings_schema(traffic).names) - declared
    arriving = set(arrival_table(traffic, []).column_names) - declared
    assert added | arriving == set(READING_COLUMNS)
