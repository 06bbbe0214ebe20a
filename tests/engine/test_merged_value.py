"""``merged_value``: a built-in's value over two partials, read without building their
merge, must be exactly the value of the merge the window would otherwise build (a
fresh aggregate merging the older partial, then the newer), and leave both unchanged."""

from __future__ import annotations

import pickle

from hypothesis import given
from hypothesis import strategies as st

from engine.core.aggregates import BUILTINS, IncrementalAggregate

READ_MERGED = sorted(name for name, cls in BUILTINS.items() if cls.merged_value is not None)
values = st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6), st.integers(-1000, 1000)))


def partial(name: str, xs: list) -> IncrementalAggregate:
    agg = BUILTINS[name]()
    for x in xs:
        agg.accumulate(x)
    return agg


def test_the_window_functions_read_merged() -> None:
    assert {"count", "sum", "avg", "min", "max"} <= set(READ_MERGED)


@given(name=st.sampled_from(READ_MERGED), older=values, newer=values)
def test_merged_value_is_the_merge_value(name: str, older: list, newer: list) -> None:
    a, b = partial(name, older), partial(name, newer)
    before = pickle.dumps((a.get_state(), b.get_state()))
    merged = BUILTINS[name]()
    merged.merge(a)
    merged.merge(b)
    assert a.merged_value(b) == merged.get_value()  # type: ignore[misc]
    assert pickle.dumps((a.get_state(), b.get_state())) == before
