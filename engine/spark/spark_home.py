"""The SPARK_HOME Lookout starts Spark from: pyspark's own, seen through a folder of
links in which `python/lib` is empty.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` (and py4j's zip) first on the path of
every Python process it starts: the data source's planner, the streaming source's runner,
the stateful step's schema runner, each worker daemon. Python keeps no bytecode for
modules it imports from a zip, so each of those processes compiled all of PySpark it
imports from source: 1.4 s of CPU to import the streaming source's runner from the zip,
0.6 s from the installed package. A query's start runs two of them one after the other,
and the engine's first start five or more. With `python/lib` empty they import the same
pyspark (its zip is built from the package) from the installed package, with its bytecode.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

import pyspark

log = logging.getLogger("lookout.engine")

PYTHON_FOLDER = "python"
"""The folder of `SPARK_HOME` whose `lib` Spark puts on the Python processes' path."""


def lookout_cache() -> Path:
    """Lookout's folder in the user's cache (`$XDG_CACHE_HOME`, else `~/.cache`): what an
    engine's start keeps for the next one."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lookout"


def pyspark_home() -> Path:
    """The Spark that pyspark ships (its package folder: `bin`, `jars`, ...)."""
    return Path(pyspark.__file__).parent


def spark_home() -> Path:
    """The SPARK_HOME to start Spark from: `$SPARK_HOME` when it names a Spark other than
    pyspark's own (its owner set up its Python path), else the linked folder of the
    module docstring, made once per pyspark in `lookout_cache()`; pyspark's own where
    that cannot be written (the engine runs, its Python processes start slower)."""
    real = pyspark_home()
    given = os.environ.get("SPARK_HOME")
    if given and Path(given).resolve() != real.resolve():
        return Path(given)
    digest = hashlib.sha256(str(real.resolve()).encode()).hexdigest()[:12]
    home = lookout_cache() / f"spark-home-{pyspark.__version__}-{digest}"
    if not _links_to(home, real):
        try:
            _make(home, real)
        except OSError as error:
            log.warning("cannot make %s (%s): Spark starts from %s", home, error, real)
            return real
        remove_abandoned(home.parent)
    return home


def remove_abandoned(cache: Path) -> list[Path]:
    """Delete the Spark homes in ``cache`` whose pyspark is gone (a virtual environment
    deleted: its home holds a class archive of about 170 MB); return them."""
    removed = []
    for home in cache.glob("spark-home-*"):
        jars = home / "jars"
        if home.suffix != ".tmp" and jars.is_symlink() and not jars.exists():
            shutil.rmtree(home, ignore_errors=True)
            removed.append(home)
    return removed


def _links_to(home: Path, real: Path) -> bool:
    """Whether `home` links every entry of `real` but its Python folder."""
    if not (home / PYTHON_FOLDER / "lib").is_dir():
        return False
    return all(
        (home / entry.name).resolve() == entry.resolve()
        for entry in real.iterdir()
        if entry.name != PYTHON_FOLDER
    )


def _make(home: Path, real: Path) -> None:
    """Build `home` beside itself and rename it into place: engines and tests start side
    by side, and one may be reading the folder another replaces."""
    partial = home.with_name(f"{home.name}.{os.getpid()}.tmp")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / PYTHON_FOLDER / "lib").mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name == PYTHON_FOLDER:
            # its other entries (the shell's start script) stay; `lib` is the empty one
            for inner in entry.iterdir():
                if inner.name != "lib":
                    (partial / PYTHON_FOLDER / inner.name).symlink_to(inner)
        else:
            (partial / entry.name).symlink_to(entry)
    if home.exists():
        shutil.rmtree(home, ignore_errors=True)  # a stale one, e.g. of a moved venv
    try:
        partial.rename(home)
    except OSError:  # another process put its own in place first: the same links
        shutil.rmtree(partial, ignore_errors=True)
