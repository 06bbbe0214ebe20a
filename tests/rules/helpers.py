"""Shared helpers for the rule-language tests."""

from __future__ import annotations

from pathlib import Path

from rules.language.access import LIBRARY_MODULES, RulePolicy
from rules.language.errors import RuleError
from rules.language.loader import check_paths

FIXTURES = RulePolicy(python_modules=(*LIBRARY_MODULES, "tests.rules.uda_fixtures"))
"""The default policy, and the test aggregates of `tests.rules.uda_fixtures` allowed."""

TRAFFIC = """\
CREATE STREAM traffic (station INT, lane INT, speed DOUBLE, length DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings';
"""

STREAMS = """\
CREATE STREAM north (station INT, speed DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/north/+/readings';
CREATE STREAM south (detector INT, velocity DOUBLE, at TIMESTAMP)
  ORDER BY at SLACK 5 SECONDS SOURCE 'lookout/south/+/readings';
CREATE STREAM both_ways AS
  SELECT station, speed, ts FROM north
  UNION ALL SELECT detector, velocity, at FROM south WHERE velocity > 0;
"""
"""Two streams and their UNION ALL (`both_ways`): the union tests' declarations."""


def check_text(tmp_path: Path, text: str, name: str = "rule.sql") -> tuple[str, list[RuleError]]:
    """Write `text` to a rule file and check it (the test aggregates allowed); return
    the file's path and the errors."""
    path = tmp_path / name
    path.write_text(text)
    return str(path), check_paths([path], FIXTURES)
