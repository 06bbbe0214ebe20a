"""Esper's regression cases for length windows with GROUP BY, replayed through Lookout.

Transcribed from Esper's `regression-lib/src/main/java/com/espertech/esper/regressionlib/
suite/resultset/querytype/ResultSetQueryTypeRowPerGroup.java` (run by
`regression-run/.../suite/resultset/TestSuiteResultSetQueryType.java`): Esper's
``#length(n)`` is CQL's ``[ROWS n]`` (``#groupwin(k)#length(n)`` would be ``[PARTITION BY
k ROWS n]``), its insert stream (``istream``, the listener's new data) is read against
ISTREAM and its remove stream (old data) against DSTREAM. Each event is sent alone, so
each is one instant here (1 s apart, one source, in order).

Where the semantics differ (docs/rules.md, *Row windows with GROUP BY*): Esper reports
a group whose last event left the window once more in its new data, with NULL
aggregates (``count`` 0), and a group's first row with a NULL (``count`` 0) old row; in
CQL a group without tuples is not in R, so ISTREAM has no row for it (its last row goes
to DSTREAM) and DSTREAM has none for a new group. Every other row is Esper's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.core.replay import run
from rules.language.loader import load_rules

STREAM = """CREATE STREAM md (symbol STRING, price DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 0 SECONDS SOURCE 'lookout/md';
"""


def replay(tmp_path: Path, rule: str, events: list[tuple[str, float]]) -> list[set[tuple]]:
    """Per event sent, the set of rows the rule emitted at its instant."""
    (tmp_path / "r.sql").write_text(STREAM + rule + "\n")
    plan = load_rules([tmp_path / "r.sql"]).plan
    readings = [
        {"symbol": s, "price": p, "ts": 1000 * i, "source": "esper", "seq": i}
        for i, (s, p) in enumerate(events)
    ]
    per_event: list[set[tuple]] = [set() for _ in events]
    for out in run(plan, [("md", r) for r in readings]).outputs:
        if out.sink == "out":
            per_event[out.ts // 1000].add(tuple(_rounded(v) for v in out.row.values()))
    return per_event


def _rounded(v: Any) -> Any:
    return round(v, 9) if isinstance(v, float) else v


def test_select_avg_expr_group_by(tmp_path: Path) -> None:
    """``ResultSetQueryTypeSelectAvgExprGroupBy``: ``select istream avg(price) as aprice,
    symbol from SupportMarketDataBean#length(2) group by symbol``."""
    events = [("A", 1), ("B", 3), ("B", 5), ("A", 10), ("A", 20)]
    rule = (
        "CREATE STREAM out AS SELECT ISTREAM(avg(price) AS aprice, symbol) "
        "FROM md [ROWS 2] GROUP BY symbol;"
    )
    # Esper's new data: {1.0 A}; {3.0 B}; {null A}, {4.0 B}; {10.0 A}, {5.0 B};
    # {15.0 A}, {null B}. The null rows are the groups that left (A at the third
    # event, B at the fifth): not in CQL's R, so not in ISTREAM.
    assert replay(tmp_path, rule, events) == [
        {(1.0, "A")},
        {(3.0, "B")},
        {(4.0, "B")},
        {(10.0, "A"), (5.0, "B")},
        {(15.0, "A")},
    ]
    # The groups that left are DSTREAM's, with their last row (and every changed row's
    # old value, as Esper's old data has them).
    dstream = replay(tmp_path, rule.replace("ISTREAM", "DSTREAM"), events)
    assert dstream == [
        set(),
        set(),
        {(1.0, "A"), (3.0, "B")},
        {(4.0, "B")},
        {(10.0, "A"), (5.0, "B")},
    ]


@pytest.mark.parametrize("r2s", ["ISTREAM", "DSTREAM"])
def test_row_per_group_sum_one_view(tmp_path: Path, r2s: str) -> None:
    """``ResultSetQueryTypeRowPerGroupSumOneView`` (``tryAssertionSum``): ``select
    irstream symbol, sum(price) as mySum, avg(price) as myAvg from
    SupportMarketDataBean#length(3) where symbol='DELL' or symbol='IBM' or symbol='GE'
    group by symbol``.

    Esper's WHERE filters the window's output, so the AAA events stay in the window and
    push DELL's and IBM's out: CQL's WHERE over a window's tuples. Lookout refuses WHERE
    with aggregates over ``[ROWS n]``; since the condition reads only the grouping
    column, HAVING on the groups says the same."""
    events = [
        ("DELL", 10), ("DELL", 20), ("DELL", 100), ("DELL", 50), ("DELL", 5),
        ("AAA", 1000), ("IBM", 70), ("AAA", 2000), ("AAA", 3000), ("AAA", 4000),
    ]  # fmt: skip
    rule = (
        f"CREATE STREAM out AS SELECT {r2s}(symbol, sum(price) AS mySum, avg(price) AS myAvg) "
        "FROM md [ROWS 3] GROUP BY symbol HAVING symbol IN ('DELL', 'IBM', 'GE');"
    )
    # Esper's (new, old) per event; None is its NULL-aggregate row of a group that has
    # no event in the window, before its first or after its last (not in CQL's R).
    esper: list[tuple[set[tuple], set[tuple]]] = [
        ({("DELL", 10.0, 10.0)}, {("DELL", None, None)}),
        ({("DELL", 30.0, 15.0)}, {("DELL", 10.0, 10.0)}),
        ({("DELL", 130.0, 130 / 3)}, {("DELL", 30.0, 15.0)}),
        ({("DELL", 170.0, 170 / 3)}, {("DELL", 130.0, 130 / 3)}),  # 20 + 100 + 50
        ({("DELL", 155.0, 155 / 3)}, {("DELL", 170.0, 170 / 3)}),  # 100 + 50 + 5
        ({("DELL", 55.0, 27.5)}, {("DELL", 155.0, 155 / 3)}),  # 50 + 5: AAA pushed 100 out
        ({("DELL", 5.0, 5.0), ("IBM", 70.0, 70.0)}, {("DELL", 55.0, 27.5), ("IBM", None, None)}),
        ({("DELL", None, None)}, {("DELL", 5.0, 5.0)}),  # DELL's last event left
        (set(), set()),  # "assertListenerNotInvoked"
        ({("IBM", None, None)}, {("IBM", 70.0, 70.0)}),  # IBM's left
    ]
    side = 0 if r2s == "ISTREAM" else 1
    want = [{_row(r) for r in pair[side] if r[1] is not None} for pair in esper]
    assert replay(tmp_path, rule, events) == want


def _row(values: tuple) -> tuple:
    return tuple(_rounded(v) for v in values)


@pytest.mark.parametrize("r2s", ["ISTREAM", "DSTREAM"])
def test_aggregation_over_grouped_props(tmp_path: Path, r2s: str) -> None:
    """``ResultSetQueryTypeAggregationOverGroupedProps``: ``select irstream
    symbol, price, count(price) as mycount from SupportMarketDataBean#length(5) group by
    symbol, price order by symbol asc`` (grouped by two columns, one of them the
    aggregated one)."""
    events = [("DELL", 10), ("DELL", 11), ("DELL", 10), ("IBM", 5), ("IBM", 5), ("IBM", 5)]
    events += [("IBM", 5)]
    rule = (
        f"CREATE STREAM out AS SELECT {r2s}(symbol, price, count(price) AS mycount) "
        "FROM md [ROWS 5] GROUP BY symbol, price;"
    )
    # Esper's (new, old) per event: count 0 is its row of a group with no event in the
    # window (the old row of a new group; the new row of DELL 11 after it left).
    esper: list[tuple[set[tuple], set[tuple]]] = [
        ({("DELL", 10.0, 1)}, {("DELL", 10.0, 0)}),
        ({("DELL", 11.0, 1)}, {("DELL", 11.0, 0)}),
        ({("DELL", 10.0, 2)}, {("DELL", 10.0, 1)}),
        ({("IBM", 5.0, 1)}, {("IBM", 5.0, 0)}),
        ({("IBM", 5.0, 2)}, {("IBM", 5.0, 1)}),
        # the sixth event pushes the first DELL 10 out
        ({("DELL", 10.0, 1), ("IBM", 5.0, 3)}, {("DELL", 10.0, 2), ("IBM", 5.0, 2)}),
        # the seventh pushes DELL 11 out: Esper's new data has it with count 0
        ({("DELL", 11.0, 0), ("IBM", 5.0, 4)}, {("DELL", 11.0, 1), ("IBM", 5.0, 3)}),
    ]
    side = 0 if r2s == "ISTREAM" else 1
    want = [{r for r in pair[side] if r[2] != 0} for pair in esper]
    assert replay(tmp_path, rule, events) == want
