"""A source stream's held readings: each released exactly once, once the watermark passes
it, across saves and restores at any batch, each release in tie order (event time,
source, seq), against the definition: a reading is released by the first watermark
above its event time."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.held import KIND, HeldRows
from engine.core.state import MemoryStore
from tests.examples import examples

# A batch: the readings' event times and sources (arrival order), the watermark after
# them, and whether the pipeline restarts from the store before the next batch.
batches = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 30), st.sampled_from(["a", "b"])), max_size=6),
        st.integers(0, 8),  # how far the watermark moves
        st.booleans(),
    ),
    max_size=12,
)


def restored(store: MemoryStore, watermark: int) -> HeldRows:
    held = HeldRows("s", "ts")
    held.restore(store.scan(KIND), watermark)
    return held


@settings(max_examples=examples(300), deadline=None)
@given(batches)
def test_each_reading_is_released_once_when_the_watermark_passes_it(batches) -> None:
    store = MemoryStore()
    held = HeldRows("s", "ts")
    watermark, number = 0, 0
    got: list[tuple[int, str, int]] = []
    want: list[tuple[int, str, int]] = []
    waiting: list[tuple[int, str, int]] = []  # (ts, source, seq) not yet released
    for readings, step, restart in batches:
        # The seq numbers fall as readings arrive, so that tie order is not arrival order.
        mine = [(t, src, -(number + i)) for i, (t, src) in enumerate(readings) if t >= watermark]
        number += len(readings)
        if mine:
            ts, sources, seqs = zip(*mine, strict=True)
            held.add(pa.table({"ts": ts, "source": sources, "seq": seqs}))
        waiting += mine
        watermark += step
        released = held.release(watermark)
        tied = None if released is None else released.in_tie_order()
        got += [] if tied is None else list(zip(*tied.to_pydict().values(), strict=True))
        want += sorted(r for r in waiting if r[0] < watermark)
        waiting = [r for r in waiting if r[0] >= watermark]
        held.save(store, watermark)
        if restart:
            held = restored(store, watermark)
        assert got == want
    # Nothing the watermark passed stays stored: what is stored is what still waits.
    left = restored(store, watermark).release(10**9)
    assert ([] if left is None else left.in_tie_order().column("seq").to_pylist()) == [
        r[2] for r in sorted(waiting)
    ]


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 5), st.sampled_from("ab")),
        max_size=20,
    ),
    st.integers(1, 3),
    st.sampled_from([(), ("k",), ("k", "j")]),
)
def test_released_rows_arranged_by_a_key_are_in_key_then_tie_order(rows, parts, key) -> None:
    """What a runner sorting by ``key`` takes: the released rows by the key, then event
    time, source and seq, without source and seq; held in several parts."""
    held = HeldRows("s", "ts")
    numbered = [(k, j, ts, src, -seq) for seq, (k, j, ts, src) in enumerate(rows)]
    for part in range(parts):
        mine = numbered[part::parts]
        if mine:
            k, j, ts, src, seq = zip(*mine, strict=True)
            held.add(pa.table({"k": k, "j": j, "ts": ts, "source": src, "seq": seq}))
    released = held.release(10)
    if not numbered:
        assert released is None
        return
    assert released is not None
    place = {"k": 0, "j": 1}
    want = sorted(numbered, key=lambda r: (*(r[place[c]] for c in key), r[2], r[3], r[4]))
    got = released.arranged(key)
    assert got.column_names == ["k", "j", "ts"]
    assert list(zip(*got.to_pydict().values(), strict=True)) == [r[:3] for r in want]
