"""A batch's outputs as the tables store them (`engine.outputs.batch_tables`).

Whatever a batch emits (a derived stream's rows with every column type and NULLs, and
an alert's, interleaved), each table must get exactly its own rows: a derived stream's
typed as its Delta table (timestamps from epoch ms, with the (source, seq) tie order),
an alert's with its id, key and message.
"""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import tables
from engine.alerts import AlertSpec, alert_id
from engine.core.evaluator import Output
from engine.core.pipeline import BatchResult
from engine.core.plan import (
    AggCall,
    Column,
    ColumnType,
    FrameUnits,
    OverWindow,
    Plan,
    Query,
    Sink,
    SinkKind,
    StreamSchema,
)
from engine.core.runners import SinkColumns, SinkRows, key_json
from engine.outputs import batch_tables
from tests.engine.helpers import TRAFFIC, select
from tests.examples import examples

WINDOWS = StreamSchema(
    "windows",
    (
        Column("station", ColumnType.INT),
        Column("n", ColumnType.BIGINT),
        Column("avg_speed", ColumnType.DOUBLE),
        Column("lane", ColumnType.STRING),
        Column("jam", ColumnType.BOOLEAN),
        Column("window_end", ColumnType.TIMESTAMP),
    ),
    "window_end",
)
WINDOW = OverWindow(
    aggregates=(AggCall("count", (), "n"),),
    units=FrameUnits.ROWS,
    preceding=3,
    partition_by=("station",),
)
PLAN = Plan(
    {"traffic": TRAFFIC, "windows": WINDOWS},
    (
        Query(Sink("windows", SinkKind.STREAM), "traffic", window=WINDOW, post=(select("n"),)),
        Query(Sink("alarm", SinkKind.ALERT), "traffic", post=(select("station"),)),
    ),
)
ALARM = AlertSpec("alarm", "critical", "station {station}: {msg}")

stream_row = st.fixed_dictionaries(
    {
        "station": st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
        "n": st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        "avg_speed": st.one_of(st.none(), st.floats(allow_nan=False)),
        "lane": st.one_of(st.none(), st.text(max_size=5)),
        "jam": st.one_of(st.none(), st.booleans()),
        "window_end": st.one_of(st.none(), st.integers(0, 4_102_444_800_000)),
    }
)
alert_row = st.fixed_dictionaries({"station": st.integers(1, 9), "msg": st.text(max_size=5)})
# Runs of one sink's rows, as a stage emits them.
outputs_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("windows"), st.lists(stream_row, min_size=1, max_size=4)),
        st.tuples(st.just("alarm"), st.lists(alert_row, min_size=1, max_size=4)),
    ),
    max_size=12,
)


@settings(max_examples=examples(150), deadline=None)
@given(emitted=outputs_strategy, ts=st.integers(0, 10**12))
def test_each_table_gets_exactly_its_outputs(
    emitted: list[tuple[str, list[dict]]], ts: int
) -> None:
    stages = {q.sink.name: i for i, q in enumerate(PLAN.queries)}
    result = BatchResult()
    outputs: list[Output] = []  # every emitted row, in order
    for sink, rows in emitted:
        first = len(outputs)
        source = f'["{sink}",1]'
        run = [Output(sink, ts + first + i, row, source, first + i) for i, row in enumerate(rows)]
        outputs += run
        key = (1,) if sink == "windows" else ()
        built = SinkColumns()
        built.add(run, key_json(key))
        result.outputs.append(SinkRows(stages[sink], sink, built.table()))

    written = batch_tables(PLAN, {"alarm": ALARM}, result)

    assert set(written) == {o.sink if o.sink == "windows" else "alerts" for o in outputs}
    if "windows" in written:
        table = written["windows"]
        assert table.schema == tables.derived_schema(WINDOWS)

        def expected(o: Output) -> dict:
            end = o.row["window_end"]
            at = None if end is None else datetime.fromtimestamp(end / 1000, tz=UTC)
            return {**o.row, "window_end": at, "source": o.source, "seq": o.seq}

        assert table.to_pylist() == [expected(o) for o in outputs if o.sink == "windows"]
    if "alerts" in written:
        got = written["alerts"].to_pylist()
        want = [o for o in outputs if o.sink == "alarm"]
        assert [orjson.loads(g["payload"]) for g in got] == [o.row for o in want]
        assert [g["alert_id"] for g in got] == [
            alert_id("alarm", "", o.ts, o.row, o.source, o.seq) for o in want
        ]
        assert [g["message"] for g in got] == [
            f"station {o.row['station']}: {o.row['msg']}" for o in want
        ]
        assert {g["severity"] for g in got} == {"critical"}
