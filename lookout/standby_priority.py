"""A waiting standby's lower CPU priority (`lookout engine --standby`).

A standby started beside a running engine on the same cores (the killed engine coming
back, say) spends most of a core for half a minute: its JVM starts, Spark starts, and
the rehearsal's first batches load and compile classes. Run at the same priority, that
time is taken from the running engine's batches, and its alerts come late. So a standby
that finds an engine running lowers its priority before it starts Spark (the JVM and
its Python workers inherit it) and returns to its own when it takes over.

Linux gives each thread its own nice value, so both directions set every thread of the
process and its descendants. Where the kernel groups processes by session
(``/proc/<pid>/autogroup``), the nice values of threads only order threads within a
group and groups share the CPU equally; so a standby that leads its own session (as
service managers and the benchmarks start each part) lowers its group's nice value too. A
standby in a cgroup with its own CPU weight (a systemd unit's ``CPUWeight=``) is
ordered by that weight, which this module does not change.

Lowering needs no permission; raising it back needs ``CAP_SYS_NICE`` (root) or a
``RLIMIT_NICE`` that allows it. Without either the engine runs on at the lower
priority, and :meth:`Priority.restore` says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

STANDBY_NICE = 10
"""How much a waiting standby lowers its priority (nice values run from -20 to 19)."""

AUTOGROUP = Path("/proc/self/autogroup")


@dataclass(frozen=True)
class Priority:
    """A process's priority before :func:`lower` changed it."""

    nice: int
    lowered: int
    """Its nice value since."""
    autogroup_nice: int | None
    """Its session group's nice value, if :func:`lower` changed it too."""

    def restore(self) -> str | None:
        """Set this process, its descendants and its group back to this priority;
        return None, or why it could not (then they keep the lower one)."""
        try:
            _set_tree(self.nice)
            if self.autogroup_nice is not None:
                AUTOGROUP.write_text(f"{self.autogroup_nice}\n")
        except PermissionError:
            return (
                f"no permission to raise its priority back from nice {self.lowered} to "
                f"{self.nice} (that needs root, CAP_SYS_NICE or a RLIMIT_NICE allowing it)"
            )
        return None


def lower(by: int = STANDBY_NICE) -> Priority:
    """Lower the priority of this process's threads by ``by`` nice steps (threads and
    processes started from them later inherit it), and its session group's if it leads
    its own session; return the priority before."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    lowered = min(19, nice + by)
    _set_tree(lowered)
    group = autogroup_nice() if os.getsid(0) == os.getpid() else None
    if group is not None:
        try:
            AUTOGROUP.write_text(f"{min(19, group + by)}\n")
        except OSError:  # a kernel without session groups
            group = None
    return Priority(nice, lowered, group)


def autogroup_nice() -> int | None:
    """This process's session group's nice value, or None where the kernel has none."""
    try:
        return int(AUTOGROUP.read_text().split()[-1])  # "/autogroup-446 nice 0"
    except (OSError, ValueError, IndexError):
        return None


def _set_tree(nice: int) -> None:
    """Set the nice value of every thread of this process and of its descendants."""
    me = psutil.Process()
    for process in (me, *me.children(recursive=True)):
        try:
            threads = process.threads()
        except psutil.NoSuchProcess:
            continue
        for thread in threads:
            try:
                os.setpriority(os.PRIO_PROCESS, thread.id, nice)
            except ProcessLookupError:  # the thread ended meanwhile
                continue
