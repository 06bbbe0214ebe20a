"""The driver JVM's class archive: the classes of Spark, Delta, RocksDB and the engine
query, parsed and verified once, mapped from a file at every later start (the JVM's
dynamic class data sharing, CDS).

A JVM starting Spark and the engine query loads and verifies tens of thousands of
classes. Measured here (a standby's first 75 s: Spark's start and its rehearsal), the
JVM used 10.5 s of CPU to a running session and 19.7 s in all; started from an archive,
6.7 s and 14.1 s, and Spark was up after 5.5 s instead of 7.5 s. An engine restarted
after a crash, or a standby starting beside a loaded engine, pays that much less.

`lookout engine --archive-classes` records one (about a minute; `lookout.services`): it
runs a standby's rehearsal (the engine query over a scratch lakehouse) in a JVM started
with ``-XX:ArchiveClassesAtExit``, which writes the archive as it exits. An archive
holds for one Spark home, one Java and one set of jar files (Spark's, Delta's,
hadoop-aws's when the lakehouse is on S3), and is named after them: another Java or
Delta, or pyspark installed again, finds none and starts as before. A recording is
checked before it is put in place (`archive_problem`): a JVM given a truncated archive
crashes as it starts, and one that finds an archive it cannot use says so on its output
and starts without it. Executors of a cluster start without one (their class path is
the worker's).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from engine.spark.spark_home import spark_home

PREFIX = "lookout-classes-"
"""The archives' names in the Spark home: this, a digest of the Java and jars, `.jsa`."""


def java_binary() -> Path | None:
    """The `java` Spark's launcher runs: `$JAVA_HOME/bin/java`, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found else None


def archive_path(coordinates: str, jars: Sequence[str] = ()) -> Path:
    """Where the archive is (or goes) for this Java, these Maven ``coordinates`` and the
    ``jars`` resolved for them: in the Spark home, which names pyspark's version and
    place. The name also holds the size and time of every jar, Spark's own and
    ``jars``: a JVM maps an archive only with the very jar files it was recorded with,
    and a virtual environment installed again in the same place has new ones. It
    begins with a digest of Spark's own jars (:func:`stale_archives`)."""
    home = spark_home()
    identity = [coordinates, *(_identity(Path(f)) for f in jars), _identity(java_binary())]
    digest = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
    return home / f"{PREFIX}{_spark_jars_digest(home)}-{digest}.jsa"


def stale_archives(home: Path) -> list[Path]:
    """The archives in Spark home ``home`` recorded with Spark jars other than its
    current ones (a pyspark installed before in the same place): no JVM can map them."""
    current = f"{PREFIX}{_spark_jars_digest(home)}-"
    return [a for a in home.glob(f"{PREFIX}*.jsa") if not a.name.startswith(current)]


def _spark_jars_digest(home: Path) -> str:
    """A digest of the path, size and time of every jar of Spark home ``home``."""
    jars = sorted((home / "jars").iterdir()) if (home / "jars").is_dir() else []
    return hashlib.sha256("\n".join(map(_identity, jars)).encode()).hexdigest()[:8]


def _identity(file: Path | None) -> str:
    """A file's path, size and modification time, or that it is missing."""
    try:
        stat = file.stat() if file is not None else None
    except OSError:
        stat = None
    return f"{file} {stat.st_size} {stat.st_mtime_ns}" if stat else f"{file} missing"


def sharing_option(coordinates: str, jars: Sequence[str] = ()) -> str:
    """The JVM option that maps the archive for ``coordinates`` and ``jars``, or "" when
    none has been recorded."""
    archive = archive_path(coordinates, jars)
    return f"-XX:SharedArchiveFile={archive}" if archive.is_file() else ""


def recording_options(into: Path) -> str:
    """The JVM options that write the archive to ``into`` at the JVM's exit, without a
    warning for each class it leaves out (signed jars', generated ones)."""
    return f"-XX:ArchiveClassesAtExit={into} -Xlog:cds*=error"


def archive_problem(archive: Path, class_path: str) -> str | None:
    """Why a driver JVM with this class path could not map ``archive``, in the JVM's
    words, or None when it maps it. A JVM given a truncated archive crashes at its
    start (SIGBUS) and one it cannot use starts without it, so a recording is checked
    before it is put in place: a ``java -version`` that must map it."""
    java = java_binary()
    if java is None:
        return "no java"
    checked = subprocess.run(
        [str(java), "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", class_path,
         "-XX:ErrorFile=/dev/null", "-XX:-CreateCoredumpOnCrash", "-version"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    if checked.returncode == 0:
        return None
    said = [x for x in checked.stderr.splitlines() if x.strip() and not x.startswith("#")]
    return " ".join(said[:3]) or f"java exited with {checked.returncode}"
