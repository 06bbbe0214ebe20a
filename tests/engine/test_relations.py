"""CQL windows of raw tuples read through ISTREAM / DSTREAM / RSTREAM (plan.RelationWindow),
against a brute-force evaluation of the definitions at every instant.

Oracle (CQL §5.1, §6.1): for every instant τ (ms) in the stream's span, W(τ), the set of
tuples in the window, straight from its definition; R(τ) = the query's rows of W(τ)'s
tuples. ISTREAM emits R(τ) - R(τ-1), DSTREAM R(τ-1) - R(τ) (bag differences) at τ;
RSTREAM emits R(τ) at every instant where a tuple with rows in R (one the WHERE keeps)
enters or leaves W (CQL repeats R at every instant; between those instants the copies
are equal, so one per change is kept). A partitioned window
is one relation per partition (the evaluator's key), as for the aggregate relations.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.evaluator import KeyedEvaluator
from engine.core.plan import (
    END_OF_TIME,
    R2S,
    Filter,
    FrameUnits,
    Plan,
    Project,
    Query,
    RelationWindow,
    Sink,
    SinkKind,
)
from engine.core.replay import run
from engine.core.windows.streams import bag_minus
from tests.engine.helpers import TRAFFIC, col
from tests.examples import examples

Row = dict[str, Any]


def members(w: RelationWindow, rows: list[Row], tau: int) -> list[int]:
    """W(τ): indices (in (ts, seq) order) of the tuples in the window at instant τ."""
    seen = [i for i, x in enumerate(rows) if x["ts"] <= tau]
    if w.units is FrameUnits.ROWS:
        assert w.rows is not None
        return seen[-w.rows :] if seen else []
    out = []
    for i in seen:
        ts = rows[i]["ts"]
        if w.slide_ms is not None:
            assert w.range_ms is not None
            end = tau // w.slide_ms * w.slide_ms  # the latest extent end <= τ
            inside = end - w.range_ms <= ts < end
        elif w.range_ms is not None:
            inside = tau - w.lag_ms - w.range_ms <= ts <= tau - w.lag_ms
        elif w.reset_every_ms:
            inside = tau // w.reset_every_ms * w.reset_every_ms <= ts
        else:
            inside = (w.since_ms is None or w.since_ms <= ts) and (
                w.until_ms is None or ts <= w.until_ms
            )
        if inside:
            out.append(i)
    return out


def oracle(
    w: RelationWindow, r2s: R2S, rows: list[Row], query_rows: Any, span: int
) -> list[tuple[int, tuple]]:
    """The relation-to-stream output, per partition, from R at every instant."""
    out: list[tuple[int, tuple]] = []
    keys = sorted({tuple(x[c] for c in w.partition_by) for x in rows})
    for key in keys:
        mine = [x for x in rows if tuple(x[c] for c in w.partition_by) == key]
        before: list[int] = []
        for tau in range(-1, span):
            now = members(w, mine, tau)
            current = Counter(r for i in now for r in query_rows(mine[i]))
            previous = Counter(r for i in before for r in query_rows(mine[i]))
            if r2s is R2S.ISTREAM:
                emitted = current - previous
            elif r2s is R2S.DSTREAM:
                emitted = previous - current
            else:  # at each change of the tuples that have rows in R
                changed = [i for i in now if query_rows(mine[i])] != [
                    i for i in before if query_rows(mine[i])
                ]
                emitted = current if changed else Counter()
            out += [(tau, r) for r in emitted.elements()]
            before = now
    return sorted(out)


def windows() -> st.SearchStrategy[RelationWindow]:
    """Every relation window form, small parameters."""
    rng = st.integers(0, 12)
    return st.one_of(
        st.builds(RelationWindow, st.just(FrameUnits.RANGE), range_ms=rng),  # [RANGE r]
        st.builds(RelationWindow, st.just(FrameUnits.RANGE), range_ms=st.just(0)),  # [NOW]
        st.builds(
            RelationWindow, st.just(FrameUnits.RANGE), range_ms=rng, lag_ms=st.integers(1, 9)
        ),
        st.builds(
            RelationWindow,
            st.just(FrameUnits.RANGE),
            range_ms=st.integers(1, 15),
            slide_ms=st.integers(1, 15),
        ),
        st.builds(RelationWindow, st.just(FrameUnits.RANGE)),  # [RANGE UNBOUNDED]
        st.builds(RelationWindow, st.just(FrameUnits.RANGE), reset_every_ms=st.integers(1, 20)),
        st.builds(
            RelationWindow,
            st.just(FrameUnits.RANGE),
            since_ms=st.one_of(st.none(), st.integers(0, 30)),
            until_ms=st.one_of(st.none(), st.integers(20, 50)),
        ),
        st.builds(RelationWindow, st.just(FrameUnits.ROWS), rows=st.integers(1, 4)),
        st.builds(
            RelationWindow,
            st.just(FrameUnits.ROWS),
            rows=st.integers(1, 4),
            partition_by=st.just(("station",)),
        ),
    )


@st.composite
def streams(draw: Any) -> list[Row]:
    """Readings in (ts, seq) order, with ties and repeated (station, speed) values: half
    the streams over 0..50 ms, half over five instants (a ROWS window's tuples then enter
    and leave in runs of ties, several at one instant)."""
    ts = draw(st.sampled_from([st.integers(0, 50), st.integers(0, 4)]))
    raw = draw(st.lists(st.tuples(ts, st.integers(0, 1), st.integers(0, 2)), max_size=30))
    return [
        {"ts": ts, "station": k, "speed": float(v), "source": "s", "seq": i}
        for i, (ts, k, v) in enumerate(sorted(raw))
    ]


@settings(max_examples=examples(400), deadline=None)
@given(
    rows=streams(),
    window=windows(),
    r2s=st.sampled_from(list(R2S)),
    filtered=st.booleans(),
    batch=st.integers(1, 6),
)
def test_relation_to_stream_matches_the_definitions(
    rows: list[Row], window: RelationWindow, r2s: R2S, filtered: bool, batch: int
) -> None:
    # SELECT r2s(station, speed) FROM traffic [window] [WHERE speed > 0]: the rows drop
    # ts, so equal rows enter and leave at one instant and must cancel. The WHERE filters
    # the window's tuples (in `post`, as the compiler places it for ROWS windows).
    post: tuple = ((Filter(lambda r: r["speed"] > 0),) if filtered else ()) + (
        Project((("station", col("station")), ("speed", col("speed")))),
    )
    query = Query(Sink("out", SinkKind.STREAM), "traffic", window=window, post=post, r2s=r2s)
    (stage,) = Plan({"traffic": TRAFFIC}, (query,)).stages()
    assert stage.key == window.partition_by

    evaluators: dict[Any, KeyedEvaluator] = {}
    got = []
    for i, row in enumerate(rows):
        key = tuple(row[c] for c in stage.key)
        evaluators.setdefault(key, KeyedEvaluator(stage)).insert(dict(row))
        if i % batch == 0:  # advance as far as the next tuple allows
            for ev in evaluators.values():
                got += ev.advance(row["ts"])
    for ev in evaluators.values():
        got += ev.advance(END_OF_TIME)

    def query_rows(x: Row) -> list[tuple]:
        return [(x["station"], x["speed"])] if not filtered or x["speed"] > 0 else []

    span = 50 + 2 * (window.range_ms or 0) + window.lag_ms + 2 * (window.slide_ms or 0) + 25
    want = oracle(window, r2s, rows, query_rows, span)
    assert sorted((o.ts, (o.row["station"], o.row["speed"])) for o in got) == want


@settings(max_examples=examples(150), deadline=None)
@given(rows=streams(), window=windows(), r2s=st.sampled_from(list(R2S)))
def test_each_evaluator_emits_in_event_time_order_and_restores(
    rows: list[Row], window: RelationWindow, r2s: R2S
) -> None:
    post = (Project((("station", col("station")), ("speed", col("speed")))),)
    query = Query(Sink("out", SinkKind.STREAM), "traffic", window=window, post=post, r2s=r2s)
    plan = Plan({"traffic": TRAFFIC}, (query,))
    (stage,) = plan.stages()
    evaluators: dict[Any, KeyedEvaluator] = {}
    got = []
    for row in rows:
        key = tuple(row[c] for c in stage.key)
        ev = evaluators.setdefault(key, KeyedEvaluator(stage))
        ev.insert(dict(row))
        got += ev.advance(row["ts"])
        evaluators[key] = KeyedEvaluator.restore(stage, ev.snapshot())
    for ev in evaluators.values():
        tail = ev.advance(END_OF_TIME)
        assert [o.ts for o in tail] == sorted(o.ts for o in tail)
        got += tail
        assert ev.next_wakeup() is None
    replayed = run(plan, [("traffic", dict(r)) for r in rows]).outputs
    assert sorted((o.ts, repr(o.row)) for o in got) == sorted((o.ts, repr(o.row)) for o in replayed)


def test_dstream_of_a_range_window_by_hand() -> None:
    # [RANGE 10] ms: a tuple at t is in R during [t, t + 10]; DSTREAM emits it at t + 11,
    # unless an equal row enters then.
    window = RelationWindow(FrameUnits.RANGE, range_ms=10)
    post = (Project((("speed", col("speed")),)),)
    query = Query(
        Sink("out", SinkKind.STREAM), "traffic", window=window, post=post, r2s=R2S.DSTREAM
    )
    (stage,) = Plan({"traffic": TRAFFIC}, (query,)).stages()
    ev = KeyedEvaluator(stage)
    for seq, (ts, speed) in enumerate([(0, 1.0), (5, 2.0), (11, 1.0)]):
        ev.insert({"ts": ts, "station": 1, "speed": speed, "source": "s", "seq": seq})
    assert ev.advance(11) == []
    assert ev.next_wakeup() == 12  # the instant 11 is final once the watermark passes it
    # At 11 the tuple at 0 leaves and an equal row enters: R is unchanged, no output.
    assert ev.advance(12) == []
    assert ev.next_wakeup() == 17  # the tuple at 5 leaves at 16
    assert [(o.ts, o.row) for o in ev.advance(END_OF_TIME)] == [
        (16, {"speed": 2.0}),
        (22, {"speed": 1.0}),
    ]


def test_bag_difference_keeps_order_and_multiplicity() -> None:
    """One copy cancels one copy, survivors keep their order; rows holding unhashable
    values (a Python aggregate's list) take the comparing path to the same answer."""
    rows = [{"k": 1}, {"k": 2}, {"k": 1}, {"k": 3}, {"k": 1}]
    assert bag_minus(rows, [{"k": 1}, {"k": 3}, {"k": 1}, {"k": 9}]) == [{"k": 2}, {"k": 1}]
    lists = [{"k": [1]}, {"k": [2]}, {"k": [1]}]
    assert bag_minus(lists, [{"k": [1]}]) == [{"k": [2]}, {"k": [1]}]
