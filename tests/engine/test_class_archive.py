"""The driver JVM's class archive (`engine.spark.class_archive`): one per Spark home, Java
and set of jars, mapped by a driver JVM when it has been recorded, and none asked of a
JVM otherwise."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from engine.spark import class_archive
from engine.spark.class_archive import (
    archive_path,
    archive_problem,
    java_binary,
    recording_options,
    sharing_option,
    stale_archives,
)
from engine.spark.session import driver_archive, driver_jvm_options
from lookout.demo import lookout_argv

COORDINATES = "io.delta:delta-spark_2.13:4.4.0,io.delta:delta-storage:4.4.0"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of the test's own, and so a Spark home of its own: a SparkSession started
    earlier in the process set SPARK_HOME to the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    return tmp_path / "cache"


def fake_java(home: Path, content: bytes) -> Path:
    (home / "bin").mkdir(parents=True, exist_ok=True)
    java = home / "bin" / "java"
    java.write_bytes(content)
    return java


@pytest.mark.usefixtures("cache")
def test_a_driver_maps_the_archive_only_once_it_is_recorded() -> None:
    archive = archive_path(COORDINATES)
    assert sharing_option(COORDINATES) == ""  # a JVM asked for a missing one would warn
    assert driver_jvm_options("4g", sharing_option(COORDINATES)).split()[-1] == "-Xms1024m"
    archive.write_bytes(b"archive")
    assert sharing_option(COORDINATES) == f"-XX:SharedArchiveFile={archive}"
    options = driver_jvm_options("4g", sharing_option(COORDINATES)).split()
    assert options[-2:] == ["-Xms1024m", f"-XX:SharedArchiveFile={archive}"]


@pytest.mark.usefixtures("cache")
def test_each_java_and_set_of_jars_has_its_own_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    fake_java(tmp_path / "jdk", b"one")
    first = archive_path(COORDINATES)
    assert archive_path(COORDINATES) == first
    assert archive_path(COORDINATES + ",org.apache.hadoop:hadoop-aws:3.4.2") != first
    fake_java(tmp_path / "jdk", b"another")  # a Java updated in place
    assert archive_path(COORDINATES) != first
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "other-jdk"))
    fake_java(tmp_path / "other-jdk", b"another")
    assert archive_path(COORDINATES) != first
    assert first.parent.name.startswith("spark-home-")  # beside the jars it is for


def test_jar_files_written_again_have_another_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "spark-home"
    (home / "jars").mkdir(parents=True)
    monkeypatch.setattr(class_archive, "spark_home", lambda: home)
    spark_jar = home / "jars" / "spark-core.jar"
    spark_jar.write_bytes(b"classes")
    delta_jar = tmp_path / "delta-spark.jar"
    delta_jar.write_bytes(b"classes")
    first = archive_path(COORDINATES, [str(delta_jar)])
    assert archive_path(COORDINATES, [str(delta_jar)]) == first
    first.write_bytes(b"archive")
    os.utime(spark_jar, ns=(1, 1))  # pyspark installed again where it was
    second = archive_path(COORDINATES, [str(delta_jar)])
    assert second != first
    second.write_bytes(b"archive")
    delta_jar.write_bytes(b"other classes")  # Delta's jar downloaded again
    third = archive_path(COORDINATES, [str(delta_jar)])
    assert third not in (first, second)
    third.write_bytes(b"archive")
    assert stale_archives(home) == [first]  # the others are of today's Spark jars


def test_a_recording_jvm_writes_the_archive_quietly(tmp_path: Path) -> None:
    options = recording_options(tmp_path / "classes.jsa").split()
    assert options == [f"-XX:ArchiveClassesAtExit={tmp_path / 'classes.jsa'}", "-Xlog:cds*=error"]


def test_a_recorded_archive_is_not_recorded_again(cache: Path) -> None:
    archive = driver_archive(None)
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(b"archive")
    done = subprocess.run(
        lookout_argv("engine", "--archive-classes"),
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"the class archive is recorded: {archive}" in done.stdout
    assert archive.read_bytes() == b"archive"


@pytest.mark.spark
def test_the_engine_jvm_maps_its_recorded_archive(spark) -> None:  # type: ignore[no-untyped-def]
    archive = driver_archive(None)
    assert archive.is_file()  # the session's fixture records it when missing
    java = spark.sparkContext._jvm.java.lang
    mapped = Path(f"/proc/{java.ProcessHandle.current().pid()}/maps").read_text()
    problem = archive_problem(archive, java.System.getProperty("java.class.path"))
    assert str(archive) in mapped, problem


def jdk_archive() -> Path:
    """The JDK's own class archive (a static one: a JVM maps it as it would ours)."""
    java = java_binary()
    assert java is not None
    return java.parent.parent / "lib" / "server" / "classes.jsa"


def test_an_archive_a_jvm_maps_has_no_problem() -> None:
    assert archive_problem(jdk_archive(), "") is None


def test_a_truncated_or_foreign_archive_is_refused_with_the_jvms_reason(tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.jsa"
    truncated.write_bytes(jdk_archive().read_bytes()[:100_000])  # the JVM would crash
    assert archive_problem(truncated, "") is not None
    foreign = tmp_path / "foreign.jsa"
    foreign.write_bytes(b"archive")
    assert "Unable to read the file header" in (archive_problem(foreign, "") or "")
    assert not list(tmp_path.glob("hs_err*")) and not list(Path.cwd().glob("hs_err*"))
