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
        got += [] if released is None else list(zip(*released.to_pydict().values(), strict=True))
        want += sorted(r for r in waiting if r[0] < watermark)
        waiting = [r for r in waiting if r[0] >= watermark]
        held.save(store, watermark)
        if restart:
            held = restored(store, watermark)
        assert got == want
    # Nothing the watermark passed stays stored: what is stored is what still waits.
    left = restored(store, watermark).release(10**9)
    assert ([] if left is None else left.column("seq").to_pylist()) == [
        r[2] for r in sorted(waiting)
    ]
