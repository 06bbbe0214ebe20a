"""`engine.core.state.dumps`: what it writes, `pickle.loads` reads back as it was."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engine.core.state import dumps
from tests.examples import examples

dtypes = st.one_of(
    hnp.integer_dtypes(),
    hnp.floating_dtypes(),
    hnp.boolean_dtypes(),
    hnp.unicode_string_dtypes(max_len=4),
    hnp.datetime64_dtypes(),
)


@settings(max_examples=examples(200), deadline=None)
@given(hnp.arrays(dtypes, hnp.array_shapes(min_dims=0, max_dims=2, min_side=0)), st.booleans())
def test_arrays_come_back_with_their_type_shape_and_values(array: np.ndarray, step: bool) -> None:
    if step and array.ndim:
        array = array[::2]  # not contiguous
    back = pickle.loads(dumps({"a": [array, (array, 1)]}))["a"]
    for got in (back[0], back[1][0]):
        assert got.dtype == array.dtype and got.shape == array.shape
        assert got.tobytes() == array.tobytes()
        assert got.flags.writeable  # a window appends to its arrays in place


def test_object_arrays_and_tables_come_back_equal() -> None:
    objects = np.array([None, "a", 1.5], dtype=object)
    table = pa.table(
        {
            "ts": pa.array([1, None], pa.timestamp("ms", tz="UTC")),
            "name": ["x", None],
            "n": pa.array([1, 2], pa.int8()),
        }
    )
    back = pickle.loads(dumps((objects, table, table.slice(1), pa.table({}))))
    assert list(back[0]) == list(objects)
    assert back[1].equals(table) and back[1].schema == table.schema
    assert back[2].equals(table.slice(1))
    assert back[3].num_columns == 0
