"""A standby's CPU scheduling (`lookout.priority`): SCHED_IDLE for it and every process
it starts, and the normal policy back for every thread of them all at its takeover; not
changed where it could not be changed back. Each case runs in a process of its own (a
thread under SCHED_IDLE would stay so on the test's worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lookout.priority import can_leave_idle

pytestmark = pytest.mark.skipif(
    os.sched_getscheduler(0) != os.SCHED_OTHER, reason="the tests run under another policy"
)

# Goes idle, starts a thread and a child process (with a thread of its own) that inherit
# it, then goes back to normal, and reports every thread's policy.
SCRIPT = """
import json, os, subprocess, sys, threading, time
import psutil
from lookout.priority import to_idle, to_normal

def policies(process):
    return sorted({os.sched_getscheduler(t.id) for t in process.threads()})

idle = to_idle()
stop = threading.Event()
threading.Thread(target=stop.wait, daemon=True).start()
naps = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start()"
child = subprocess.Popen([sys.executable, "-c", naps + "; time.sleep(30)"])
time.sleep(0.5)
me = psutil.Process()
waiting = {"self": policies(me), "child": policies(psutil.Process(child.pid))}
changed = to_normal() if idle else 0
print(json.dumps({"idle": idle, "waiting": waiting, "changed": changed,
                  "running": {"self": policies(me), "child": policies(psutil.Process(child.pid))}}))
child.kill()
"""

IDLE, NORMAL = os.SCHED_IDLE, os.SCHED_OTHER


def run(*prefix: str) -> dict:
    done = subprocess.run(
        [*prefix, sys.executable, "-c", SCRIPT],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.skipif(not can_leave_idle(), reason="this process may not leave SCHED_IDLE")
def test_every_thread_of_the_standby_and_its_children_gets_the_normal_policy_back() -> None:
    report = run()
    assert report["idle"]
    assert report["waiting"] == {"self": [IDLE], "child": [IDLE]}
    assert report["running"] == {"self": [NORMAL], "child": [NORMAL]}
    assert report["changed"] >= 4  # its main thread and another, and the child's two


def test_a_process_that_could_not_leave_idle_does_not_go_idle() -> None:
    # Without CAP_SYS_NICE (root loses it with the bounding set), and RLIMIT_NICE at 0.
    drop = ["setpriv", "--bounding-set", "-sys_nice", "--"] if os.geteuid() == 0 else []
    report = run("prlimit", "--nice=0", "--", *drop)
    assert not report["idle"]
    assert report["waiting"] == {"self": [NORMAL], "child": [NORMAL]}
