"""CQL tuple-based windows with any GROUP BY, from rule text, against a brute force
written from the CQL definitions (*An Abstract Semantics and Concrete Language for
Continuous Queries over Streams and Relations*, §5.1, §6.1.2-6.1.3).

``S [ROWS n]``: W(τ) is the n tuples with the largest timestamps ≤ τ (ties in (ts,
source, seq) order, CQL leaves them open); ``S [PARTITION BY p ROWS n]`` is the union of
each p's last n. The query's relation R(τ) is SQL's GROUP BY (and HAVING) over W(τ);
ISTREAM is R(τ) - R(p), DSTREAM R(p) - R(τ) (bags, p the previous instant with
arrivals), RSTREAM R(τ) at every instant with arrivals. Where every group lies inside one
partition (p among the GROUP BY columns) the relation is kept per p, so RSTREAM streams
a partition's groups at its own arrivals (docs/rules.md).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.replay import run
from rules.language.loader import RuleCheckError, load_rules
from tests.examples import examples

STREAM = """CREATE STREAM md (station INT, lane INT, speed DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 1 MINUTE SOURCE 'lookout/md';
"""
# (FROM window, its partition columns, GROUP BY columns)
FORMS = [
    ("[ROWS {n}]", (), ("lane",)),
    ("[ROWS {n}]", (), ("station", "lane")),
    ("[PARTITION BY station ROWS {n}]", ("station",), ("lane",)),
    ("[PARTITION BY station ROWS {n}]", ("station",), ()),
    ("[PARTITION BY station ROWS {n}]", ("station",), ("station", "lane")),
    ("[PARTITION BY lane ROWS {n}]", ("lane",), ("station",)),
]


def replay(tmp_path: Path, rule: str, readings: list[dict[str, Any]]) -> list[tuple]:
    """(event time, row values) of every row of sink ``out``."""
    (tmp_path / "r.sql").write_text(STREAM + rule)
    plan = load_rules([tmp_path / "r.sql"]).plan
    outputs = run(plan, [("md", dict(r)) for r in readings]).outputs
    return sorted((o.ts, tuple(o.row.values())) for o in outputs if o.sink == "out")


def aggregate(name: str, values: list[Any]) -> Any:
    """count(*), count, sum, max as SQL computes them (NULLs ignored)."""
    known = [v for v in values if v is not None]
    if name == "count(*)":
        return len(values)
    if name == "count":
        return len(known)
    if not known:
        return None
    return sum(known) if name == "sum" else max(known)


def brute_force(
    readings: list[dict[str, Any]],
    n: int,
    partition: tuple[str, ...],
    group: tuple[str, ...],
    calls: list[str],
    having: int | None,
    r2s: str,
) -> list[tuple]:
    """The CQL definition, instant by instant, per evaluator key (see the docstring)."""
    ordered = sorted(readings, key=lambda r: (r["ts"], r["source"], r["seq"]))
    kept_apart = partition if set(partition) <= set(group) else ()
    out: list[tuple] = []
    for key in {tuple(r[c] for c in kept_apart) for r in ordered}:
        mine = [r for r in ordered if tuple(r[c] for c in kept_apart) == key]
        previous: Counter[tuple] = Counter()
        for tau in sorted({r["ts"] for r in mine}):
            upto = [r for r in mine if r["ts"] <= tau]
            window = [
                r
                for p in {tuple(x[c] for c in partition) for x in upto}
                for r in [x for x in upto if tuple(x[c] for c in partition) == p][-n:]
            ]
            groups: dict[tuple, list[dict[str, Any]]] = {}
            for r in window:
                groups.setdefault(tuple(r[c] for c in group), []).append(r)
            current: Counter[tuple] = Counter()
            for g, members in groups.items():
                if having is not None and len(members) <= having:
                    continue
                values = [aggregate(c, [m["speed"] for m in members]) for c in calls]
                current[(*g, *values)] += 1
            if r2s == "ISTREAM":
                emitted = current - previous
            elif r2s == "DSTREAM":
                emitted = previous - current
            else:
                emitted = current
            out += [(tau, row) for row in emitted.elements()]
            previous = current
    return sorted(out)


reading = st.tuples(
    st.integers(0, 10).map(lambda t: t * 100),  # a coarse grid: exact ties
    st.sampled_from(["a", "b"]),
    st.integers(1, 2),
    st.integers(1, 3),
    st.one_of(st.none(), st.integers(0, 9).map(float)),
)


@st.composite
def streams(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Readings with unique seqs, in a shuffled arrival order within the slack."""
    items = draw(st.lists(reading, min_size=3, max_size=25))
    readings = [
        {"station": k, "lane": lane, "speed": v, "ts": ts, "source": src, "seq": i}
        for i, (ts, src, k, lane, v) in enumerate(items)
    ]
    random.Random(draw(st.integers(0, 999))).shuffle(readings)
    return readings


SQL_CALL = {
    "count(*)": "count(*)",
    "count": "count(speed)",
    "sum": "sum(speed)",
    "max": "max(speed)",
}


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    readings=streams(),
    form=st.sampled_from(FORMS),
    n=st.integers(1, 4),
    calls=st.lists(st.sampled_from(list(SQL_CALL)), max_size=3, unique=True),
    having=st.one_of(st.none(), st.integers(0, 2)),
    r2s=st.sampled_from(["ISTREAM", "DSTREAM", "RSTREAM"]),
)
def test_grouped_row_windows_follow_cql(
    tmp_path: Path,
    readings: list[dict[str, Any]],
    form: tuple[str, tuple[str, ...], tuple[str, ...]],
    n: int,
    calls: list[str],
    having: int | None,
    r2s: str,
) -> None:
    text, partition, group = form
    if not group and not calls:
        calls = ["count(*)"]  # a relation of one row needs something to show
    items = [*group, *(f"{SQL_CALL[c]} AS a{i}" for i, c in enumerate(calls))]
    rule = (
        f"CREATE STREAM out AS SELECT {r2s}({', '.join(items)}) FROM md {text.format(n=n)}"
        + (f" GROUP BY {', '.join(group)}" if group else "")
        + (f" HAVING count(*) > {having}" if having is not None else "")
        + ";\n"
    )
    want = brute_force(readings, n, partition, group, calls, having, r2s)
    assert replay(tmp_path, rule, readings) == want, rule


