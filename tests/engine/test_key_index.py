"""A stage's key index (`engine.core.key_index`) against a dict of the live keys'
wakeups, saved and restored at random points with few entries allowed."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine.core.key_index import KEY_INDEX, KEY_STATE, KeyIndex, recorded_states
from engine.core.state import MemoryStore
from tests.examples import examples

keys = st.sampled_from("abcdefgh")
wakeups = st.one_of(st.none(), st.integers(0, 9))
saves = st.lists(
    st.tuples(st.sets(keys), st.dictionaries(keys, wakeups), st.booleans()), max_size=30
)


def index(max_entries: int, definition: str = "rule") -> KeyIndex[str]:
    return KeyIndex("stage", definition, "columnar", str, str, max_entries)


def stored(store: MemoryStore) -> list:
    return [(entry, data) for entry, data in store.entries.items() if entry[0] == KEY_INDEX]


@settings(max_examples=examples(300), deadline=None)
@given(saves=saves, max_entries=st.integers(1, 4))
def test_a_restored_index_holds_each_live_keys_last_wakeup(saves, max_entries) -> None:
    store = MemoryStore()
    keys_index = index(max_entries)
    live: dict[str, int | None] = {}
    for gone, changed, restart in saves:
        now = {key: at for key, at in live.items() if key not in gone} | changed
        keys_index.save(
            store, [(k, k) for k in sorted(gone)], [(k, k) for k in sorted(changed)],
            {k: at for k, at in now.items() if at is not None}, evicting=True,
        )  # fmt: skip
        live = now
        assert len(stored(store)) <= max_entries
        assert set(live) == {key for key in "abcdefgh" if key in keys_index}
        if restart:
            keys_index = index(max_entries)
            indexed = keys_index.restore(stored(store))
            assert indexed is not None and indexed.evicting
            assert {key: at for key, _, at in indexed.keys} == live


@given(saves=saves)
def test_a_stale_index_is_taken_up_not_at_all_and_names_its_keys_states(saves) -> None:
    store = MemoryStore()
    keys_index = index(2)
    named = set()
    for gone, changed, _ in saves:
        keys_index.save(store, [(k, k) for k in gone], [(k, k) for k in changed], {}, True)
        named |= set(changed)
    assume(stored(store))
    edited = index(2, definition="another rule")
    assert edited.restore(stored(store)) is None
    assert not len(edited)
    found = {state for entry, data in stored(store) for state in recorded_states(entry, data)}
    live = {key for key in named if key in keys_index}
    assert {(KEY_STATE, "stage", key, 0) for key in live} <= found
