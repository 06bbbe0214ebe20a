"""Flink's figures for the Spark benchmark: `benchmarks/flink_windows.py` run by the Flink
virtualenv's python, over the same Parquet rows, as a subprocess.

apache-flink pins its own numpy/pandas/pyarrow, so it lives in a virtualenv of its own
(`benchmarks/flink_setup.sh` makes `.flink-venv` with the Parquet jars).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from flink_windows import RESULT_TAG

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "flink_windows.py"
DEFAULT_PYTHON = REPO / ".flink-venv" / "bin" / "python"


def flink_python(path: str | None = None) -> Path:
    """The Flink virtualenv's python: `path`, else $LOOKOUT_FLINK_PYTHON, else
    `.flink-venv/bin/python` in the repository."""
    return Path(path or os.environ.get("LOOKOUT_FLINK_PYTHON") or DEFAULT_PYTHON)


def flink_rates(
    parquet_path: str, slides: list[tuple[str, int]], python: str | None = None, repeat: int = 1
) -> dict[str, float]:
    """Rows/s of Flink SQL's HOP (TUMBLE for a 900 s slide) per slide label, over the
    Parquet readings at `parquet_path`; `slides` are (label, slide seconds) pairs; each
    rate is the median of `repeat` timed runs.

    Each slide's windows are checked against the oracle by flink_windows.py; a mismatch
    or any failure there is raised here as RuntimeError. Returns {} when the
    Flink virtualenv is missing, after saying how to make it."""
    exe = flink_python(python)
    if not exe.is_file():
        print(f"  Flink skipped: no {exe}; make it with `bash benchmarks/flink_setup.sh` "
              "or set LOOKOUT_FLINK_PYTHON")  # fmt: skip
        return {}
    seconds = [str(s) for _, s in slides]
    command = [str(exe), str(SCRIPT), "--input", parquet_path, "--json"]
    command += ["--repeat", str(repeat), "--slides", *seconds]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        # flink_windows.py exits with the reason (a window mismatch, a Java error) last
        raise RuntimeError(f"{SCRIPT.name} failed ({done.returncode}): {done.stderr[-3000:]}")
    lines = done.stdout.splitlines()
    for line in lines:
        if line.startswith("  Flink SQL"):
            print(line, flush=True)
    tagged = [line for line in lines if line.startswith(RESULT_TAG)]
    if not tagged:
        raise RuntimeError(f"{SCRIPT.name} printed no {RESULT_TAG.strip()} line:\n{done.stdout}")
    results = json.loads(tagged[-1].removeprefix(RESULT_TAG))
    return {name: results[str(s)]["rate"] for name, s in slides}