def test_the_cql_example_avg_price_per_symbol(tmp_path: Path) -> None:
    """CQL's ``SELECT ISTREAM(symbol, avg(price)) FROM md [ROWS 2] GROUP BY symbol``: a
    symbol's row changes when its tuples enter or leave the last two."""
    rule = (
        "CREATE STREAM out AS SELECT ISTREAM(lane, avg(speed) AS price) FROM md [ROWS 2] "
        "GROUP BY lane;\n"
    )
    ticks = [(1, 1.0), (2, 2.0), (1, 3.0), (1, 5.0)]
    readings = [
        {"station": 1, "lane": lane, "speed": v, "ts": i * 100, "source": "p", "seq": i}
        for i, (lane, v) in enumerate(ticks)
    ]
    # W: {1}, {1, 2}, {2, 3}, {3, 5}: lane 2's row stays until it leaves, not re-inserted.
    assert replay(tmp_path, rule, readings) == [
        (0, (1, 1.0)),
        (100, (2, 2.0)),
        (200, (1, 3.0)),
        (300, (1, 4.0)),
    ]
    gone = replay(tmp_path, rule.replace("ISTREAM", "DSTREAM"), readings)
    assert gone == [(200, (1, 1.0)), (300, (1, 3.0)), (300, (2, 2.0))]


def test_an_esl_shaped_aggregate_is_refused(tmp_path: Path) -> None:
    """A group's tuples leave when other groups' tuples arrive: only aggregates that
    retract follow that, so an ESL-shaped one is a located error."""
    rule = (
        "CREATE AGGREGATE silence(ts TIMESTAMP) RETURNS TIMESTAMP LANGUAGE PYTHON AS "
        "'rules.udas:Silence';\n"
        "CREATE STREAM out AS SELECT RSTREAM(lane, silence(ts) AS s) FROM md [ROWS 2] "
        "GROUP BY lane;\n"
    )
    (tmp_path / "r.sql").write_text(STREAM + rule)
    with pytest.raises(RuleCheckError, match="ESL-shaped aggregate 'silence'"):
        load_rules([tmp_path / "r.sql"])


