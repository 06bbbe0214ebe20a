"""One sink's emitted rows gathered over a batch's keys (`engine.core.runners.SinkColumns`).

A runner hands the rows of many keys to one builder, as rows (:class:`Output`) or as
runs of columns (:class:`OutputColumns`), and builds one table at the end. The oracle
is the definition: each key's rows as their own table (every row's values, its event
time, tie order and key), concatenated in order with columns a part lacks as NULL.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.evaluator import Output, OutputColumns
from engine.core.runners import KEY, SEQ, SOURCE, TS, SinkColumns

NAMES = ["a", "b", "c"]
values = st.one_of(st.none(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False))


@st.composite
def parts(draw: st.DrawFn) -> tuple[list[Output] | OutputColumns, str]:
    """One key's rows: a list of outputs, or a run of columns, over some of the names."""
    key = draw(st.sampled_from(['["x"]', '["y"]', "[1]", "[]"]))
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, min_size=1))
    count = draw(st.integers(1, 4))
    ts = draw(st.lists(st.integers(0, 10**13), min_size=count, max_size=count))
    if draw(st.booleans()):
        columns = {n: draw(st.lists(values, min_size=count, max_size=count)) for n in names}
        return OutputColumns("s", ts, columns, f"stage-{key}", draw(st.integers(0, 99))), key
    rows = [
        Output("s", t, {n: draw(values) for n in draw(st.permutations(names))}, "src", i)
        for i, t in enumerate(ts)
    ]
    return rows, key


def oracle(added: list[tuple[list[Output] | OutputColumns, str]]) -> list[dict[str, Any]]:
    """The rows, one dict each, with every name any row has (None where it lacks it)."""
    rows: list[dict[str, Any]] = []
    for part, key in added:
        outputs = part.outputs() if isinstance(part, OutputColumns) else part
        for o in outputs:
            rows.append({**o.row, TS: o.ts, SOURCE: o.source, SEQ: o.seq, KEY: key})
    names = list(dict.fromkeys(n for r in rows for n in r))
    return [{n: r.get(n) for n in names} for r in rows]


@settings(max_examples=300, deadline=None)
@given(st.lists(parts(), min_size=1, max_size=6))
def test_one_table_holds_every_keys_rows_in_order(
    added: list[tuple[list[Output] | OutputColumns, str]],
) -> None:
    built = SinkColumns()
    for part, key in added:
        if isinstance(part, OutputColumns):
            built.add(part, key)
        else:
            for output in part:
                built.add_row(output, key)
    table = built.table()
    want = oracle(added)
    assert set(table.column_names) == set(want[0])
    got = table.to_pylist()
    assert [{n: r[n] for n in want[0]} for r in got] == want
    assert table.schema.field(TS).type == pa.int64()
    assert table.schema.field(KEY).type == pa.string()
