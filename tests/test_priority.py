"""A standby's CPU priority (`lookout.priority`): lowered for it and every process it
starts, and back for every thread of them all at its takeover; not lowered where it
could not be raised back. Each case runs in a process of its own (a nice value, once
raised, would stay on the test's worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lookout.priority import can_raise

pytestmark = pytest.mark.skipif(
    os.getpriority(os.PRIO_PROCESS, 0) >= 19, reason="at nice 19 no priority is lower"
)

# Lowers its priority, starts a thread and a child process (with a thread of its
# own) that inherit it, then restores, and reports every thread's nice value.
SCRIPT = """
import json, os, subprocess, sys, threading, time
import psutil
from lookout.priority import lower, restore

def nices(process):
    return sorted({os.getpriority(os.PRIO_PROCESS, t.id) for t in process.threads()})

was = os.getpriority(os.PRIO_PROCESS, 0)
back = lower(int(sys.argv[1]))
stop = threading.Event()
threading.Thread(target=stop.wait, daemon=True).start()
naps = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start()"
child = subprocess.Popen([sys.executable, "-c", naps + "; time.sleep(30)"])
time.sleep(0.5)
me = psutil.Process()
lowered = {"self": nices(me), "child": nices(psutil.Process(child.pid))}
changed = restore(back) if back is not None else 0
print(json.dumps({"was": was, "back": back, "lowered": lowered, "changed": changed,
                  "restored": {"self": nices(me), "child": nices(psutil.Process(child.pid))}}))
child.kill()
"""


def run(by: int, *prefix: str) -> dict:
    done = subprocess.run(
        [*prefix, sys.executable, "-c", SCRIPT, str(by)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.skipif(not can_raise(), reason="this process may not raise a priority back")
def test_every_thread_of_the_standby_and_its_children_gets_its_priority_back() -> None:
    report = run(10)
    low = min(report["was"] + 10, 19)
    assert report["back"] == report["was"]
    assert report["lowered"] == {"self": [low], "child": [low]}
    assert report["restored"] == {"self": [report["was"]], "child": [report["was"]]}
    assert report["changed"] >= 4  # its main thread and another, and the child's two


def test_a_process_that_could_not_raise_it_back_does_not_lower_it() -> None:
    # Without CAP_SYS_NICE (root loses it with the bounding set), and RLIMIT_NICE at 0.
    drop = ["setpriv", "--bounding-set", "-sys_nice", "--"] if os.geteuid() == 0 else []
    report = run(10, "prlimit", "--nice=0", "--", *drop)
    assert report["back"] is None
    assert report["lowered"] == {"self": [report["was"]], "child": [report["was"]]}


def test_nothing_is_lowered_by_zero() -> None:
    report = run(0)
    assert report["back"] is None
    assert report["lowered"]["self"] == [report["was"]]
