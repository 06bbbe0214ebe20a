"""Stream-table joins with reference tables (CREATE TABLE ... FROM CSV | DELTA): rows
loaded by the compiler into the plan, equi-joins inner and LEFT, located errors."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from engine.core.replay import run
from rules.language.loader import RuleCheckError, load_rules
from tests.rules.helpers import TRAFFIC, check_text

S = 1_000
REGISTRY = "station,segment,speed_limit\n1,north,30\n2,south,20\n2,south-ramp,15\n3,,\n"
TABLE = (
    "CREATE TABLE stations (station INT, segment STRING, speed_limit DOUBLE) "
    "FROM CSV 'stations.csv';\n"
)


def rules(tmp_path: Path, query: str, csv: str = REGISTRY) -> Any:
    (tmp_path / "stations.csv").write_text(csv)
    (tmp_path / "r.sql").write_text(TRAFFIC + TABLE + query)
    return load_rules([tmp_path / "r.sql"])


def reading(station: int | None, speed: float, ts: int) -> tuple[str, dict[str, Any]]:
    return "traffic", {"station": station, "lane": 1, "speed": speed, "length": 4.0, "ts": ts}


READINGS = [reading(1, 35.0, 1 * S), reading(2, 18.0, 2 * S), reading(4, 99.0, 3 * S),
            reading(None, 50.0, 4 * S), reading(3, 10.0, 5 * S)]  # fmt: skip


def rows(rule_set: Any, sink: str = "out") -> list[dict[str, Any]]:
    return [o.row for o in run(rule_set.plan, READINGS).outputs if o.sink == sink]


def test_inner_join_one_row_per_match(tmp_path: Path) -> None:
    query = (
        "CREATE STREAM out AS SELECT t.station, segment, speed_limit, ts "
        "FROM traffic t JOIN stations s ON s.station = t.station;"
    )
    got = rows(rules(tmp_path, query))
    # Station 2 has two registry rows (two outputs, in file order); 4 and NULL match none.
    assert got == [
        {"station": 1, "segment": "north", "speed_limit": 30.0, "ts": 1 * S},
        {"station": 2, "segment": "south", "speed_limit": 20.0, "ts": 2 * S},
        {"station": 2, "segment": "south-ramp", "speed_limit": 15.0, "ts": 2 * S},
        {"station": 3, "segment": None, "speed_limit": None, "ts": 5 * S},
    ]


def test_left_join_keeps_unmatched_rows_with_nulls(tmp_path: Path) -> None:
    query = (
        "CREATE STREAM out AS SELECT traffic.station, s.station AS registered, segment "
        "FROM traffic LEFT JOIN stations s ON traffic.station = s.station;"
    )
    got = rows(rules(tmp_path, query))
    assert [(r["station"], r["registered"], r["segment"]) for r in got] == [
        (1, 1, "north"), (2, 2, "south"), (2, 2, "south-ramp"), (4, None, None),
        (None, None, None), (3, 3, None),
    ]  # fmt: skip


def test_speeding_against_the_joined_limit(tmp_path: Path) -> None:
    query = (
        "CREATE ALERT out SEVERITY warning AS SELECT t.station, ts, speed, speed_limit "
        "FROM traffic t JOIN stations s ON t.station = s.station WHERE speed > speed_limit;"
    )
    got = rows(rules(tmp_path, query))
    # 35 > 30 at station 1; 18 > 15 for station 2's ramp row only; station 3 has no limit.
    assert got == [
        {"station": 1, "ts": 1 * S, "speed": 35.0, "speed_limit": 30.0},
        {"station": 2, "ts": 2 * S, "speed": 18.0, "speed_limit": 15.0},
    ]


def test_table_columns_feed_a_window(tmp_path: Path) -> None:
    query = (
        "CREATE STREAM out AS SELECT t.station, ts, max(speed - speed_limit) "
        "OVER (PARTITION BY station ROWS 1 PRECEDING) AS over_limit "
        "FROM traffic t JOIN stations s ON t.station = s.station;"
    )
    got = rows(rules(tmp_path, query))
    assert [(r["station"], r["over_limit"]) for r in got] == [
        (1, 5.0),
        (2, -2.0),
        (2, 3.0),
        (3, None),
    ]


def test_stage_with_its_table_survives_cloudpickle(tmp_path: Path) -> None:
    cloudpickle = pytest.importorskip("pyspark.cloudpickle")
    rule_set = rules(tmp_path, "CREATE STREAM out AS SELECT t.station, segment FROM traffic t "
                               "JOIN stations s ON t.station = s.station;")  # fmt: skip
    (tmp_path / "stations.csv").unlink()  # a worker has no access to the file
    stage = pickle.loads(cloudpickle.dumps(rule_set.plan.stages()[0]))
    join = stage.query.pre[0]
    assert join.matches({"station": 1}) == [
        {"station": 1, "s.station": 1, "s.segment": "north", "s.speed_limit": 30.0}
    ]


def test_delta_table(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    pa = pytest.importorskip("pyarrow")
    registry = pa.table({"station": pa.array([1, 2], pa.int32()), "segment": ["n", "s"],
                         "speed_limit": [30.0, 20.0]})  # fmt: skip
    deltalake.write_deltalake(str(tmp_path / "registry"), registry)
    (tmp_path / "r.sql").write_text(
        TRAFFIC + "CREATE TABLE stations (station INT, segment STRING, speed_limit DOUBLE) "
        "FROM DELTA 'registry';\nCREATE STREAM out AS SELECT t.station, segment FROM traffic t "
        "JOIN stations s ON t.station = s.station;"
    )
    got = rows(load_rules([tmp_path / "r.sql"]))
    assert got == [{"station": 1, "segment": "n"}, {"station": 2, "segment": "s"}]


@pytest.mark.parametrize(
    ("csv", "query", "where", "reason"),
    [
        pytest.param(REGISTRY, "CREATE STREAM out AS SELECT ts FROM traffic t JOIN stations s "
                     "ON t.station = s.stat;", "4:78",
                     "unknown column 'stat' in 'stations'; it has station, segment, speed_limit",
                     id="unknown-table-column"),
        pytest.param(REGISTRY, "CREATE STREAM out AS SELECT ts FROM traffic t JOIN stationz s "
                     "ON t.station = s.station;", "4:52", "unknown stream 'stationz'",
                     id="unknown-table"),
        pytest.param(REGISTRY, "CREATE STREAM out AS SELECT ts FROM traffic t JOIN stations s "
                     "ON t.speed < s.speed_limit;", "4:66",
                     "the engine cannot run this ON condition (only equalities with 's' "
                     "columns) yet", id="not-an-equality"),
        pytest.param(REGISTRY, "CREATE STREAM out AS SELECT segment, window_end, count(*) AS n "
                     "FROM traffic [RANGE 1 MINUTE] t JOIN stations s ON t.station = s.station "
                     "GROUP BY segment;", "4:146",
                     "the engine cannot run grouping by a reference table's column yet",
                     id="group-by-table-column"),
        pytest.param("station,segment,speed_limit\n1,north,fast\n",
                     "CREATE STREAM out AS SELECT ts FROM traffic;", "3:82",
                     "cannot load table 'stations': ", id="bad-value"),
        pytest.param("station,speed_limit\n1,30\n",
                     "CREATE STREAM out AS SELECT ts FROM traffic;", "3:82",
                     "cannot load table 'stations': ", id="missing-column"),
    ],
)  # fmt: skip
def test_join_errors_are_located(tmp_path: Path, csv: str, query: str, where: str,
                                 reason: str) -> None:  # fmt: skip
    (tmp_path / "stations.csv").write_text(csv)
    path, errors = check_text(tmp_path, TRAFFIC + TABLE + query)
    assert errors, "expected an error"
    assert str(errors[0]).startswith(f"{path}:{where}: {reason}"), errors[0].format()


def test_bad_csv_values_name_the_line(tmp_path: Path) -> None:
    with pytest.raises(RuleCheckError) as err:
        rules(tmp_path, "CREATE STREAM out AS SELECT ts FROM traffic;",
              "station,segment,speed_limit\n1,north,30\n2,south,fast\n")  # fmt: skip
    message = str(err.value)
    assert "stations.csv:3: column 'speed_limit' is DOUBLE, but the value there is not one" in (
        message
    )
    assert "fast" not in message  # a file's content is never quoted


def test_join_over_a_cql_rows_window_joins_the_window(tmp_path: Path) -> None:
    # CQL joins the window's tuples: [ROWS 2] is the last two readings of the stream, a
    # reading without a registry row included (it takes a place, then joins nothing).
    query = (
        "CREATE STREAM out AS SELECT RSTREAM(t.station, segment) "
        "FROM traffic [ROWS 2] t JOIN stations s ON s.station = t.station;"
    )
    got = [(o.ts, o.row) for o in run(rules(tmp_path, query).plan, READINGS).outputs]
    north, south = {"station": 1, "segment": "north"}, {"station": 2, "segment": "south"}
    ramp = {"station": 2, "segment": "south-ramp"}
    assert got == [
        (1 * S, north),
        (2 * S, north), (2 * S, south), (2 * S, ramp),
        (3 * S, south), (3 * S, ramp),  # stations 2 and 4: 4 joins nothing
        # at 4 s, stations 4 and NULL: R is empty (nothing to stream)
        (5 * S, {"station": 3, "segment": None}),
    ]  # fmt: skip
