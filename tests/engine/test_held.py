"""A source stream's held readings: each released exactly once, in arrival order, once
the watermark passes it, across saves and restores at any batch (against the
definition: a reading is released by the first watermark above its event time)."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.held import KIND, HeldRows
from engine.core.state import MemoryStore
from tests.examples import examples

# A batch: the readings' event times (arrival order), the watermark after them, and
# whether the pipeline restarts from the store before the next batch.
batches = st.lists(
    st.tuples(
        st.lists(st.integers(0, 30), max_size=6),
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
    got: list[int] = []
    want: list[int] = []
    waiting: list[tuple[int, int]] = []  # (ts, arrival number) not yet released
    for times, step, restart in batches:
        mine = [(t, number + i) for i, t in enumerate(times) if t >= watermark]
        number += len(times)
        held.add(pa.table({"ts": [t for t, _ in mine], "n": [n for _, n in mine]}))
        waiting += mine
        watermark += step
        released = held.release(watermark)
        got += [] if released is None else released.column("n").to_pylist()
        want += [n for t, n in waiting if t < watermark]
        waiting = [(t, n) for t, n in waiting if t >= watermark]
        held.save(store, watermark)
        if restart:
            held = restored(store, watermark)
        assert got == want
    # Nothing the watermark passed stays stored: what is stored is what still waits.
    left = restored(store, watermark).release(10**9)
    assert sorted([] if left is None else left.column("n").to_pylist()) == sorted(
        n for _, n in waiting
    )
