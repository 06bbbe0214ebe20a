"""Each module of the engine's core imports on its own, whatever was imported before it:
Spark's planning runners load only the modules they unpickle, so an import cycle that
another module's earlier import happens to break shows up there first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import engine.core

CORE = Path(engine.core.__file__).parent

# In one interpreter: before each module, every engine module is forgotten.
ONE_BY_ONE = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "engine" or m.startswith("engine.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except ImportError as err:
        failed.append(f"{name}: {err}")
print("\\n".join(failed))
"""


@pytest.mark.slow
def test_each_core_module_imports_on_its_own() -> None:
    names = sorted(
        "engine.core."
        + ".".join(path.relative_to(CORE).with_suffix("").parts).removesuffix(".__init__")
        for path in CORE.rglob("*.py")
    )
    done = subprocess.run(
        [sys.executable, "-c", ONE_BY_ONE, *names], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == ""
