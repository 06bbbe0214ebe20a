"""Fault injection on the whole pipeline, every part a real process: while
the simulator publishes, ingest and the engine are killed with SIGKILL, mosquitto is
restarted and the dashboard is killed, each at a seeded random moment and restarted;
the engine runs with a standby, which takes over when it is killed.
Afterwards every generated reading must be stored exactly once and the alerts must be
those of an undisturbed run (replay of the same seed): same ids, none twice, none
missing. The harness is `benchmarks/pipeline_faults.py`, which also runs it at load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]

HARNESS = Path(__file__).resolve().parents[2] / "benchmarks" / "pipeline_faults.py"


def test_every_fault_loses_nothing_and_duplicates_no_alert(tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, str(HARNESS), "--rate", "500", "--duration", "30", "--seed", "3",
         "--faults", "ingest,engine,broker,dashboard", "--standby",
         "--json", str(report_file)],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert report_file.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(report_file.read_text())
    assert report["faults"] == ["ingest", "engine", "broker", "dashboard"]
    assert report["dashboard_back"], "the dashboard must serve again after its kill"
    assert report["readings_once"], "every reading in readings_traffic or late_readings, once"
    assert report["late_equal"] and report["late_sent"] > 0, "late capture: all, and only, late"
    assert report["alerts_equal"], "the alerts of an undisturbed run: same ids, each once"
    assert report["alerts"] > 0
    assert report["takeovers"] == 1, "the standby took over from the killed engine"
    # Each fault's recovery is reported: when the alerts were on time again after it.
    assert sorted(r["fault"] for r in report["recovery"]) == sorted(report["faults"])
    # The engine's /metrics was scraped (Prometheus text format) for the batch phases.
    assert report["breakdown"]["batch_phases"]["trigger"]["batches"] > 0
    assert run.returncode == 0
