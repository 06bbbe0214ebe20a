"""Creating the lakehouse's tables: a table that lacks a column Lookout writes is refused
at start, naming the table and the column, instead of failing mid-stream."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

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


def test_tables_checkpoint_every_ten_commits_and_keep_removes_an_hour_an_older_one_too(
    tmp_path,
):
    # A commit reads the commits since the last checkpoint, and the checkpoint with the
    # removes it still keeps: the engine's appends stay cheap when checkpoints come often
    # and replaced files are forgotten after an hour. A table made with Delta's defaults
    # (100 commits, 7 days) gets the same properties when Lookout opens it.
    schema = tables.readings_schema(TRAFFIC)
    new, older = str(tmp_path / "new"), str(tmp_path / "older")
    tables.ensure_table(new, schema)
    write_deltalake(older, schema.empty_table())
    tables.ensure_table(older, schema)
    for path in (new, older):
        configuration = DeltaTable(path).metadata().configuration
        assert configuration["delta.checkpointInterval"] == "10"
        assert configuration["delta.deletedFileRetentionDuration"] == "interval 1 hours"
    # A retention someone chose is theirs.
    chosen = str(tmp_path / "chosen")
    write_deltalake(
        chosen,
        schema.empty_table(),
        configuration={"delta.deletedFileRetentionDuration": "interval 2 days"},
    )
    tables.ensure_table(chosen, schema)
    configuration = DeltaTable(chosen).metadata().configuration
    assert configuration["delta.deletedFileRetentionDuration"] == "interval 2 days"
    assert configuration["delta.checkpointInterval"] == "10"
    plain, path = pa.schema([("x", pa.int64())]), str(tmp_path / "appended")
    tables.ensure_table(path, plain)
    for batch in range(12):
        tables.append_once(path, plain, pa.table({"x": [batch]}), "w", batch)
    assert any(
        f.name.endswith(".checkpoint.parquet") for f in (tmp_path / "appended/_delta_log").iterdir()
    )


def test_a_table_without_a_column_lookout_writes_is_refused(tmp_path):
    path = str(tmp_path / "readings_traffic")
    schema = tables.readings_schema(TRAFFIC)
    older = pa.schema([f for f in schema if f.name != "arrival_watermark"])
    tables.ensure_table(path, older)
    refused = r"readings_traffic has no column 'arrival_watermark'"
    with pytest.raises(tables.TableSchemaError, match=refused):
        tables.ensure_table(path, schema)


def _incident(opened: int, resolved: int | None, reports: int) -> dict:
    return {
        "incident_id": f"id-{opened}",
        "rule": "congestion",
        "key": "station=3",
        "severity": "warning",
        "message": f"{reports} reports",
        "opened_at": opened,
        "last_report_at": opened + reports,
        "resolved_at": resolved,
        "reports": reports,
    }


def _merge(path: str, rows: list[dict], batch: int, staged: list[str]) -> bool:
    data = tables.ms_table(rows, tables.INCIDENTS)
    file = tables.write_data_file("incidents", path, data)
    staged.append(file.path)
    key, update = tables.MERGED["incidents"]
    return tables.merge_files(path, tables.INCIDENTS, [file], key, update, "w", batch)


def test_incidents_merge_by_id_once_per_batch_and_keep_the_operators_columns(tmp_path):
    """Batch 1 opens two incidents, batch 2 updates one and resolves it; batch 1 run
    again after a crash changes nothing; an acknowledgement written between batches
    survives the engine's update; the staged files never stay in the folder."""
    path = str(tmp_path / "incidents")
    tables.ensure_table(path, tables.INCIDENTS)
    staged: list[str] = []
    assert _merge(path, [_incident(10, None, 1), _incident(50, None, 2)], 1, staged)
    DeltaTable(path).update({"acknowledged_by": "'ann'"}, predicate="incident_id = 'id-10'")
    assert _merge(path, [_incident(10, 40, 3)], 2, staged)
    assert not _merge(path, [_incident(10, None, 1), _incident(50, None, 2)], 1, staged)
    rows = sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda r: r["opened_at"])
    assert [(r["incident_id"], r["reports"], r["acknowledged_by"]) for r in rows] == [
        ("id-10", 3, "ann"),
        ("id-50", 2, None),
    ]
    assert rows[0]["resolved_at"] is not None and rows[1]["resolved_at"] is None
    assert DeltaTable(path).transaction_version("w") == 2
    assert not {p.name for p in tmp_path.joinpath("incidents").glob("*.parquet")} & set(staged)


def test_an_open_table_is_up_to_date_with_other_writers_and_commits_once(tmp_path):
    """The engine's committer keeps each table open between batches
    (`tables.OpenTables`). Between its commits another writer appends, and maintenance
    compacts, checkpoints and deletes the log below the checkpoint: each use sees the
    table's latest version, every batch lands once, and a batch run again is skipped."""
    from engine.maintenance import clean_log, compact

    path = str(tmp_path / "readings_traffic")
    schema = tables.readings_schema(TRAFFIC)
    tables.ensure_table(path, schema)
    opened = tables.OpenTables()

    def rows(station: int) -> pa.Table:
        return pa.Table.from_pylist(
            [{"station": station, "ts": 1000 * station, "arrival_watermark": 0}],
            schema=schema,
        )

    for batch in range(1, 13):
        file = tables.write_data_file("readings_traffic", path, rows(batch), batch_id=batch)
        assert tables.commit_files(path, schema, [file], "engine", batch, opened=opened)
        other = tables.write_data_file("readings_traffic", path, rows(100 + batch))
        assert tables.commit_files(path, schema, [other], "other", batch)
        if batch % 4 == 0:
            assert compact(DeltaTable(path), min_files=2) is not None
            clean_log(DeltaTable(path), settle_s=0)
        with opened.use(path) as table:
            assert table.version() == DeltaTable(path).version()
    again = tables.write_data_file("readings_traffic", path, rows(5), batch_id=5)
    assert not tables.commit_files(path, schema, [again], "engine", 5, opened=opened)
    stations = sorted(DeltaTable(path).to_pyarrow_table().column("station").to_pylist())
    assert stations == [*range(1, 13), *range(101, 113)]
    assert DeltaTable(path).transaction_version("engine") == 12
