"""A standby waits at a lower CPU priority and takes it back at its takeover: every
thread of `lookout engine --standby` and of the processes it started (Spark's JVM, the
Python workers) runs at nice +10 while another engine holds the lock, and at its own
nice value once it has taken over."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from engine.engine_lock import EngineLock
from lookout.demo import stop_process
from lookout.priority import can_raise
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
NICE = os.getpriority(os.PRIO_PROCESS, 0)

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not can_raise() or NICE >= 19, reason="no lower priority to take back"),
]


def nice_values(pid: int) -> dict[str, set[int]]:
    """Each process of the tree under `pid` (by its name) and its threads' nice values."""
    found: dict[str, set[int]] = {}
    root = psutil.Process(pid)
    for process in (root, *root.children(recursive=True)):
        try:
            values = {os.getpriority(os.PRIO_PROCESS, t.id) for t in process.threads()}
            found.setdefault(process.name(), set()).update(values)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return found


def test_a_standby_waits_at_a_lower_priority_and_takes_it_back(tmp_path: Path) -> None:
    lakehouse = tmp_path / "lakehouse"
    lakehouse.mkdir()
    held = EngineLock(str(lakehouse))
    assert held.take()  # the running engine
    log = tmp_path / "standby.log"
    env = {**os.environ, "LOOKOUT_LAKEHOUSE_PATH": str(lakehouse),
           "LOOKOUT_ENGINE_METRICS_PORT": "0"}  # fmt: skip
    with log.open("ab") as out:
        standby = subprocess.Popen(
            [sys.executable, "-m", "lookout.cli", "engine", "--standby",
             "--rules", "rules/traffic.sql"],
            cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: "standby: rehearsed the query" in log.read_text(), 240,
                 "the standby's rehearsal")  # fmt: skip
        waiting = nice_values(standby.pid)
        assert "java" in waiting, waiting
        assert set().union(*waiting.values()) == {min(NICE + 10, 19)}, waiting
        assert f"at nice {min(NICE + 10, 19)}" in log.read_text()
        held.release()
        wait_for(lambda: "standby: taking over" in log.read_text(), 60, "the takeover")
        running = nice_values(standby.pid)
        assert set().union(*running.values()) == {NICE}, running
    finally:
        held.release()
        assert stop_process(standby, 120), log.read_text()[-3000:]
