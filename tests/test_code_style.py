"""The code stays ruff-clean (lint and format) and mypy-clean, as `pyproject.toml`
configures them: CI runs the tests, so a change that breaks the style or the types
fails there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff_is_clean(command: list[str]) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_mypy_is_clean() -> None:
    # The packages and strictness come from [tool.mypy]; its cache (.mypy_cache, about
    # 30 s to fill on a slow machine) makes a run after a small change take seconds.
    run = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
