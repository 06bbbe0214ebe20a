"""The jars an engine start resolved, listed for the next start to name them directly
(`engine.spark.session`): used only while every one is still there."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.spark.session import remember_jars, resolved_jars

COORDINATES = "io.delta:delta-spark_2.13:4.4.0,io.delta:delta-storage:4.4.0"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def jars(folder: Path, *names: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"PK")
    return [folder / name for name in names]


def test_the_jars_spark_resolved_are_named_at_the_next_start(tmp_path: Path) -> None:
    assert resolved_jars(COORDINATES) is None  # the first start resolves them
    found = jars(tmp_path / "ivy", "delta-spark.jar", "delta-storage.jar")
    remember_jars(COORDINATES, ",".join(f"file://{jar}" for jar in found))
    assert resolved_jars(COORDINATES) == [str(jar) for jar in found]  # in Spark's order


def test_other_coordinates_or_a_jar_gone_resolve_again(tmp_path: Path) -> None:
    found = jars(tmp_path / "ivy", "delta-spark.jar", "delta-storage.jar")
    remember_jars(COORDINATES, ",".join(f"file://{jar}" for jar in found))
    assert resolved_jars(COORDINATES + ",org.apache.hadoop:hadoop-aws:3.4.2") is None
    found[1].unlink()
    assert resolved_jars(COORDINATES) is None


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path: Path, cache: Path) -> None:
    cache.write_text("a file where the folder should be")
    found = jars(tmp_path / "ivy", "delta-spark.jar")
    remember_jars(COORDINATES, f"file://{found[0]}")
    assert resolved_jars(COORDINATES) is None
