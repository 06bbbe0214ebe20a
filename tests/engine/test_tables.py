"""Creating the lakehouse's tables: a table that lacks a column Lookout writes is refused
at start, naming the table and the column, instead of failing mid-stream."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from engine import tables
from engine.core.plan import Column, ColumnType, StreamSchema

TRAFFIC = StreamSchema(
    "traffic",
    (Column("station", ColumnType.INT), Column("ts", ColumnType.TIMESTAMP)),
    "ts",
    2_000,
    "lookout/traffic/+/readings",
)


def test_a_missing_table_is_created_and_an_existing_one_kept(tmp_path):
    path = str(tmp_path / "readings_traffic")
    schema = tables.readings_schema(TRAFFIC)
    tables.ensure_table(path, schema)
    tables.ensure_table(path, schema)
    assert [f.name for f in DeltaTable(path).schema().fields] == schema.names


def test_a_table_without_a_column_lookout_writes_is_refused(tmp_path):
    path = str(tmp_path / "readings_traffic")
    schema = tables.readings_schema(TRAFFIC)
    older = pa.schema([f for f in schema if f.name != "arrival_watermark"])
    tables.ensure_table(path, older)
    refused = r"readings_traffic has no column 'arrival_watermark'"
    with pytest.raises(tables.TableSchemaError, match=refused):
        tables.ensure_table(path, schema)
