"""Arrow types of the engine's rows (pure; Arrow only).

Inside the engine a timestamp is epoch milliseconds (int64); in the lakehouse's tables
it is Arrow's TIMESTAMP in microseconds, UTC (what Spark and Delta read as TIMESTAMP).
"""

from __future__ import annotations

import pyarrow as pa

from engine.core.plan import ColumnType, StreamSchema

ARROW_TYPES: dict[ColumnType, pa.DataType] = {
    ColumnType.INT: pa.int32(),
    ColumnType.BIGINT: pa.int64(),
    ColumnType.DOUBLE: pa.float64(),
    ColumnType.STRING: pa.string(),
    ColumnType.BOOLEAN: pa.bool_(),
    ColumnType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
}
"""The Arrow type of each column type as tables store it."""


def arrival_type(column_type: ColumnType) -> pa.DataType:
    """The Arrow type of a column inside the engine: timestamps as epoch ms (int64)."""
    return pa.int64() if column_type == ColumnType.TIMESTAMP else ARROW_TYPES[column_type]


def stage_input_schema(stream: StreamSchema) -> pa.Schema:
    """The rows a stage reading `stream` takes: its columns and its tie order."""
    fields = [pa.field(c.name, arrival_type(c.type)) for c in stream.columns]
    return pa.schema([*fields, pa.field("source", pa.string()), pa.field("seq", pa.int64())])
