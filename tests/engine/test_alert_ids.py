"""Alert ids: equal rows emitted twice are two alerts; the same input gives the same ids."""

from __future__ import annotations

from pathlib import Path

from engine.core.replay import run
from lookout.replay import alert_ids
from rules.language.loader import load_rules

RULES = """\
CREATE STREAM traffic (station INT, lane INT, speed DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings';
CREATE ALERT fast SEVERITY warning MESSAGE 'station {station}: {speed}'
  AS SELECT station, lane, ts, speed FROM traffic WHERE speed > 40;
"""


def test_equal_alert_rows_get_distinct_ids_and_reruns_the_same(tmp_path: Path) -> None:
    (tmp_path / "r.sql").write_text(RULES)
    plan = load_rules([tmp_path / "r.sql"]).plan

    # Two vehicles, same station, lane, millisecond and speed: two alerts, equal rows.
    def reading(speed: float, ts: int, seq: int) -> tuple[str, dict]:
        row = {"station": 2, "lane": 4, "speed": speed, "ts": ts, "source": "s2", "seq": seq}
        return "traffic", row

    readings = [reading(47.8, 1_000, 1), reading(47.8, 1_000, 2), reading(20.0, 2_000, 3)]
    outputs = run(plan, readings).outputs
    first, second = (o.row for o in outputs)
    assert first == second
    ids = alert_ids(plan, outputs)
    assert len(ids) == 2 and len(set(ids)) == 2
    assert alert_ids(plan, run(plan, readings, batch=1).outputs) == ids
