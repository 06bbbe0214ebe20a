"""Derived streams feeding a stateful stage: tie order and watermark-driven feeding.

A derived row's tie order is (ts, source, seq) with ``source`` = canonical JSON of the
producing stage and key and ``seq`` = the producing evaluator's output counter, so the
live job (which reads the rows back from the derived stream's table) and replay order
equal-time rows alike. Replay feeds them downstream as the producer emits them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from engine.core.evaluator import KeyedEvaluator, derived_source
from engine.core.plan import (
    AggCall,
    Column,
    ColumnType,
    Filter,
    FrameUnits,
    OverWindow,
    Plan,
    Query,
    Sink,
    SinkKind,
    StreamSchema,
)
from engine.core.replay import run
from tests.engine.helpers import TRAFFIC, col, select

SPEEDS = StreamSchema(
    "speeds",
    (Column("station", ColumnType.INT), Column("ts", ColumnType.TIMESTAMP)),
    timestamp="ts",
)


def chained_plan(spy: Callable[[], object] | None = None) -> Plan:
    """speeds = traffic per station (ROWS 0: stateful, one row per reading);
    prev = first(station) OVER (ROWS 1 PRECEDING) over all of speeds (unkeyed)."""
    count = OverWindow((AggCall("count", (), "n"),), FrameUnits.ROWS, 0, partition_by=("station",))
    prev = OverWindow((AggCall("first", (col("station"),), "prev"),), FrameUnits.ROWS, 1)
    # `spy` is called whenever the downstream stage receives a row (its WHERE runs).
    pre = (Filter(lambda r: spy() is None),) if spy is not None else ()
    return Plan(
        {"traffic": TRAFFIC, "speeds": SPEEDS},
        (
            Query(
                Sink("speeds", SinkKind.STREAM),
                "traffic",
                window=count,
                post=(select("station", "ts"),),
            ),
            Query(
                Sink("prev", SinkKind.STREAM),
                "speeds",
                pre=pre,
                window=prev,
                post=(select("station", "ts", "prev"),),
            ),
        ),
    )


def traffic(ts: int, station: int) -> tuple[str, dict[str, Any]]:
    return "traffic", {"station": station, "lane": 1, "speed": 10.0, "length": 4.0, "ts": ts}


def test_output_carries_stage_key_and_counter() -> None:
    stage = chained_plan().stages()[0]
    ev = KeyedEvaluator(stage)
    for ts in (1_000, 1_000, 2_000):
        ev.insert({**traffic(ts, 7)[1], "source": "s", "seq": ts})
    out = ev.advance(10_000)
    assert [(o.source, o.seq) for o in out] == [
        ('["speeds",7]', 0),
        ('["speeds",7]', 1),
        ('["speeds",7]', 2),
    ]
    assert derived_source("speeds", (7,)) == '["speeds",7]'
    # The counter survives a snapshot, so a restarted job goes on numbering.
    again = KeyedEvaluator.restore(stage, ev.snapshot())
    again.insert({**traffic(20_000, 7)[1], "source": "s", "seq": 1})
    assert [(o.source, o.seq) for o in again.advance(30_000)] == [('["speeds",7]', 3)]


def test_equal_time_derived_rows_follow_source_then_seq() -> None:
    # Station 2's reading arrives first; at ts 1000 the derived rows are still ordered
    # by their source text: ["speeds",1] before ["speeds",2].
    readings = [traffic(1_000, 2), traffic(1_000, 1), traffic(2_000, 2)]
    rows = [o.row for o in run(chained_plan(), readings).outputs if o.sink == "prev"]
    assert rows == [
        {"station": 1, "ts": 1_000, "prev": 1},
        {"station": 2, "ts": 1_000, "prev": 1},
        {"station": 2, "ts": 2_000, "prev": 2},
    ]


def test_derived_rows_feed_downstream_before_end_of_input() -> None:
    consumed = [0]  # readings taken from the input so far
    fed_at: list[int] = []  # `consumed` whenever the downstream stage received a row

    def readings() -> Iterator[tuple[str, dict[str, Any]]]:
        for i in range(100):
            consumed[0] = i + 1
            yield traffic(i * 10_000, i % 3)

    result = run(chained_plan(lambda: fed_at.append(consumed[0])), readings(), batch=10)
    assert len(fed_at) == 100
    # Rows below the producer's watermark reach the consumer at the batch that made
    # them final, not at end of input.
    assert fed_at[:9] == [10] * 9
    assert fed_at[-1] == 100
    assert len([o for o in result.outputs if o.sink == "prev"]) == 100


def test_batching_does_not_change_the_rows() -> None:
    readings = [traffic((i * 7_919) % 50_000 // 1000 * 1000 + i * 1000, i % 4) for i in range(80)]
    expected = run(chained_plan(), readings, batch=10**6).outputs
    for batch in (1, 3, 17):
        assert run(chained_plan(), readings, batch=batch).outputs == expected
