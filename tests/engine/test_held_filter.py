"""A stream whose every stage filters its rows first holds only the rows a filter keeps
(`engine.core.pipeline`): a split replay evaluates an unkeyed alert over a WHERE apart
from the keyed stages, and it held and sorted every reading of the stream."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from engine.core.pipeline import Pipeline
from engine.core.plan import Plan
from engine.core.replay import arrival_table
from rules.language.loader import load_rules

STREAM = """CREATE STREAM traffic (station INT, speed DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings';
CREATE ALERT fast SEVERITY warning MESSAGE 'fast'
  AS SELECT station, ts, speed FROM traffic WHERE speed > 30;
"""
SLOW = """CREATE ALERT slow SEVERITY warning MESSAGE 'slow'
  AS SELECT station, ts, speed FROM traffic WHERE speed < 5;
"""
EVERY = """CREATE STREAM every_reading AS SELECT station, ts FROM traffic;
"""


def _plan(tmp_path: Path, text: str) -> Plan:
    (tmp_path / "rules.sql").write_text(text)
    return load_rules([tmp_path / "rules.sql"]).plan


def _held_and_emitted(plan: Plan) -> tuple[list[float], dict[str, int]]:
    """The speeds held after 100 readings a second apart (the last three within the
    slack), then, once every window has closed, the rows each sink got."""
    schema = next(s for s in plan.sources() if s.name == "traffic")
    speeds = [[40.0, 20.0, 2.0][n % 3] for n in range(100)]
    rows = [{"station": n % 4, "speed": v, "ts": 1_000 * n} for n, v in enumerate(speeds)]
    pipeline = Pipeline(plan)
    first = pipeline.process({"traffic": arrival_table(schema, rows)})
    held = [v for t in pipeline.held["traffic"].rows for v in t.column("speed").to_pylist()]
    emitted: Counter[str] = Counter()
    for out in [*first.outputs, *pipeline.finish().outputs]:
        emitted[out.sink] += out.table.num_rows
    return held, dict(emitted)


@pytest.mark.parametrize(
    ("rules", "held", "emitted"),
    [
        # Held: readings 97 (20 m/s), 98 (2 m/s) and 99 (40 m/s).
        (STREAM, [40.0], {"fast": 34}),
        (STREAM + SLOW, [2.0, 40.0], {"fast": 34, "slow": 33}),
        (STREAM + EVERY, [20.0, 2.0, 40.0], {"fast": 34, "every_reading": 100}),
    ],
)
def test_only_rows_a_stage_keeps_are_held(
    tmp_path: Path, rules: str, held: list[float], emitted: dict[str, int]
) -> None:
    assert _held_and_emitted(_plan(tmp_path, rules)) == (held, emitted)
