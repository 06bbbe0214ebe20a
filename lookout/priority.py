"""A standby's CPU scheduling: the idle policy while it waits beside a running engine,
the normal policy back at its takeover.

A standby started while the engine runs (a supervisor bringing a killed engine back as
the standby) spends about 25 s of a core starting Spark and rehearsing the query. On a
machine the running engine shares, that time came out of the engine's batches, and the
alerts of that minute were late. A lower nice value was not enough: the engine's batch
is a chain of short waits (its Python worker and its JVM answering each other over a
socket), and each wake-up waited for the standby's time slice on the other core. Under
Linux's SCHED_IDLE policy a thread runs only on a core nothing else wants, and a
normal thread waking up takes its core at once. So the standby waits under it, and
every thread of it and of the processes it started (its JVM, the Python workers) gets
the normal policy back when it takes over; threads and processes started meanwhile
inherit their creator's policy.

Leaving SCHED_IDLE needs the right to (CAP_SYS_NICE, or an RLIMIT_NICE that allows the
thread's nice value): without it the standby would stay idle after its takeover, so it
does not change its policy at all (`can_leave_idle`).
"""

from __future__ import annotations

import os
import threading

import psutil

_NORMAL = os.sched_param(0)


def can_leave_idle() -> bool:
    """Whether this process may take a thread out of SCHED_IDLE: tried on a throwaway
    thread."""
    allowed: list[bool] = []

    def attempt() -> None:
        tid = threading.get_native_id()
        os.sched_setscheduler(tid, os.SCHED_IDLE, _NORMAL)
        try:
            os.sched_setscheduler(tid, os.SCHED_OTHER, _NORMAL)
            allowed.append(True)
        except PermissionError:
            allowed.append(False)

    thread = threading.Thread(target=attempt, name="priority-check")
    thread.start()
    thread.join()
    return bool(allowed and allowed[0])


def to_idle() -> bool:
    """Put every thread of this process under SCHED_IDLE (the processes it starts from
    now on inherit it) when it can leave it again; whether it did."""
    if os.sched_getscheduler(0) != os.SCHED_OTHER or not can_leave_idle():
        return False
    for thread in psutil.Process().threads():
        os.sched_setscheduler(thread.id, os.SCHED_IDLE, _NORMAL)
    return True


def to_normal() -> int:
    """Put every thread of this process and of its descendants back under the normal
    policy; the number of threads changed. Threads that start meanwhile inherit the idle
    policy, so it looks again until a pass changes none."""
    changed = 0
    for _ in range(5):
        found = 0
        me = psutil.Process()
        for process in (me, *me.children(recursive=True)):
            try:
                threads = process.threads()
            except psutil.NoSuchProcess:
                continue
            for thread in threads:
                try:
                    if os.sched_getscheduler(thread.id) == os.SCHED_IDLE:
                        os.sched_setscheduler(thread.id, os.SCHED_OTHER, _NORMAL)
                        found += 1
                except ProcessLookupError:  # the thread ended meanwhile
                    continue
        changed += found
        if not found:
            break
    return changed