# Esper's regression cases for `#length(n) ... group by` (espertechinc/esper,
# regression-lib, ResultSetQueryTypeRowPerGroup), one event per instant. Esper's
# iterator is CQL's R(t), so RSTREAM must give it at each event; its istream rows are
# CQL's ISTREAM except that Esper also reports a group whose last event left, with NULL
# aggregates, where CQL's relation loses the row (DSTREAM reports it instead).
MARKET = "CREATE STREAM out AS SELECT {op}({items}) FROM md [ROWS {n}] GROUP BY {group};\n"


def market(tmp_path: Path, op: str, items: str, n: int, group: str, ticks: list) -> list:
    """Replay (symbol as lane, price as speed) ticks one second apart; the rows per tick."""
    readings = [
        {"station": 1, "lane": lane, "speed": price, "ts": i * 1000, "source": "p", "seq": i}
        for i, (lane, price) in enumerate(ticks)
    ]
    rule = MARKET.format(op=op, items=items, n=n, group=group)
    got = replay(tmp_path, rule, readings)
    return [sorted(row for ts, row in got if ts == i * 1000) for i in range(len(ticks))]


A, B = 1, 2


def test_esper_select_avg_expr_group_by(tmp_path: Path) -> None:
    """`select istream avg(price) as aprice, symbol from SupportMarketDataBean#length(2)
    group by symbol` (ResultSetQueryTypeSelectAvgExprGroupBy)."""
    ticks = [(A, 1.0), (B, 3.0), (B, 5.0), (A, 10.0), (A, 20.0)]
    items = "avg(speed) AS aprice, lane"
    new = market(tmp_path, "ISTREAM", items, 2, "lane", ticks)
    # Esper: {1.0 A}; {3.0 B}; {null A, 4.0 B}; {10.0 A, 5.0 B}; {15.0 A, null B}.
    assert new == [[(1.0, A)], [(3.0, B)], [(4.0, B)], [(5.0, B), (10.0, A)], [(15.0, A)]]
    old = market(tmp_path, "DSTREAM", items, 2, "lane", ticks)
    assert old == [[], [], [(1.0, A), (3.0, B)], [(4.0, B)], [(5.0, B), (10.0, A)]]


def test_esper_aggregation_over_grouped_props(tmp_path: Path) -> None:
    """`select irstream symbol, price, count(price) as mycount from
    SupportMarketDataBean#length(5) group by symbol, price`, its iterator after each
    event (ResultSetQueryTypeAggregationOverGroupedProps)."""
    dell, ibm = A, B
    ticks = [(dell, 10.0), (dell, 11.0), (dell, 10.0), (ibm, 5.0), (ibm, 5.0), (ibm, 5.0)]
    ticks.append((ibm, 5.0))
    items = "lane, speed, count(speed) AS mycount"
    relation = market(tmp_path, "RSTREAM", items, 5, "lane, speed", ticks)
    assert relation == [
        [(dell, 10.0, 1)],
        [(dell, 10.0, 1), (dell, 11.0, 1)],
        [(dell, 10.0, 2), (dell, 11.0, 1)],
        [(dell, 10.0, 2), (dell, 11.0, 1), (ibm, 5.0, 1)],
        [(dell, 10.0, 2), (dell, 11.0, 1), (ibm, 5.0, 2)],
        [(dell, 10.0, 1), (dell, 11.0, 1), (ibm, 5.0, 3)],
        [(dell, 10.0, 1), (ibm, 5.0, 4)],
    ]
    # Esper's new data at the last two events: {DELL 10.0 1, IBM 5.0 3}, then
    # {DELL 11.0 0, IBM 5.0 4}; the emptied DELL 11.0 group is CQL's DSTREAM.
    new = market(tmp_path, "ISTREAM", items, 5, "lane, speed", ticks)
    assert new[5:] == [[(dell, 10.0, 1), (ibm, 5.0, 3)], [(ibm, 5.0, 4)]]
    assert market(tmp_path, "DSTREAM", items, 5, "lane, speed", ticks)[6] == [
        (dell, 11.0, 1),
        (ibm, 5.0, 3),
    ]
