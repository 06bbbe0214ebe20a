"""A waiting standby's lower CPU priority, read back from the kernel: every thread of
the process and of processes it starts, and its session group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from lookout.standby_priority import STANDBY_NICE

# Run in a process of its own session: a thread started before lower(), a child process
# and a thread started after it; the nice values of all of them, and of the session
# group, after lower() and after restore().
SCRIPT = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from lookout import standby_priority

    def nices(child):
        threads = [os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")]
        return {"threads": sorted(set(threads)),
                "child": os.getpriority(os.PRIO_PROCESS, child),
                "group": standby_priority.autogroup_nice()}

    if sys.argv[1] == "nobody":  # no permission to raise a priority
        os.setuid(65534)
    done = threading.Event()
    threading.Thread(target=done.wait, daemon=True).start()
    priority = standby_priority.lower()
    threading.Thread(target=done.wait, daemon=True).start()
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    lowered = nices(child)
    problem = priority.restore()
    print(json.dumps({"lowered": lowered, "restored": nices(child), "problem": problem}))
    os.kill(child, 9)
    """
)


def run(user: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, user],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        check=True,
    ).stdout
    return json.loads(out)


def group_nice(nice: int) -> int | None:
    """The session group's nice expected, where the kernel has session groups."""
    return nice if os.path.exists("/proc/self/autogroup") else None


def test_a_standby_waits_lower_and_takes_over_at_its_own_priority() -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)  # the script's, which it inherits
    seen = run("same")
    lowered = min(19, own + STANDBY_NICE)
    assert seen["lowered"] == {
        "threads": [lowered],
        "child": lowered,
        "group": group_nice(STANDBY_NICE),  # a new session's group starts at 0
    }
    assert seen["restored"] == {"threads": [own], "child": own, "group": group_nice(0)}
    assert seen["problem"] is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")
def test_without_the_permission_to_raise_it_the_standby_says_so_and_runs_on_lower() -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    seen = run("nobody")
    assert seen["restored"] == seen["lowered"]
    assert seen["problem"] == (
        f"no permission to raise its priority back from nice {min(19, own + STANDBY_NICE)} "
        f"to {own} (that needs root, CAP_SYS_NICE or a RLIMIT_NICE allowing it)"
    )
