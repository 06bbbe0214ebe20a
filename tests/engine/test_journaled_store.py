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
        for key in {k for _, k, _ in ops if k is not None}:
            assert store.get(key) == model.get(key)
