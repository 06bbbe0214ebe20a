"""A RANGE frame's buffer kept in chunks between batches (engine.core.chunks): the
outputs are those of one uninterrupted evaluator, nothing stored leaks, and a batch
reads only the chunks at the window's two ends."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine.core import chunks
from engine.core.evaluator import END_OF_TIME, KeyedEvaluator, Output
from engine.core.plan import AggCall, FrameUnits, OverWindow, Stage
from tests.engine.helpers import col, over_plan
from tests.examples import examples


class Store:
    """The runtime's state store for one key: the head and a map of chunks."""

    def __init__(self) -> None:
        self.head: bytes | None = None
        self.chunks: dict[int, bytes] = {}
        self.reads = 0

    def read(self, number: int) -> bytes:
        self.reads += 1
        return self.chunks[number]

    def load(self, stage: Stage) -> KeyedEvaluator:
        if self.head is None:
            return KeyedEvaluator(stage)
        return KeyedEvaluator.load(stage, self.head, self.read)

    def save(self, evaluator: KeyedEvaluator) -> None:
        saved = evaluator.save()
        assert not set(saved.writes) & set(saved.deletes)
        for number in saved.deletes:
            del self.chunks[number]  # only stored chunks are ever deleted
        self.chunks.update(saved.writes)
        self.head = saved.head


def rows_of(raw: list[tuple[int, int]]) -> list[dict]:
    return [
        {"ts": ts, "source": "s", "seq": i, "station": 0, "speed": float(v), "lane": 0}
        for i, (ts, v) in enumerate(raw)
    ]


def batches(rows: list[dict], cuts: list[int], slack: int) -> list[tuple[list[dict], int]]:
    """Rows in arrival order cut into batches, each with the watermark after it."""
    bounds = sorted({min(c, len(rows)) for c in cuts} | {len(rows)})
    out, start, high = [], 0, -END_OF_TIME
    for end in bounds:
        batch = rows[start:end]
        high = max([high, *(r["ts"] for r in batch)])
        out.append((batch, high - slack))
        start = end
    return out


@settings(max_examples=examples(200), deadline=None)
@given(
    raw=st.lists(st.tuples(st.integers(0, 400), st.integers(-9, 9)), min_size=10, max_size=60),
    delays=st.lists(st.integers(0, 30), min_size=60, max_size=60),
    cuts=st.lists(st.integers(0, 60), min_size=2, max_size=12),
    reach=st.integers(0, 150),
    agg=st.sampled_from(["count", "sum", "avg", "max"]),
    shape=st.sampled_from(["plain", "slide", "active", "lag", "reset"]),
)
def test_chunked_batches_equal_one_uninterrupted_evaluator(
    raw: list, delays: list, cuts: list, reach: int, agg: str, shape: str
) -> None:
    chunks.CHUNK_ENTRIES = 3  # many chunks from few tuples (restored after the test)
    window = OverWindow(
        (AggCall(agg, (col("speed"),), "v"),),
        FrameUnits.RANGE,
        reach,
        ("station",),
        slide_ms=25 if shape == "slide" else None,
        active_expiration=shape == "active",
        lag=15 if shape == "lag" else 0,
        reset_every_ms=150 if shape == "reset" else None,
    )
    try:
        (stage,) = over_plan(window).stages()
        KeyedEvaluator(stage)
    except ValueError:
        assume(False)
    slack = 30
    rows = sorted(rows_of(sorted(raw)), key=lambda r: (r["ts"] + delays[r["seq"]], r["seq"]))

    def run(store: Store | None) -> list[Output]:
        out: list[Output] = []
        whole = KeyedEvaluator(stage)
        for batch, watermark in batches(rows, cuts, slack):
            ev = whole if store is None else store.load(stage)
            ev.insert_many([dict(r) for r in batch])
            out += ev.advance(max(watermark, ev.watermark))
            if store is not None:
                store.save(ev)
                assert ev.chunked
        ev = whole if store is None else store.load(stage)
        return out + ev.advance(END_OF_TIME)

    store = Store()
    assert run(store) == run(None)


def test_a_batch_reads_the_ends_of_the_window_not_its_middle() -> None:
    # 1,000 tuples a second into a 2-minute average, in one-second batches: the window
    # holds 120,000 entries, but each batch reads only its front and its last chunk,
    # plus the chunks that a second's expiry passes through.
    chunks.CHUNK_ENTRIES = 64
    stage = over_plan(
        OverWindow((AggCall("avg", (col("speed"),), "v"),), FrameUnits.RANGE, 120_000, ("station",))
    ).stages()[0]
    store = Store()
    for second in range(150):
        before = store.reads
        ev = store.load(stage)
        ev.insert_many(rows_of([(second * 1000 + i, 1) for i in range(1000)]))
        ev.advance(second * 1000 + 1000)
        store.save(ev)
        assert store.reads - before <= 2 + math.ceil(1000 / 64) + 1, second
    assert len(store.chunks) <= math.ceil(120_000 / 64) + 2  # expired chunks are deleted
    assert len(store.head) < 50_000  # the head holds the index, not the tuples
    ev = store.load(stage)
    ev.advance(10**9)  # the key goes quiet and its window empties
    store.save(ev)
    assert not store.chunks


@pytest.fixture(autouse=True)
def _chunk_size_restored() -> Iterator[None]:
    size = chunks.CHUNK_ENTRIES
    yield
    chunks.CHUNK_ENTRIES = size
