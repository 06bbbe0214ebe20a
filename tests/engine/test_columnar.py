"""The columnar runners give exactly the per-row runners' rows.

Hypothesis draws a rule (an OVER window of any frame and emit policy the columnar path
computes, an extent window, or a query without a window; each with a stateless query
reading its output, which tests the numbering of rows) and a stream of readings with
exact ties in time, disorder within the slack, NULL arguments and heartbeats. The
pipeline runs it twice: with the columnar runners, and with every stage forced onto
the per-row runner (the evaluators the oracle suites hold to SQL:2003, CQL and WID).
Cut into random batches, and rebuilt from its state store between batches (an engine
restart), the columnar pipeline must emit the same rows: same sinks, event times, tie
order (source, seq) and values (floats to 1e-9 against the per-row runners' sums, and to
the last bit against the columnar pipeline run in one batch).
"""

from __future__ import annotations

import math
import pickle
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import engine.core.columnar.expiry as expiry
import engine.core.columnar.frames as frames
import engine.core.columnar.over as over
import engine.core.columnar.short_rows as short_rows
import engine.core.planner.runners as planner
from engine.core.columnar import ops
from engine.core.columnar.stage import ColumnarRunner
from engine.core.held import Released
from engine.core.key_index import KEY_STATE
from engine.core.pipeline import HEARTBEAT, Pipeline
from engine.core.plan import Plan
from engine.core.replay import arrival_table
from engine.core.runners import SLICE_PAGE, emitted_outputs
from engine.core.schema import arrival_type
from engine.core.state import MemoryStore
from rules.language.loader import load_rules
from tests.examples import examples

STREAM = """CREATE STREAM traffic (station INT, lane INT, speed DOUBLE, name STRING, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings';
"""
AGGREGATES = [
    "count(*) AS n",
    "count(speed) AS n_speed",
    "sum(speed) AS total",
    "avg(speed) AS mean",
    "min(speed) AS low",
    "max(speed) AS high",
    "sum(lane) AS lanes",
    "max(name) AS last_name",
]


def over_rule_text(calls: list[str], over: str) -> str:
    """A stream of ``calls`` (``agg AS name``) ``over`` one window, and an alert on it."""
    columns = ", ".join(f"{c.split(' AS ')[0]} {over} AS {c.split(' AS ')[1]}" for c in calls)
    first = calls[0].split(" AS ")[1]
    return (
        f"CREATE STREAM out AS SELECT station, lane, ts, speed, {columns} FROM traffic;\n"
        f"CREATE ALERT watch SEVERITY warning AS SELECT station, ts, {first} FROM out "
        f"WHERE {first} IS NOT NULL AND lane > 1;\n"
    )


@st.composite
def over_rule(draw: st.DrawFn) -> str:
    rows = draw(st.booleans())
    if draw(st.integers(0, 4)) == 0:
        frame = f"{'ROWS' if rows else 'RANGE'} UNBOUNDED PRECEDING"
    elif rows:
        frame = f"ROWS {draw(st.integers(0, 5))} PRECEDING"
    else:
        span = draw(st.sampled_from(["250 MILLISECONDS", "1 SECONDS", "2 SECONDS", "3 SECONDS"]))
        frame = f"RANGE {span} PRECEDING"
    slide = draw(st.sampled_from(["", "", "rows", "time"]))
    if slide == "rows":
        frame += f" SLIDE {draw(st.integers(1, 4))}"
    elif slide == "time":
        frame += f" SLIDE {draw(st.sampled_from([1, 2, 5]))} SECONDS"
    partition = draw(st.sampled_from(["PARTITION BY station ", ""]))
    calls = draw(st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=4, unique=True))
    return over_rule_text(calls, f"OVER ({partition}{frame})")


@st.composite
def extent_rule(draw: st.DrawFn) -> str:
    slide = draw(st.sampled_from([1, 2, 3]))
    span = slide * draw(st.integers(1, 3))
    group = draw(st.sampled_from(["GROUP BY station", ""]))
    keys = "station, " if group else ""
    calls = draw(st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=3, unique=True))
    window = f"[RANGE {span} SECONDS SLIDE {slide} SECONDS]"
    return (
        f"CREATE STREAM out AS SELECT {keys}window_start, window_end, {', '.join(calls)} "
        f"FROM traffic {window} {group};\n"
        f"CREATE ALERT watch SEVERITY warning AS SELECT window_end, {calls[0].split(' AS ')[1]} "
        f"FROM out WHERE {calls[0].split(' AS ')[1]} IS NOT NULL;\n"
    )


