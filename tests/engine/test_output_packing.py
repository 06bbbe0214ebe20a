"""A stateful group's outputs packed per sink, read back as the driver reads them.

Whatever a group emits (outputs of a derived stream with every column type and NULLs,
and of an alert, interleaved, one by one or in runs as columns), each packed row must
name one sink, and reading all of a sink's payloads must give exactly that sink's
outputs: a derived stream's rows typed as its Delta table (timestamps from epoch ms),
an alert's as JSON with the group's key.
"""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import tables
from engine.core.evaluator import Output, OutputColumns
from engine.core.plan import Column, ColumnType, StreamSchema
from engine.spark.packing import read_ipc
from engine.spark.rules_job import packed_outputs

STREAM = StreamSchema(
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
# A run of one sink's rows, emitted one by one or (True) as one OutputColumns.
outputs_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("windows"), st.lists(stream_row, min_size=1, max_size=4), st.booleans()),
        st.tuples(st.just("alarm"), st.lists(alert_row, min_size=1, max_size=4), st.booleans()),
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(emitted=outputs_strategy, ts=st.integers(0, 10**12))
def test_each_sink_reads_back_its_outputs(
    emitted: list[tuple[str, list[dict], bool]], ts: int
) -> None:
    given_outputs: list[Output | OutputColumns] = []
    outputs: list[Output] = []  # the same, one by one
    for sink, rows, as_columns in emitted:
        first = len(outputs)
        run = [Output(sink, ts + first + i, row, "src", first + i) for i, row in enumerate(rows)]
        outputs += run
        if as_columns:
            columns = {name: [row[name] for row in rows] for name in rows[0]}
            times = [o.ts for o in run]
            given_outputs.append(OutputColumns(sink, times, columns, "src", first))
        else:
            given_outputs += run
    packed = packed_outputs(given_outputs, "station=1", {"windows": STREAM})

    assert sorted(row.sink for row in packed) == sorted({o.sink for o in outputs})
    by_sink = {row.sink: read_ipc(row.outputs) for row in packed}
    if "windows" in by_sink:
        table = by_sink["windows"]
        assert table.schema == tables.derived_schema(STREAM)

        def expected(o: Output) -> dict:
            end = o.row["window_end"]
            at = None if end is None else datetime.fromtimestamp(end / 1000, tz=UTC)
            return {**o.row, "window_end": at, "source": o.source, "seq": o.seq}

        want = [expected(o) for o in outputs if o.sink == "windows"]
        assert table.to_pylist() == want
    if "alarm" in by_sink:
        got = by_sink["alarm"].to_pylist()
        want = [
            {"ts": o.ts, "key": "station=1", "row": o.row, "source": o.source, "seq": o.seq}
            for o in outputs
            if o.sink == "alarm"
        ]
        assert [{**g, "row": orjson.loads(g["row"])} for g in got] == want
