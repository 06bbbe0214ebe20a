"""A standby's CPU priority: lowered while it waits beside a running engine, and back
at its takeover.

A standby started while the engine runs (a supervisor bringing a killed engine back as
the standby) spends about 25 s of a core starting Spark and rehearsing the query. On a
machine the running engine shares, that time would come out of the engine's batches,
and the alerts of that minute would be late. So the standby runs at a lower priority
(a higher nice value) while it waits, and every thread of it and of the processes it
started (its JVM, the Python workers) gets its priority back when it takes over.

Taking priority back needs the right to raise it (root with CAP_SYS_NICE, or an
RLIMIT_NICE that allows it): without it the standby would stay low after its takeover,
so it does not lower its priority at all (`can_raise`). On Linux a nice value belongs to
each thread, not to the process; a thread or process started later inherits its
creator's.
"""

from __future__ import annotations

import os
import threading

import psutil


def can_raise() -> bool:
    """Whether this process may give a thread back a priority it lowered: tried on a
    throwaway thread, lowered by one and set back."""
    allowed: list[bool] = []

    def attempt() -> None:
        tid = threading.get_native_id()
        was = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(was + 1, 19))
        try:
            os.setpriority(os.PRIO_PROCESS, tid, was)
            allowed.append(True)
        except PermissionError:
            allowed.append(False)

    thread = threading.Thread(target=attempt, name="priority-check")
    thread.start()
    thread.join()
    return bool(allowed and allowed[0])


def lower(by: int) -> int | None:
    """Lower this process's priority (its nice value up by `by`; the processes it starts
    from now on inherit it) when it can be raised back; the nice value to raise it back
    to, or None if it was left as it is."""
    if by <= 0 or not can_raise():
        return None
    was = os.getpriority(os.PRIO_PROCESS, 0)
    for thread in psutil.Process().threads():
        os.setpriority(os.PRIO_PROCESS, thread.id, min(was + by, 19))
    return was


def restore(nice: int) -> int:
    """Give every thread of this process and of its descendants the nice value `nice`
    again; the number of threads changed. Threads that start meanwhile inherit the old
    value, so it looks again until a pass changes none."""
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
                    if os.getpriority(os.PRIO_PROCESS, thread.id) != nice:
                        os.setpriority(os.PRIO_PROCESS, thread.id, nice)
                        found += 1
                except ProcessLookupError:  # the thread ended meanwhile
                    continue
        changed += found
        if not found:
            break
    return changed