SILENCE = (
    "CREATE AGGREGATE silence(ts TIMESTAMP) RETURNS TIMESTAMP LANGUAGE PYTHON AS "
    "'rules.udas:Silence';\n"
    "CREATE STREAM out AS SELECT station, lane, ts, silence(ts) OVER (PARTITION BY station "
    "RANGE {span} PRECEDING ACTIVE EXPIRATION) AS last_seen FROM traffic;\n"
    "CREATE ALERT watch SEVERITY warning AS SELECT station, last_seen FROM out "
    "WHERE lane > 1;\n"
)
silence_rule = st.sampled_from(["250 MILLISECONDS", "1 SECONDS", "3 SECONDS"]).map(
    lambda span: SILENCE.format(span=span)
)
MISSED_DOOR = (
    "CREATE AGGREGATE missed_door(door STRING, next_door STRING) RETURNS STRING LANGUAGE "
    "PYTHON AS 'rules.udas:MissedDoor';\n"
    "CREATE STREAM out AS SELECT station, lane, ts, missed_door(name, 'b') OVER (PARTITION BY "
    "station RANGE {span} PRECEDING ACTIVE EXPIRATION) AS last_door FROM traffic;\n"
    "CREATE ALERT watch SEVERITY warning AS SELECT station, last_door FROM out "
    "WHERE lane > 1;\n"
)
missed_door_rule = st.sampled_from(["250 MILLISECONDS", "1 SECONDS", "3 SECONDS"]).map(
    lambda span: MISSED_DOOR.format(span=span)
)

STATELESS = (
    "CREATE STREAM out AS SELECT station, ts, speed * 2 AS doubled FROM traffic "
    "WHERE lane IN (1, 2) OR speed IS NULL;\n"
    "CREATE ALERT watch SEVERITY warning AS SELECT station, ts FROM out WHERE doubled > 10;\n"
)

reading = st.tuples(
    st.integers(0, 40).map(lambda n: n * 250),  # a grid: exact ties
    st.sampled_from([1, 2, 3]),
    st.integers(1, 3),
    st.one_of(st.none(), st.sampled_from([0.5, 3.0, 7.25, 11.0, 2.0])),
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["p", "q"]),
    st.booleans().map(lambda b: b and False),  # no heartbeat by default
)
stream_strategy = st.lists(
    st.one_of(reading, reading.map(lambda r: (*r[:-1], True))), min_size=1, max_size=60
)


def arrivals(items: list[tuple]) -> list[pa.Table]:
    """The readings (and heartbeats) in arrival order, with disorder within the slack
    kept (a reading more than the slack behind the latest is dropped from the draw:
    lateness is not what this test is about)."""
    rows: list[dict[str, Any]] = []
    latest = None
    for seq, (ts, station, lane, speed, name, source, beat) in enumerate(items):
        ts += 1_000_000
        if latest is not None and ts < latest - 2_000:
            continue
        latest = ts if latest is None else max(latest, ts)
        rows.append(
            {
                "station": station,
                "lane": lane,
                "speed": speed,
                "name": name,
                "ts": ts,
                "source": source,
                "seq": seq,
                HEARTBEAT: beat,
            }
        )
    return rows


