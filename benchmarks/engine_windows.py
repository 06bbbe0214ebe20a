"""Engine-core window benchmarks (ESL paper §6 figures, in the pure-Python core alone).

    .venv/bin/python benchmarks/engine_windows.py [--quick]

Prints four tables (CPU time of this process, so a busy machine skews them less):

1. ESL Fig. 4: per-tuple cost of ``avg`` over ``ROWS n PRECEDING`` for n = 10 ... 100,000,
   delta-maintained (built-in avg: accumulate + retract) against recomputed over the
   window buffer on every tuple (ESL example 11, an ESL-shaped UDA).
2. ESL Fig. 6: state kept by ``sum OVER (ROWS 39999 PRECEDING SLIDE s)`` (a 40,000-row
   window): pane partials (slide > 1, panes of gcd(40000, s) rows) or buffered tuples
   (slide 1), and the snapshot size.
3. ESL Fig. 7: throughput of ``sum OVER (ROWS 39999 PRECEDING SLIDE s)`` against s.
4. Time slides (logical windows), a 40 s window over one reading per ms: ``sum OVER
   (RANGE 39999 PRECEDING SLIDE s)`` keeps its frame's tuples whatever the slide (a
   yield frame ends at the yield tuple, not at a pane boundary), while extents ``FROM s
   [RANGE 40000 ms SLIDE s]`` run on panes of gcd(40000, s) ms; extents on tuples for
   comparison. State after 80,000 readings and throughput.
5. CQL relations of raw tuples: ISTREAM / DSTREAM / RSTREAM over ``[RANGE 10 SECONDS]``
   and ``[PARTITION BY station ROWS 10]``, one reading per 100 ms.
6. The congestion rule's window: sliding ``avg OVER (PARTITION BY station RANGE 15 MINUTES
   PRECEDING SLIDE 1 MINUTE)`` (the congestion rule) through ``KeyedEvaluator``.

Numbers are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from engine.core.aggregates import InWindow, WindowAggregate
from engine.core.evaluator import KeyedEvaluator
from engine.core.plan import (
    R2S,
    AggCall,
    Expr,
    ExtentWindow,
    FrameUnits,
    OverWindow,
    Project,
    Query,
    RelationWindow,
    Sink,
    SinkKind,
    Stage,
)
from engine.core.planner import operators
from engine.core.windows.extents import PaneExtentOperator
from engine.core.windows.panes import PaneOperator

BATCH = 1_000  # tuples inserted between two advances, like one micro-batch per key


def column(name: str) -> Expr:
    """A column-reference expression, as the rule compiler builds them."""

    def read(row: Mapping[str, Any]) -> Any:
        return row[name]

    return read


class NaiveAvg(WindowAggregate):
    """ESL example 11: avg recomputed over ``inwindow`` for every tuple. ``measuring`` is
    off while the window fills, so filling a 100,000-row window stays affordable."""

    measuring: ClassVar[bool] = False

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        if not NaiveAvg.measuring:
            return (None,)
        total = args[0] + sum(t[0] for t in inwindow)
        return (total / (len(inwindow) + 1),)


def stage_for(window: OverWindow) -> Stage:
    """One OVER query writing ts and the aggregate to sink ``out``."""
    post = Project((("ts", column("ts")), ("v", column("v"))))
    return Stage(Query(Sink("out", SinkKind.STREAM), "s", window=window, post=(post,)))


def feed(ev: KeyedEvaluator, start: int, count: int) -> None:
    """Insert ``count`` in-order tuples from ts ``start`` in batches, advancing after each."""
    for lo in range(start, start + count, BATCH):
        hi = min(lo + BATCH, start + count)
        for ts in range(lo, hi):
            ev.insert({"ts": ts, "source": "s", "seq": ts, "speed": float(ts % 97)})
        ev.advance(hi)


def per_tuple_us(window: OverWindow, fill: int, measured: int) -> float:
    """CPU microseconds per tuple over ``measured`` tuples after ``fill`` warm-up tuples."""
    ev = KeyedEvaluator(stage_for(window))
    feed(ev, 0, fill)
    NaiveAvg.measuring = True
    t0 = time.process_time()
    feed(ev, fill, measured)
    elapsed = time.process_time() - t0
    NaiveAvg.measuring = False
    return elapsed / measured * 1e6


def fig4(quick: bool) -> None:
    """Per-tuple cost of avg vs window size, delta-maintained vs recomputed."""
    print("ESL Fig. 4: avg OVER (ROWS n PRECEDING), CPU us per tuple")
    print(f"{'n':>8} {'delta (expire)':>15} {'recompute':>12}")
    sizes = [10, 100, 1_000, 10_000] if quick else [10, 100, 1_000, 10_000, 100_000]
    for n in sizes:
        delta = per_tuple_us(
            OverWindow((AggCall("avg", (column("speed"),), "v"),), FrameUnits.ROWS, n),
            fill=n,
            measured=20_000,
        )
        naive = per_tuple_us(
            OverWindow(
                (AggCall("naive_avg", (column("speed"),), "v", factory=NaiveAvg),),
                FrameUnits.ROWS,
                n,
            ),
            fill=n,
            measured=max(200, 2_000_000 // n),
        )
        print(f"{n:>8} {delta:>15.2f} {naive:>12.2f}")


def fig6(quick: bool) -> None:
    """State size of a 40,000-row sliding sum against its slide."""
    print("\nESL Fig. 6: sum OVER (ROWS 39999 PRECEDING SLIDE s), state after 80,000 rows")
    print(f"{'slide':>8} {'operator':>14} {'entries':>8} {'snapshot bytes':>15}")
    for slide in [1, 10, 100, 1_000, 10_000, 40_000]:
        window = OverWindow(
            (AggCall("sum", (column("speed"),), "v"),),
            FrameUnits.ROWS,
            39_999,
            slide_rows=slide,
        )
        ev = KeyedEvaluator(stage_for(window))
        feed(ev, 0, 80_000)
        op = ev.operator
        entries = op.partials() if isinstance(op, PaneOperator) else len(op.contents.buffer)
        kind = type(op).__name__
        print(f"{slide:>8} {kind:>14} {entries:>8} {len(ev.snapshot()):>15,}")


def fig7(quick: bool) -> None:
    """Throughput of a 40,000-row sliding sum against its slide (panes for slide > 1)."""
    print("\nESL Fig. 7: sum OVER (ROWS 39999 PRECEDING SLIDE s), tuples/s (CPU)")
    print(f"{'slide':>8} {'tuples/s':>12}")
    measured = 50_000 if quick else 200_000
    for slide in [1, 10, 100, 1_000, 10_000, 40_000]:
        window = OverWindow(
            (AggCall("sum", (column("speed"),), "v"),),
            FrameUnits.ROWS,
            39_999,
            slide_rows=slide,
        )
        us = per_tuple_us(window, fill=40_000, measured=measured)
        print(f"{slide:>8} {1e6 / us:>12,.0f}")


def time_slides(quick: bool) -> None:
    """State and throughput of 40 s logical windows sliding by s, one reading per ms."""
    print(
        "\nTime slides, 40 s window, one reading per ms: state after 80,000 readings "
        "(entries, snapshot bytes) and tuples/s (CPU)"
    )
    print(
        f"{'slide':>7} | {'OVER RANGE SLIDE (tuples)':>29} | {'extents on tuples':>29} | "
        f"{'extents on panes':>29}"
    )
    measured = 40_000 if quick else 160_000
    total = column("v")
    for slide in [100, 1_000, 10_000, 40_000]:
        sum_call = (AggCall("sum", (column("speed"),), "v"),)
        over = OverWindow(sum_call, FrameUnits.RANGE, 39_999, slide_ms=slide)
        extent = ExtentWindow(sum_call, 40_000, slide)
        cells = []
        for window, paned in ((over, False), (extent, False), (extent, True)):
            post = Project((("end", column("ts")), ("v", total)))
            if isinstance(window, ExtentWindow):
                post = Project((("end", column("window_end")), ("v", total)))
            stage = Stage(Query(Sink("out", SinkKind.STREAM), "s", window=window, post=(post,)))
            limit = operators.MAX_EXTENT_PANES if paned else 0
            saved, operators.MAX_EXTENT_PANES = operators.MAX_EXTENT_PANES, limit
            try:
                ev = KeyedEvaluator(stage)
            finally:
                operators.MAX_EXTENT_PANES = saved
            feed(ev, 0, 80_000)
            op = ev.operator
            entries = (
                op.partials() if isinstance(op, PaneExtentOperator) else len(op.contents.buffer)
            )
            size = len(ev.snapshot())
            t0 = time.process_time()
            feed(ev, 80_000, measured)
            rate = measured / (time.process_time() - t0)
            cells.append(f"{entries:>7} {size:>11,} {rate:>9,.0f}")
        print(f"{slide:>7} | " + " | ".join(cells))


def relations(quick: bool) -> None:
    """Throughput of CQL relations of raw tuples (one reading per 100 ms, 4 stations)."""
    print("\nCQL relations of raw tuples, SELECT op(station, speed), tuples/s (CPU)")
    print(f"{'window':>28} {'ISTREAM':>10} {'DSTREAM':>10} {'RSTREAM':>10}")
    n = 20_000 if quick else 100_000
    post = (Project((("station", column("station")), ("speed", column("speed")))),)
    forms = {
        "[RANGE 10 SECONDS]": RelationWindow(FrameUnits.RANGE, range_ms=10_000),
        "[PARTITION BY station ROWS 10]": RelationWindow(
            FrameUnits.ROWS, rows=10, partition_by=("station",)
        ),
    }
    for name, window in forms.items():
        rates = []
        for op in (R2S.ISTREAM, R2S.DSTREAM, R2S.RSTREAM):
            query = Query(Sink("out", SinkKind.STREAM), "s", window=window, post=post, r2s=op)
            stage = Stage(query)
            evaluators: dict[int, KeyedEvaluator] = {}
            t0 = time.process_time()
            for lo in range(0, n, BATCH):
                for i in range(lo, lo + BATCH):
                    station = i % 4 if window.partition_by else 0
                    ev = evaluators.get(station)
                    if ev is None:
                        ev = evaluators[station] = KeyedEvaluator(stage)
                    row = {"ts": i * 100, "station": i % 4, "speed": float(i % 7)}
                    ev.insert({**row, "source": "s", "seq": i})
                for ev in evaluators.values():
                    ev.advance((lo + BATCH) * 100)
            rates.append(n / (time.process_time() - t0))
        print(f"{name:>28} " + " ".join(f"{r:>10,.0f}" for r in rates))


def congestion(quick: bool) -> None:
    """The congestion rule's window over one station's readings, one per second. The
    box is shared, so each run is repeated: best and median of 5 (CPU time)."""
    print("\nCongestion window: avg OVER (RANGE 15 MINUTES PRECEDING SLIDE 1 MINUTE)")
    window = OverWindow(
        (AggCall("avg", (column("speed"),), "v"),),
        FrameUnits.RANGE,
        15 * 60_000,
        ("station",),
        slide_ms=60_000,
    )
    n = 100_000 if quick else 500_000
    rates = []
    for _ in range(5):
        ev = KeyedEvaluator(stage_for(window))
        t0 = time.process_time()
        for lo in range(0, n, BATCH):
            for i in range(lo, lo + BATCH):
                ev.insert({"ts": i * 1_000, "station": 1, "source": "s", "seq": i, "speed": 9.0})
            ev.advance((lo + BATCH) * 1_000)
        rates.append(n / (time.process_time() - t0))
    rates.sort()
    print(f"{n:,} readings: best {rates[-1]:,.0f}, median {rates[2]:,.0f} tuples/s (CPU)")


def main() -> None:
    """Run the benchmarks and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    quick = parser.parse_args().quick
    fig4(quick)
    fig6(quick)
    fig7(quick)
    time_slides(quick)
    relations(quick)
    congestion(quick)


if __name__ == "__main__":
    main()
