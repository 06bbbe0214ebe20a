"""A standby waits on idle CPU only and runs normally from its takeover: every thread of
`lookout engine --standby` and of the processes it started (Spark's JVM, the Python
workers) is under SCHED_IDLE while another engine holds the lock, and under the normal
policy once it has taken over."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from engine.engine_lock import EngineLock
from lookout.demo import stop_process
from lookout.priority import can_leave_idle
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        not can_leave_idle() or os.sched_getscheduler(0) != os.SCHED_OTHER,
        reason="this process may not leave SCHED_IDLE, or runs under another policy",
    ),
]


def policies(pid: int) -> dict[str, set[int]]:
    """Each process of the tree under `pid` (by its name) and its threads' policies."""
    found: dict[str, set[int]] = {}
    root = psutil.Process(pid)
    for process in (root, *root.children(recursive=True)):
        try:
            values = {os.sched_getscheduler(t.id) for t in process.threads()}
            found.setdefault(process.name(), set()).update(values)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return found


def test_a_standby_waits_on_idle_cpu_and_runs_normally_from_its_takeover(tmp_path: Path) -> None:
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
        waiting = policies(standby.pid)
        assert "java" in waiting, waiting
        assert set().union(*waiting.values()) == {os.SCHED_IDLE}, waiting
        assert "on idle CPU only" in log.read_text()
        held.release()
        wait_for(lambda: "standby: taking over" in log.read_text(), 60, "the takeover")
        running = policies(standby.pid)
        assert set().union(*running.values()) == {os.SCHED_OTHER}, running
    finally:
        held.release()
        assert stop_process(standby, 120), log.read_text()[-3000:]