def plan_of(rule: str) -> Plan:
    """The plan of ``rule`` over the test's stream."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rule.sql"
        path.write_text(STREAM + rule)
        return load_rules([path]).plan


def run(
    rule: str,
    rows: list[dict],
    cuts: list[int],
    restart: bool,
    between: Callable[[], None] | None = None,
    store: MemoryStore | None = None,
    tables: list[pa.Table] | None = None,
) -> list[tuple]:
    """Every output of ``rule`` over ``rows`` cut into batches at ``cuts``, the pipeline
    rebuilt from its store (``store``, or a new one) before each batch if ``restart``
    (``between()`` called first, after the first batch: the planner may then choose
    other runners); the emitted tables go to ``tables`` too."""
    plan = plan_of(rule)
    schema = plan.streams["traffic"]
    store = MemoryStore() if store is None else store
    pipeline = Pipeline(plan, store=store)
    out = []
    for start, end in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        if start and between is not None:
            between()
        if restart:
            pipeline = Pipeline(plan, store=store)
        table = arrival_table(schema, rows[start:end])
        beats = pa.array([r[HEARTBEAT] for r in rows[start:end]], pa.bool_())
        table = table.set_column(table.column_names.index(HEARTBEAT), HEARTBEAT, beats)
        out += pipeline.process({"traffic": table}).outputs
        pipeline.save()
    out += pipeline.finish().outputs
    if tables is not None:
        tables += [emitted.table for emitted in out]
    flat = [
        (o.sink, o.ts, o.source, o.seq, o.row)
        for emitted in out
        for _, o in emitted_outputs(emitted)
    ]
    return sorted(flat, key=lambda o: (o[0], o[2], o[3]))


def drawn_cuts(rows: list[dict], seed: int, most: int, fewest: int = 1) -> list[int]:
    """Between ``fewest`` and ``most`` batch cuts of ``rows`` (as many as they allow),
    drawn from ``seed``."""
    rng = random.Random(seed)
    count = min(rng.randint(fewest, most), max(len(rows) - 1, 0))
    return sorted(rng.sample(range(1, len(rows)), count))


def per_row_rows(per_row: dict[str, bool], rule: str, rows: list[dict]) -> list[tuple]:
    """The oracle: ``rule``'s rows over ``rows`` in one batch, every stage on the per-row
    runner (``per_row``: the fixture's switch)."""
    per_row["on"] = True
    try:
        return run(rule, rows, [], restart=False)
    finally:
        per_row["on"] = False


def same_row(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for name, x in a.items():
        y = b[name]
        if isinstance(x, float) or isinstance(y, float):
            if x is None or y is None:
                if x is not y:
                    return False
            elif not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9):
                return False
        elif x != y:
            return False
    return True


@pytest.fixture
def per_row(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A switch that forces every stage onto the per-row runner while it is on."""
    original = planner.columnar
    state = {"on": False}
    monkeypatch.setattr(planner, "columnar", lambda stage: not state["on"] and original(stage))
    return state


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    rule=st.one_of(over_rule(), extent_rule(), silence_rule, missed_door_rule, st.just(STATELESS)),
    items=stream_strategy,
    seed=st.integers(0, 10**6),
    restart=st.booleans(),
    slices=st.sampled_from([None, 1, 3, 8, 30]),
)
@example(  # the next reading of a key exactly the range later: no silence
    rule=SILENCE.format(span="250 MILLISECONDS"),
    items=[(t, 1, 2, 1.0, "a", "p", False) for t in (0, 250, 600)],
    seed=0,
    restart=False,
    slices=None,
)
@example(  # a repeat at the first door within the range: only the repeat alarms
    rule=MISSED_DOOR.format(span="1 SECONDS"),
    items=[(t, 1, 2, 1.0, "a", "p", False) for t in (0, 1000, 2250)],
    seed=0,
    restart=False,
    slices=None,
)
@example(  # a read at the next door within the range settles the first: no alarm
    rule=MISSED_DOOR.format(span="1 SECONDS"),
    items=[(0, 1, 2, 1.0, "a", "p", False), (750, 1, 2, 1.0, "b", "p", False)],
    seed=0,
    restart=False,
    slices=None,
)
@example(  # a physical landmark over exact ties: each tie reads its own count
    rule=(
        "CREATE STREAM out AS SELECT station, lane, ts, speed, count(*) OVER (ROWS UNBOUNDED "
        "PRECEDING) AS n FROM traffic;\n"
        "CREATE ALERT watch SEVERITY warning AS SELECT station, ts, n FROM out "
        "WHERE n IS NOT NULL AND lane > 1;\n"
    ),
    items=[(t, 1, 2, 1.0, "a", src, False) for t, src in ((0, "q"), (250, "q"), (250, "p"))],
    seed=0,
    restart=False,
    slices=None,
)
@example(  # a long ROWS frame's last slice takes the next batches' rows, across restarts
    rule=(
        "CREATE STREAM out AS SELECT station, lane, ts, speed, sum(speed) OVER (PARTITION BY "
        "station ROWS 3 PRECEDING) AS total FROM traffic;\n"
        "CREATE ALERT watch SEVERITY warning AS SELECT station, ts, total FROM out "
        "WHERE total IS NOT NULL AND lane > 1;\n"
    ),
    items=[(t * 500, 1 + t % 2, 2, 0.5 * (t % 7), "a", "p", False) for t in range(40)],
    seed=5,  # four cuts
    restart=True,
    slices=30,
)
def test_columnar_runners_give_the_per_row_rows(
    per_row, monkeypatch, rule, items, seed, restart, slices
) -> None:
    # `slices` rows per slice: every ROWS frame of 1 row or more keeps its rows in slices
    # (a long frame's storage, at a size the drawn streams cross many times).
    monkeypatch.setattr(planner, "SLICED_ROWS_FROM", 10**9 if slices is None else 1)
    monkeypatch.setattr(frames, "SLICE_ROWS", slices or frames.SLICE_ROWS)
    rows = arrivals(items)
    cuts = drawn_cuts(rows, seed, most=4, fewest=0)
    expected = per_row_rows(per_row, rule, rows)
    got = run(rule, rows, cuts, restart)
    assert [o[:4] for o in got] == [o[:4] for o in expected], rule
    for g, e in zip(got, expected, strict=True):
        assert same_row(g[4], e[4]), (rule, g, e)
    # However the batches are cut, the columnar rows are the same to the last bit (live
    # and replay cut them differently, and alert ids hash the values).
    assert run(rule, rows, [], restart=False) == got


def test_the_library_runs_its_windows_per_column() -> None:
    """Every stage of the traffic and RFID libraries runs per column but those of
    user-defined aggregates whose values do not come from the newest tuple alone
    (``newest_only``: ``missed_shipping``'s runs per column)."""
    plan = load_rules([Path(__file__).resolve().parents[2] / "rules"]).plan
    row_stages = {s.name for s in plan.stages() if not planner.columnar(s)}
    assert row_stages == {"packing_groups", "larceny"}


@pytest.mark.parametrize("arranged", [False, True])
def test_a_runner_holds_its_rows_at_or_past_the_watermark(arranged: bool) -> None:
    """A runner advanced to w evaluates its rows before w, in key and tie order, and
    holds the rest for a later advance, however the rows came."""
    plan = plan_of(
        "CREATE STREAM out AS SELECT station, ts, count(*) OVER (PARTITION BY station "
        "ROWS 1 PRECEDING) AS n FROM traffic;\n"
    )
    pipeline = Pipeline(plan)
    ((index, _),) = pipeline.stages
    runner = pipeline.runners[index]
    assert isinstance(runner, ColumnarRunner)
    rows = [{"station": s, "ts": t, "source": "a", "seq": t} for s, t in
            [(2, 3000), (1, 2000), (2, 1000), (1, 2500), (1, 1000)]]  # fmt: skip
    table = arrival_table(plan.streams["traffic"], rows).drop_columns([HEARTBEAT])
    if arranged:  # as the pipeline hands a source stream's released rows
        tie = np.asarray(ops.sort_order(table, ["ts", "source", "seq"]))
        table = Released(table, tie).arranged(["station"])
    runner.insert(table, arranged=arranged)

    def advanced(watermark: int) -> list[tuple[int, int, int]]:
        return [(o.row["station"], o.ts, o.row["n"]) for emitted in runner.advance(watermark)
                for _, o in emitted_outputs(emitted)]  # fmt: skip

    assert advanced(2500) == [(1, 1000, 1), (1, 2000, 2), (2, 1000, 1)]
    assert advanced(2500) == []
    assert advanced(3001) == [(1, 2500, 2), (2, 3000, 2)]


def test_a_rows_frame_run_by_its_time_slide_keeps_its_columns() -> None:
    """A key run by its slot's close, with no rows, joined its kept rows' float column
    with an empty integer one: the next batch's extremes then failed on objects."""
    rule = (
        "CREATE STREAM out AS SELECT station, lane, ts, speed, count(speed) OVER (PARTITION "
        "BY station ROWS 1 PRECEDING SLIDE 1 SECONDS) AS n FROM traffic;\n"
        "CREATE ALERT watch SEVERITY warning AS SELECT station, ts, n FROM out "
        "WHERE n IS NOT NULL AND lane > 1;\n"
    )
    items = [(0, 1, 1, None, "a", "p", False)] * 6
    items += [(t, 1, 1, None, "a", "p", False) for t in (5000, 7250, 8000)]
    rows = arrivals(items)
    assert run(rule, rows, [3, 5, 8], restart=False) == run(rule, rows, [], restart=False)


def test_a_closing_slot_beside_other_keys_new_rows(per_row) -> None:
    """In one advance station 2's held row leaves (its slot closed, no new rows of its
    own) while station 1's new rows leave too: each row is numbered as its own key's."""
    rule = (
        "CREATE STREAM out AS SELECT station, lane, ts, speed, count(*) OVER (PARTITION "
        "BY station RANGE 2 SECONDS PRECEDING SLIDE 1 SECONDS) AS n FROM traffic;\n"
        "CREATE ALERT watch SEVERITY warning AS SELECT station, ts, n FROM out "
        "WHERE lane > 1;\n"
    )
    # The first batch's watermark (0.5 s) makes station 2's row final; its slot
    # [0 s, 1 s) is still open, so the row waits. The second's (2 s) closes that slot and
    # station 1's [1 s, 2 s).
    items = [(0, 2, 2, 1.0, "a", "p", False), (2500, 3, 2, 1.0, "a", "p", False)]
    items += [(t, 1, 2, 1.0, "a", "p", False) for t in (1000, 1250, 4000)]
    rows = arrivals(items)
    expected = per_row_rows(per_row, rule, rows)
    assert run(rule, rows, [2], restart=False) == expected


def test_a_range_frame_over_many_slices_reads_each_slices_extremes(
    per_row, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A RANGE frame stored one row a slice: each row's frame starts inside one slice
    and spans several later ones, whose least and greatest values it must take in (the
    random streams rarely make frames that long)."""
    monkeypatch.setattr(frames, "SLICE_ROWS", 1)
    rule = (
        "CREATE STREAM out AS SELECT station, lane, ts, speed, min(speed) OVER (PARTITION BY "
        "station RANGE 3 SECONDS PRECEDING) AS low, max(speed) OVER (PARTITION BY station "
        "RANGE 3 SECONDS PRECEDING) AS high FROM traffic;\n"
        "CREATE ALERT watch SEVERITY warning AS SELECT station, ts, low, high FROM out "
        "WHERE lane > 1;\n"
    )
    speeds = [3.0, 11.0, 0.5, 7.25, 2.0]
    items = [(t * 250, 1, 2, speeds[t * 3 % 5], "a", "p", False) for t in range(40)]
    rows = arrivals(items)
    expected = per_row_rows(per_row, rule, rows)
    assert run(rule, rows, [10, 20, 30], restart=True) == expected


sort_column = st.sampled_from(
    [
        (pa.int32(), st.one_of(st.none(), st.integers(-3, 3))),
        (pa.int64(), st.integers(-(2**40), 2**40)),
        (pa.uint8(), st.one_of(st.none(), st.integers(0, 255))),
        (pa.string(), st.one_of(st.none(), st.sampled_from(["", "a", "ab", "b", "é", "Z"]))),
        (pa.float64(), st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, float("nan")]))),
    ]
)


@settings(max_examples=examples(200), deadline=None)
@given(data=st.data(), kinds=st.lists(sort_column, min_size=1, max_size=4))
def test_sort_order_is_arrows_stable_sort(data: st.DataObject, kinds: list) -> None:
    """The runners' sort by key and tie order (integer ranks in one ``np.lexsort`` or
    one composite key) orders rows as ``Table.sort_by`` does: NULLs last, ties kept;
    also rows already in order by some last columns (then sorted by the others alone)."""
    n = data.draw(st.integers(0, 40))
    columns = {
        f"c{i}": pa.array(data.draw(st.lists(values, min_size=n, max_size=n)), kind)
        for i, (kind, values) in enumerate(kinds)
    }
    table = pa.table({**columns, "position": pa.array(range(n), pa.int64())})
    names = list(columns)
    ordered_by = names[data.draw(st.integers(0, len(names))) :]
    if ordered_by:
        table = table.sort_by([(name, "ascending") for name in ordered_by])
    expected = table.sort_by([(name, "ascending") for name in names]).column("position")
    got = table.take(ops.sort_order(table, names)).column("position")
    assert got.to_pylist() == expected.to_pylist()


@settings(max_examples=examples(200), deadline=None)
@given(
    values=st.lists(
        st.one_of(
            st.integers(-3, 3), st.integers(-(2**40), 2**40), st.integers(-(2**63), 2**63 - 1)
        ),
        max_size=60,
    )
)
def test_stable_argsort_is_numpys_stable_sort(values: list[int]) -> None:
    """Ties keep their order whether the span allows the quicksort or not."""
    array = np.array(values, dtype=np.int64)
    assert ops.stable_argsort(array).tolist() == np.argsort(array, kind="stable").tolist()


key_value = st.one_of(st.none(), st.integers(0, 3))


@settings(max_examples=examples(200), deadline=None)
@given(
    table=st.lists(st.tuples(key_value, key_value, st.integers(0, 9)), max_size=8),
    stream=st.lists(st.tuples(key_value, key_value), max_size=30),
    two_keys=st.booleans(),
    left=st.booleans(),
    constant=st.one_of(st.none(), key_value),
)
def test_a_batch_join_gives_each_rows_matches(table, stream, two_keys, left, constant) -> None:
    """The batch join (each distinct key looked up once, rows expanded from its matches)
    gives every input row its matches in the table's order, as the per-row join does:
    duplicate table keys, NULL keys on either side, two key columns, LEFT, a constant key."""
    from engine.core.plan import LookupJoin

    keys: list[tuple[Any, str]] = [(lambda row: row["a"], "x")]
    vectors: list[Any] = [lambda t: t.column("a")]
    if two_keys:
        keys.append((lambda row: row["b"], "y"))
        vectors.append(lambda t: t.column("b"))
    if constant is not None:  # a constant stream-side expression, as a scalar
        keys.append((lambda row: constant, "y"))
        vectors.append(lambda t: pa.scalar(constant, pa.int64()))
    op = LookupJoin("t", "s", ("x", "y", "z"), tuple(table), tuple(keys), left,
                    tuple(vectors))  # fmt: skip
    rows = [{"a": a, "b": b, "i": i} for i, (a, b) in enumerate(stream)]
    batch = pa.table({n: pa.array([r[n] for r in rows], pa.int64()) for n in ("a", "b", "i")})
    joined, parents = ops.join(op, batch)
    expected = [(i, m) for i, row in enumerate(rows) for m in op.matches(row)]
    assert parents.tolist() == [i for i, _ in expected]
    assert joined.to_pylist() == [m for _, m in expected]


SHORT_CALLS = [
    "count(*) AS n",
    "count(speed) AS n_speed",
    "min(speed) AS low",
    "max(speed) AS high",
    "min(lane) AS least_lane",
    "max(name) AS last_name",
]


@st.composite
def short_rows_rule(draw: st.DrawFn) -> str:
    """An OVER window :class:`ShortRowsRunner` computes: a short ROWS frame, every row
    an output, counts and extremes."""
    preceding = draw(st.integers(0, 3) | st.integers(0, short_rows.SHORT_ROWS_BELOW - 2))
    partition = draw(st.sampled_from(["PARTITION BY station ", "PARTITION BY station, lane ", ""]))
    calls = draw(st.lists(st.sampled_from(SHORT_CALLS), min_size=1, max_size=3, unique=True))
    return over_rule_text(calls, f"OVER ({partition}ROWS {preceding} PRECEDING)")


@pytest.mark.slow
@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    rule=short_rows_rule(),
    # In time order mostly: the watermark passes a few rows of a key at a time.
    items=st.lists(reading, min_size=10, max_size=80).map(lambda r: sorted(r, key=lambda x: x[0])),
    seed=st.integers(0, 2**16),
)
def test_short_rows_frames_for_all_keys_at_once_give_the_per_row_rows(
    per_row, monkeypatch, rule, items, seed
) -> None:
    # Cut into batches, the pipeline rebuilt from its store between them: the rows of
    # the per-row runners, and, from a state the per-key OverRunner saved (an engine
    # that ran the earlier version), the same rows again.
    rows = arrivals(items)
    # Many cuts: keys that get fewer rows in an advance than their frames reach back.
    cuts = drawn_cuts(rows, seed, most=20)
    expected = per_row_rows(per_row, rule, rows)
    pipeline = Pipeline(plan_of(rule), store=MemoryStore())
    chosen = [r for r in pipeline.runners.values() if r.stage.query.sink.name == "out"]
    assert isinstance(chosen[0], short_rows.ShortRowsRunner)
    got = run(rule, rows, cuts, restart=True)
    assert got == expected, rule
    if cuts:
        original = planner.short_rows
        monkeypatch.setattr(planner, "short_rows", lambda window: False)
        legacy = run(rule, rows, cuts[:1], restart=True, between=lambda: monkeypatch.setattr(
            planner, "short_rows", original))  # fmt: skip
        assert legacy == expected, rule


@st.composite
def sliced_rule(draw: st.DrawFn) -> str:
    """An OVER window whose key keeps its rows in stored slices: a RANGE frame, or a ROWS
    frame (sliced whatever its length in the test below)."""
    if draw(st.booleans()):
        span = draw(st.sampled_from(["500 MILLISECONDS", "2 SECONDS", "4 SECONDS"]))
        frame = f"RANGE {span} PRECEDING"
    else:
        frame = f"ROWS {draw(st.integers(1, 8))} PRECEDING"
    frame += draw(st.sampled_from(["", " SLIDE 2", " SLIDE 1 SECONDS"]))
    partition = draw(st.sampled_from(["PARTITION BY station ", ""]))
    calls = draw(st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=3, unique=True))
    return over_rule_text(calls, f"OVER ({partition}{frame})")


@pytest.mark.slow
@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    rule=sliced_rule(),
    items=st.lists(reading, min_size=10, max_size=80).map(lambda r: sorted(r, key=lambda x: x[0])),
    seed=st.integers(0, 2**16),
    page=st.integers(1, 3),
)
def test_slice_descriptions_in_pages_across_many_restarts_give_the_per_row_rows(
    per_row, monkeypatch, rule, items, seed, page
) -> None:
    # Pages of 1 to 3 slices (a slice of 1 or 2 rows), many batches, the pipeline rebuilt
    # from its store before each: pages are written, read back and deleted many times.
    # Then the same from a state saved before pages (every slice described in the key's
    # own state), as an engine upgraded with its checkpoint finds it.
    monkeypatch.setattr(over, "PAGE_SLICES", page)
    monkeypatch.setattr(planner, "SLICED_ROWS_FROM", 1)
    monkeypatch.setattr(frames, "SLICE_ROWS", 2)
    rows = arrivals(items)
    cuts = drawn_cuts(rows, seed, most=20)
    expected = per_row_rows(per_row, rule, rows)
    store = MemoryStore()
    assert run(rule, rows, cuts, restart=True, store=store) == expected, rule
    # The store holds the pages of each key's kept slices, and no other.
    pages = {(e[1], e[2], e[3]) for e in store.entries if e[0] == SLICE_PAGE}
    held = set()
    for entry in store.entries:
        if entry[0] == KEY_STATE:
            kept = pickle.loads(store.entries[entry])[1][1]
            if isinstance(kept, tuple) and kept[0] == "paged":
                held |= {(entry[1], entry[2], p) for p in range(*kept[2])}
    assert pages == held, rule
    if cuts:
        paged = over.OverRunner._page
        unpaged = lambda self, text, kept, store: (  # noqa: E731
            "slices", over._described(kept.slices), kept.next_number)  # fmt: skip
        monkeypatch.setattr(over.OverRunner, "_page", unpaged)
        legacy = run(rule, rows, cuts[:3], restart=True, between=lambda: monkeypatch.setattr(
            over.OverRunner, "_page", paged))  # fmt: skip
        assert legacy == expected, rule


# A silence whose output carries the readings' columns: a kept tuple's NULLs and types.
TYPED_SILENCE = (
    "CREATE AGGREGATE silence(ts TIMESTAMP) RETURNS TIMESTAMP LANGUAGE PYTHON AS "
    "'rules.udas:Silence';\n"
    "CREATE STREAM out AS SELECT station, lane, speed, name, ts, silence(ts) OVER (PARTITION "
    "BY station RANGE {span} PRECEDING ACTIVE EXPIRATION) AS last_seen FROM traffic;\n"
)


def saving_one_row_tables(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make the expiry runner save what it saved before its states were tuples (a key's
    newest tuple as a one-row Arrow table, no layouts); returns the undo."""
    shared = expiry.NewestExpiryRunner.shared

    def one_row_table(self: expiry.NewestExpiryRunner, key: tuple, store: Any) -> Any:
        kept = self.states[key]
        return None if kept is None else self._table(kept[-1], [kept])

    monkeypatch.setattr(expiry.NewestExpiryRunner, "dump", one_row_table)
    monkeypatch.setattr(expiry.NewestExpiryRunner, "shared", lambda self: None)

    def undo() -> None:
        monkeypatch.setattr(expiry.NewestExpiryRunner, "dump", ColumnarRunner.dump)
        monkeypatch.setattr(expiry.NewestExpiryRunner, "shared", shared)

    return undo


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    rule=st.one_of(
        silence_rule,
        missed_door_rule,
        st.sampled_from(["250 MILLISECONDS", "1 SECONDS"]).map(
            lambda span: TYPED_SILENCE.format(span=span)
        ),
    ),
    items=st.lists(reading, min_size=5, max_size=60),
    seed=st.integers(0, 2**16),
)
def test_kept_tuples_across_many_restarts_and_from_one_row_tables_give_the_per_row_rows(
    per_row, monkeypatch, rule, items, seed
) -> None:
    # Many batches, the pipeline rebuilt from its store before each: kept tuples are
    # saved, loaded and built into rows after restarts. Then the same from a state saved
    # as one-row tables (an engine upgraded in place finds its keys so).
    rows = arrivals(items)
    cuts = drawn_cuts(rows, seed, most=20)
    expected = per_row_rows(per_row, rule, rows)
    assert run(rule, rows, cuts, restart=True) == expected, rule
    if cuts:
        undo = saving_one_row_tables(monkeypatch)
        legacy = run(rule, rows, cuts[:3], restart=True, between=undo)
        assert legacy == expected, rule


@pytest.mark.parametrize("saved", ["not", "tuples", "one-row tables"])
def test_a_kept_tuple_expires_as_a_row_of_its_batchs_types(monkeypatch, saved: str) -> None:
    """Station 1's only reading (NULL speed and name) is kept, then expires in an advance
    that has no rows of it: its row is built from the kept values alone, with the types
    of the batch it came from (a NULL double a double, a NULL string a string), whether
    kept in memory, restored from tuples or from a one-row table saved before tuples."""
    rule = TYPED_SILENCE.format(span="1 SECONDS")
    # Station 2 every 500 ms: the first batch's watermark (about 500) keeps station 1's
    # reading, the second's (about 2000) expires it.
    items = [(0, 1, 2, None, None, "p", False)]
    items += [(t, 2, 2, 3.0, "b", "p", False) for t in range(0, 4001, 500)]
    rows = arrivals(items)
    undo = saving_one_row_tables(monkeypatch) if saved == "one-row tables" else None
    tables: list[pa.Table] = []
    got = run(rule, rows, [7], restart=saved != "not", between=undo, tables=tables)
    lone = [o for o in got if o[0] == "out" and o[4]["station"] == 1]
    assert [(o[1], o[4]) for o in lone] == [
        (1_001_000, {"station": 1, "lane": 2, "speed": None, "name": None, "ts": 1_000_000,
                     "last_seen": 1_000_000})
    ]  # fmt: skip
    built = [t for t in tables if 1 in t.column("station").to_pylist()]
    assert built and built[0].num_rows == 1  # built from the kept tuple alone
    stream = {c.name: arrival_type(c.type) for c in plan_of(rule).streams["traffic"].columns}
    assert stream["speed"] == pa.float64() and stream["name"] == pa.string()
    for table in tables:
        types = {f.name: f.type for f in table.schema}
        for name in ("station", "lane", "speed", "name", "ts"):
            assert types[name] == stream[name], (name, table.schema)
        assert types["last_seen"] == pa.int64(), table.schema
