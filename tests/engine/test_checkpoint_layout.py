"""The engine refuses checkpoints it cannot resume, before Spark fails on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.spark.checkpoint_layout import (
    CHECKPOINT_LAYOUT,
    CheckpointLayoutError,
    check_checkpoint_layout,
    checkpoint_partitions,
)
from lookout.config import Config


def config_at(lakehouse: Path) -> Config:
    return Config(lakehouse=str(lakehouse))


def test_a_new_lakehouse_is_marked_and_then_accepted(tmp_path: Path) -> None:
    config = config_at(tmp_path / "lake")
    check_checkpoint_layout(config)
    marker = tmp_path / "lake/_checkpoints/LAYOUT"
    assert marker.read_text().strip() == str(CHECKPOINT_LAYOUT)
    (tmp_path / "lake/_checkpoints/rules-traffic").mkdir()
    check_checkpoint_layout(config)  # its own checkpoints resume


@pytest.mark.parametrize("query", ["rules-traffic", "landing"])
@pytest.mark.parametrize("marker", [None, "1", "2", "99"])
def test_checkpoints_of_another_layout_are_refused_with_what_to_do(
    tmp_path: Path, marker: str | None, query: str
) -> None:
    checkpoints = tmp_path / "lake/_checkpoints"
    (checkpoints / query).mkdir(parents=True)
    if marker is not None:
        (checkpoints / "LAYOUT").write_text(marker)
    with pytest.raises(CheckpointLayoutError) as refused:
        check_checkpoint_layout(config_at(tmp_path / "lake"))
    message = str(refused.value)
    assert f"layout {marker or 1}" in message
    assert str(tmp_path / "lake") in message and "new lakehouse" in message


@pytest.mark.parametrize("content", ["", "two\n", "2.0"])
def test_an_unreadable_layout_file_is_named_not_guessed(tmp_path: Path, content: str) -> None:
    checkpoints = tmp_path / "lake/_checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "LAYOUT").write_text(content)
    with pytest.raises(CheckpointLayoutError, match="LAYOUT: expected a layout number"):
        check_checkpoint_layout(config_at(tmp_path / "lake"))


def _offset_entry(partitions: int) -> str:
    """An offset log entry as Spark 4 writes it (version, batch metadata, source offset)."""
    meta = (
        '{"batchWatermarkMs":0,"batchTimestampMs":1796518627518,"conf":{'
        '"spark.sql.streaming.stateStore.providerClass":"org.apache.spark.sql.execution.'
        'streaming.state.RocksDBStateStoreProvider","spark.sql.shuffle.partitions":'
        f'"{partitions}","spark.sql.streaming.multipleWatermarkPolicy":"min"}}}}'
    )
    return f'v1\n{meta}\n{{"files": []}}'


def test_the_partitions_come_from_the_latest_readable_offset_entry(tmp_path: Path) -> None:
    offsets = tmp_path / "engine" / "offsets"
    assert checkpoint_partitions(str(tmp_path / "engine"), Config().s3) is None
    offsets.mkdir(parents=True)
    (offsets / "9").write_text(_offset_entry(3))
    (offsets / "10").write_text(_offset_entry(4))
    (offsets / "11").write_text("v1\n{")  # torn
    (offsets / ".12.1f3e.tmp").write_text(_offset_entry(5))
    assert checkpoint_partitions(str(tmp_path / "engine"), Config().s3) == 4
