"""Spark starts from pyspark's own Spark, seen through a folder whose `python/lib` is
empty, so the Python processes it starts import pyspark from the installed package with
its bytecode, not from `pyspark.zip` (`engine.spark.spark_home`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.spark.spark_home import pyspark_home, remove_abandoned, spark_home


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    return tmp_path / "cache"


def test_the_home_is_pysparks_own_without_its_python_zips(cache: Path) -> None:
    home = spark_home()
    assert home.is_relative_to(cache)
    real = pyspark_home()
    for launcher in ("bin/spark-submit", "bin/spark-class", "jars"):
        assert (home / launcher).resolve() == (real / launcher).resolve()
    assert (real / "python" / "lib" / "pyspark.zip").is_file()  # what Spark would use
    assert list((home / "python" / "lib").iterdir()) == []
    assert (home / "python" / "pyspark" / "shell.py").is_file()


def test_the_home_is_made_once_and_remade_when_incomplete(cache: Path) -> None:
    home = spark_home()
    made = home.stat().st_mtime_ns
    assert spark_home() == home and home.stat().st_mtime_ns == made
    (home / "jars").unlink()
    assert spark_home() == home
    assert (home / "jars").resolve() == (pyspark_home() / "jars").resolve()


def test_a_new_home_deletes_those_whose_pyspark_is_gone(cache: Path, tmp_path: Path) -> None:
    homes = cache / "lookout"
    gone, building = homes / "spark-home-4.2.0-0123456789ab", homes / "spark-home-x.1.tmp"
    for home in (gone, building):
        home.mkdir(parents=True)
        (home / "jars").symlink_to(tmp_path / "deleted-venv" / "pyspark" / "jars")
    (gone / "lookout-classes-0-0.jsa").write_bytes(b"archive")
    home = spark_home()
    assert not gone.exists()
    assert building.exists()  # another process's, in the making
    assert home.parent == homes
    assert remove_abandoned(homes) == [] and home.is_dir()


def test_a_spark_of_the_users_own_is_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark-4.2.0-bin-hadoop3"))
    assert spark_home() == tmp_path / "spark-4.2.0-bin-hadoop3"
    monkeypatch.setenv("SPARK_HOME", str(pyspark_home()))  # pyspark's own: made as above
    assert spark_home().name.startswith("spark-home-")


def test_a_cache_that_cannot_be_written_leaves_pysparks_own(cache: Path) -> None:
    cache.write_text("a file where the folder should be")
    assert spark_home() == pyspark_home()


@pytest.mark.spark
def test_python_workers_import_pyspark_from_the_package(spark) -> None:  # type: ignore[no-untyped-def]
    def where(rows):  # type: ignore[no-untyped-def]
        import pyspark

        yield pyspark.__file__

    found = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert found == [str(pyspark_home() / "__init__.py")]
