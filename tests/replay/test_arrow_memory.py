"""Arrow's memory pool in `lookout replay` (`lookout.arrow_memory`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lookout.arrow_memory import POOL_VARIABLE
from rules.language.loader import RULES_DIR

SHOW_POOL = (
    "import pyarrow as pa, subprocess, sys\n"
    "pa.array(range(1000))\n"  # the default pool chosen before the switch
    "from lookout.arrow_memory import use_system_allocator\n"
    "use_system_allocator()\n"
    "child = 'import pyarrow as pa; print(pa.default_memory_pool().backend_name)'\n"
    "print(pa.default_memory_pool().backend_name)\n"
    "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout)"
)


def without_pool() -> dict[str, str]:
    """This environment without an operator's choice of pool."""
    return {k: v for k, v in os.environ.items() if k != POOL_VARIABLE}


def pools(environment: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", SHOW_POOL], env=environment, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_process_and_its_children_use_the_system_allocator() -> None:
    assert pools(without_pool()) == ["system", "system"]


@pytest.mark.parametrize("chosen", ["jemalloc", "mimalloc"])
def test_an_operators_choice_stands(chosen: str) -> None:
    assert pools({**os.environ, POOL_VARIABLE: chosen}) == [chosen, chosen]


def test_lookout_replay_switches_to_the_system_allocator(tmp_path: Path) -> None:
    readings = tmp_path / "readings.jsonl"
    readings.write_text(
        '{"station": 1, "lane": 1, "speed": 50.0, "length": 4.0, '
        '"ts": "2026-01-01T00:00:00Z", "source": "s", "seq": 1}\n'
    )
    replay = (
        "import pyarrow as pa, sys\n"
        "from lookout.cli import main\n"
        f"code = main(['replay', '--rules', {str(RULES_DIR / 'traffic.sql')!r}, '--input', "
        f"'traffic={readings}', '--out', {str(tmp_path / 'out')!r}, '--quiet', "
        "'--workers', '1'])\n"
        "print(code, pa.default_memory_pool().backend_name)"
    )
    out = subprocess.run(
        [sys.executable, "-c", replay], env=without_pool(), capture_output=True, text=True
    )
    assert out.stdout.split() == ["0", "system"], out.stderr
