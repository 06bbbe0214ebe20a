"""CQL relations of raw tuples from rule text: ``SELECT ISTREAM | DSTREAM | RSTREAM (...)
FROM s [window]`` without aggregates, compiled and replayed, against the brute-force
oracle of ``tests/engine/test_relations.py`` (R(τ) at every instant), plus known answers
and the forms the engine refuses (located errors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.plan import R2S, FrameUnits, RelationWindow
from engine.core.replay import run
from rules.language.loader import RuleCheckError, load_rules
from tests.engine.test_relations import oracle
from tests.examples import examples
from tests.rules.helpers import TRAFFIC

S = 1_000


def replay(path: Path, query: str, readings: list[tuple[int, int, float]]) -> list[tuple]:
    """(event time, row values) of sink ``out`` for (station, ts, speed) readings."""
    path.write_text(TRAFFIC + query)
    plan = load_rules([path]).plan
    data = [
        ("traffic", {"station": k, "lane": 1, "speed": v, "length": 4.0, "ts": ts})
        for k, ts, v in readings
    ]
    return [(o.ts, tuple(o.row.values())) for o in run(plan, data).outputs if o.sink == "out"]


def stamp(ms: int) -> str:
    """A rule TIMESTAMP literal for ``ms`` after the epoch."""
    return f"TIMESTAMP '1970-01-01T00:00:00.{ms:03d}Z'"


@st.composite
def forms(draw: Any) -> tuple[str, RelationWindow]:
    """A CQL window in rule text (durations in ms) and the relation window it means."""
    RANGE = FrameUnits.RANGE
    kind = draw(
        st.sampled_from(["range", "now", "lag", "slide", "unbounded", "reset", "band", "rows"])
    )
    r, n = draw(st.integers(1, 12)), draw(st.integers(1, 4))
    ms = "MILLISECONDS"
    if kind == "range":
        return f"[RANGE {r} {ms}]", RelationWindow(RANGE, range_ms=r)
    if kind == "now":
        return "[NOW]", RelationWindow(RANGE, range_ms=0)
    if kind == "lag":
        d = draw(st.integers(1, 9))
        return f"[RANGE {r} {ms} LAG {d} {ms}]", RelationWindow(RANGE, range_ms=r, lag_ms=d)
    if kind == "slide":
        s = draw(st.integers(1, 15))
        return f"[RANGE {r} {ms} SLIDE {s} {ms}]", RelationWindow(RANGE, range_ms=r, slide_ms=s)
    if kind == "unbounded":
        return "[RANGE UNBOUNDED]", RelationWindow(RANGE)
    if kind == "reset":
        p = draw(st.integers(1, 20))
        return f"[RANGE UNBOUNDED RESET EVERY {p} {ms}]", RelationWindow(RANGE, reset_every_ms=p)
    if kind == "band":
        lo, hi = draw(st.integers(0, 30)), draw(st.integers(31, 60))
        text, lower, upper = draw(
            st.sampled_from(
                [
                    (f"[SINCE {stamp(lo)}]", lo, None),
                    (f"[UNTIL {stamp(hi)}]", None, hi),
                    (f"[BETWEEN {stamp(lo)} AND {stamp(hi)}]", lo, hi),
                ]
            )
        )
        return text, RelationWindow(RANGE, since_ms=lower, until_ms=upper)
    if draw(st.booleans()):
        return f"[ROWS {n}]", RelationWindow(FrameUnits.ROWS, rows=n)
    window = RelationWindow(FrameUnits.ROWS, rows=n, partition_by=("station",))
    return f"[PARTITION BY station ROWS {n}]", window


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    form=forms(),
    r2s=st.sampled_from(list(R2S)),
    carry_ts=st.booleans(),
    where=st.booleans(),
    raw=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 1), st.integers(0, 2)), max_size=25),
    tied=st.booleans(),
)
def test_rule_relations_match_the_definitions(
    tmp_path: Path,
    form: tuple[str, RelationWindow],
    r2s: R2S,
    carry_ts: bool,
    where: bool,
    raw: list[tuple[int, int, int]],
    tied: bool,
) -> None:
    text, window = form
    if tied:  # five instants only: tuples enter and leave a ROWS window in runs of ties
        raw = [(ts % 5, k, v) for ts, k, v in raw]
    never_leaves = window.units is FrameUnits.RANGE and window.range_ms is None
    if r2s is R2S.DSTREAM and never_leaves and not window.reset_every_ms:
        return  # refused: nothing ever leaves (test_refused below)
    columns = "station, speed, ts" if carry_ts else "station, speed"
    query = (
        f"CREATE STREAM out AS SELECT {r2s.value}({columns}) FROM traffic {text}"
        + (" WHERE speed > 0" if where else "")
        + ";"
    )
    readings = [(k, ts, float(v)) for ts, k, v in sorted(raw)]
    got = sorted(replay(tmp_path / "r.sql", query, readings))
    rows = [{"ts": ts, "station": k, "speed": v, "seq": i} for i, (k, ts, v) in enumerate(readings)]

    def query_rows(x: dict) -> list[tuple]:
        if where and not x["speed"] > 0:
            return []
        return [(x["station"], x["speed"], x["ts"]) if carry_ts else (x["station"], x["speed"])]

    span = 50 + 2 * (window.range_ms or 0) + window.lag_ms + 2 * (window.slide_ms or 0) + 25
    assert got == oracle(window, r2s, rows, query_rows, span)


def test_dstream_of_a_range_window(tmp_path: Path) -> None:
    query = "CREATE STREAM out AS SELECT DSTREAM(station, ts) FROM traffic [RANGE 10 SECONDS];"
    got = replay(tmp_path / "r.sql", query, [(1, 0, 10.0), (2, 5 * S, 10.0)])
    # A tuple at t is in R up to t + 10 s inclusive: it leaves at t + 10 s + 1 ms.
    assert got == [(10 * S + 1, (1, 0)), (15 * S + 1, (2, 5 * S))]


def test_rstream_of_the_last_rows(tmp_path: Path) -> None:
    query = "CREATE STREAM out AS SELECT RSTREAM(ts) FROM traffic [ROWS 2] WHERE speed > 5;"
    got = replay(tmp_path / "r.sql", query, [(1, 0, 9.0), (1, S, 7.0), (2, 2 * S, 1.0)])
    # R is the last two tuples of the stream, then filtered (CQL: WHERE over the window):
    # at 2 s the tuple at 0 leaves and one the WHERE drops enters, so R is the tuple at
    # 1 s alone (filtering first would keep the one at 0).
    assert got == [(0, (0,)), (S, (0,)), (S, (S,)), (2 * S, (S,))]


def test_istream_of_a_partitioned_window_reports_changes(tmp_path: Path) -> None:
    query = (
        "CREATE STREAM out AS SELECT ISTREAM(station, speed) "
        "FROM traffic [PARTITION BY station ROWS 1];"
    )
    readings = [(1, 0, 9.0), (2, 0, 9.0), (1, S, 9.0), (1, 2 * S, 3.0), (2, 3 * S, 9.0)]
    got = replay(tmp_path / "r.sql", query, readings)
    # A station's latest speed, streamed when it changes.
    assert got == [(0, (1, 9.0)), (0, (2, 9.0)), (2 * S, (1, 3.0))]


def test_distinct_groups_of_a_window(tmp_path: Path) -> None:
    query = (
        "CREATE STREAM out AS SELECT ISTREAM(station) FROM traffic [RANGE 10 SECONDS] "
        "GROUP BY station;"
    )
    got = replay(tmp_path / "r.sql", query, [(1, 0, 9.0), (1, 5 * S, 9.0), (1, 20 * S, 9.0)])
    # The station enters the relation with its first tuple, leaves at 15 s + 1 ms (the
    # window empties) and enters again at 20 s.
    assert got == [(0, (1,)), (20 * S, (1,))]


def test_dstream_of_now_and_the_derived_event_time(tmp_path: Path) -> None:
    text = (
        "CREATE STREAM out AS SELECT DSTREAM(station, ts) FROM traffic [NOW];\n"
        "CREATE STREAM kept AS SELECT ISTREAM(station, ts) FROM traffic [RANGE 1 MINUTE];\n"
    )
    got = replay(tmp_path / "r.sql", text, [(1, 0, 9.0), (1, 1, 9.0)])
    plan = load_rules([tmp_path / "r.sql"]).plan
    # DSTREAM emits a row when it leaves, so its ts column is not the event time; an
    # ISTREAM row of a window tuples enter at their own time is emitted at its ts.
    assert plan.streams["out"].timestamp is None
    assert plan.streams["kept"].timestamp == "ts"
    assert got == [(1, (1, 0)), (2, (1, 1))]


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        (
            "CREATE STREAM out AS SELECT ISTREAM(ts) FROM traffic [RANGE 1 SECOND];",
            None,
        ),
        (
            "CREATE STREAM out AS SELECT station FROM traffic [RANGE 10 SECONDS];",
            "the engine cannot run the CQL window [RANGE] without ISTREAM, DSTREAM or RSTREAM",
        ),
        (
            "CREATE STREAM out AS SELECT DSTREAM(station) FROM traffic [RANGE UNBOUNDED];",
            "the engine cannot run DSTREAM(...) over the CQL window [UNBOUNDED] (no tuple ever",
        ),
        (
            "CREATE STREAM out AS SELECT ISTREAM(speed) FROM traffic "
            "[PARTITION BY station ROWS 2];",
            "without selecting station (the relation is kept per key",
        ),
        (
            "CREATE STREAM out AS SELECT DSTREAM(count(*) AS n) FROM traffic "
            "[RANGE 10 SECONDS] GROUP BY station;",
            "the engine cannot run DSTREAM(...) of a relation grouped by station without "
            "selecting station",
        ),
        (
            "CREATE STREAM out AS SELECT ISTREAM(ts) FROM traffic [ROWS 3 SLIDE 2];",
            "the engine cannot run the CQL window [ROWS] with a row SLIDE",
        ),
        (
            "CREATE STREAM out AS SELECT ISTREAM(station, window_end) FROM traffic "
            "[RANGE 10 SECONDS SLIDE 5 SECONDS];",
            "the engine cannot run window_end over the CQL window [RANGE] of tuples",
        ),
        (
            "CREATE STREAM out AS SELECT ISTREAM(station, count(*) AS n) FROM traffic "
            "[PARTITION BY station ROWS 3] WHERE speed > 3 GROUP BY station;",
            "the engine cannot run WHERE over the CQL window [PARTITION BY ... ROWS] with "
            "aggregates",
        ),
    ],
)
def test_refused(tmp_path: Path, query: str, reason: str | None) -> None:
    path = tmp_path / "r.sql"
    path.write_text(TRAFFIC + query)
    if reason is None:
        load_rules([path])  # accepted
        return
    with pytest.raises(RuleCheckError) as err:
        load_rules([path])
    message = str(err.value)
    assert reason in message
    assert f"{path}:3:" in message and "^" in message  # located, with a caret
