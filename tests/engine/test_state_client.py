"""The state server's rows read as plain tuples (`engine.spark.state_client`), against
PySpark's own unpickling of the same bytes. The bytes are laid out as Spark's Pyrolite
pickler writes a row: the row maker's global, the schema from its JSON, the values."""

from __future__ import annotations

import pickle

from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import types as T

from engine.spark.processor import _KEY, _VALUE
from engine.spark.state_client import plain_row, plain_schema


def _opcodes(value: object) -> bytes:
    """``value`` pickled, without the protocol header and the stop."""
    return pickle.dumps(value, 2)[2:-1]


def pyrolite_row(schema: T.StructType, values: tuple) -> bytes:
    """A row as the state server pickles it."""
    return (
        b"\x80\x02"
        + b"cpyspark.sql.types\n_create_row_inbound_converter\n"
        + b"cpyspark.sql.types\n_parse_datatype_json_string\n"
        + _opcodes(schema.json())
        + b"\x85R"  # TUPLE1 REDUCE: the schema
        + b"\x85R"  # TUPLE1 REDUCE: the row maker
        + b"("  # MARK
        + b"".join(_opcodes(v) for v in values)
        + b"tR."  # TUPLE REDUCE STOP: the row
    )


texts = st.text(max_size=40)


@given(texts, texts, texts, st.integers(-(2**63), 2**63 - 1))
def test_a_key_reads_as_pyspark_reads_it(kind: str, name: str, key: str, number: int) -> None:
    data = pyrolite_row(_KEY, (kind, name, key, number))
    assert plain_row(data) == tuple(pickle.loads(data)) == (kind, name, key, number)


@given(st.binary(max_size=3_000))
def test_a_value_reads_as_pyspark_reads_it(value: bytes) -> None:
    data = pyrolite_row(_VALUE, (value,))
    assert plain_row(data) == tuple(pickle.loads(data)) == (value,)


def test_only_schemas_without_conversion_are_plain() -> None:
    assert plain_schema(_KEY) and plain_schema(_VALUE)
    stamped = T.StructType([T.StructField("ts", T.TimestampType())])
    assert not plain_schema(stamped)
