"""The benchmark scripts import their siblings by module name (they run as
`python benchmarks/<script>.py`), so the tests put that folder on the path too."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
