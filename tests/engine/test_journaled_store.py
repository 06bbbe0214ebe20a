"""The journaled state store reads like a plain dict of what was written, before and
after its journal is folded, and a store opened again holds exactly what the last
commit made durable (against a dict model of the operations)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.state import JOURNAL, JournaledStore, MemoryStore
from tests.examples import examples

KEYS = st.tuples(st.sampled_from(["head", "slice"]), st.sampled_from(["a", "b"]),
                 st.just(""), st.integers(0, 3))  # fmt: skip
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, st.binary(max_size=3)),
        st.tuples(st.just("delete"), KEYS, st.none()),
        st.tuples(st.just("commit"), st.none(), st.none()),
        st.tuples(st.just("reopen"), st.none(), st.none()),
    ),
    max_size=60,
)


def view(store: JournaledStore, kind: str) -> dict:
    scanned = dict(store.scan(kind))
    assert sorted(store.keys(kind)) == sorted(scanned)
    return scanned


@settings(max_examples=examples(300), deadline=None)
@given(OPS, st.integers(1, 4))
def test_reads_and_reopening_match_a_dict(ops, fold_after) -> None:
    inner = MemoryStore()
    store = JournaledStore.open(inner, fold_after)
    model: dict = {}  # what was written
    durable: dict = {}  # what the last commit made durable
    for op, key, value in ops:
        if op == "put":
            store.put(key, value)
            model[key] = value
        elif op == "delete":
            store.delete(key)
            model.pop(key, None)
        elif op == "commit":
            store.commit()
            durable = dict(model)
            # The journal never holds more than fold_after entries.
            assert len(list(inner.keys(JOURNAL))) < fold_after
        else:  # a batch failed, or another worker runs the next: start from the store
            store = JournaledStore.open(inner, fold_after)
            model = dict(durable)
        for kind in ("head", "slice"):
            assert view(store, kind) == {k: v for k, v in model.items() if k[0] == kind}
        keys = sorted({k for _, k, _ in ops if k is not None})
        for key in keys:
            assert store.get(key) == model.get(key)
        assert store.get_many(keys) == [model.get(key) for key in keys]


class CountingStore(MemoryStore):
    """A memory store that records the keys written (put or deleted) since last asked."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list = []

    def put(self, key, value) -> None:
        self.written.append(key)
        super().put(key, value)

    def delete(self, key) -> None:
        self.written.append(key)
        super().delete(key)

    def write(self, changes) -> None:
        self.written += [key for key, _ in changes]
        super().write(changes)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.lists(KEYS, max_size=5), max_size=30), st.integers(1, 5))
def test_each_commit_folds_only_what_left_the_journal(batches, fold_after) -> None:
    """Besides its journal entry, a commit writes exactly the keys whose last change was
    in the batch `fold_after - 1` commits back: one old entry folded, never the whole
    journal at once (a key changed again since stays in the journal)."""
    inner = CountingStore()
    store = JournaledStore.open(inner, fold_after)
    committed: list[set] = []  # each non-empty batch's keys
    for keys in batches:
        for key in keys:
            store.put(key, b"v")
        inner.written.clear()
        store.commit()
        if not keys:
            assert inner.written == []
            continue
        committed.append(set(keys))
        expected: set = set()
        back = len(committed) - fold_after
        if back >= 0:
            expected = committed[back] - set().union(*committed[back + 1 :])
        written = [k for k in inner.written if k[0] != JOURNAL]
        assert sorted(written) == sorted(expected)
