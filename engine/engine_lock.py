"""One engine per lakehouse: an exclusive lock on `<lakehouse>/_checkpoints/engine.lock`.

Two engines on one lakehouse would run the same checkpoint twice: each would commit
batches the other also commits, and delete landing files the other has yet to read.
So `lookout engine` takes this lock before it starts Spark, and refuses to start while
another process holds it. A standby (`lookout engine --standby`) starts Spark first and
then waits for the lock: when the engine holding it stops or dies, the kernel releases
its lock (`flock`), and the standby takes over with its JVM already up.

The lock is an advisory `flock` on a local file, so it binds engines on one host (or a
filesystem whose locks span hosts). An object-store lakehouse has no such lock; the
engine then runs without one (one engine per lakehouse is the operator's to keep).
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from pathlib import Path

LOCK_NAME = "_checkpoints/engine.lock"


class EngineLock:
    """The lakehouse's engine lock, held by this process from `take` until `release`
    (or its exit, even by kill -9)."""

    def __init__(self, lakehouse: str) -> None:
        self.path = Path(lakehouse) / LOCK_NAME
        self._fd: int | None = None

    def take(self) -> bool:
        """Take the lock if no other process holds it; then write who holds it."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Held read-only: a file held open for writing would keep the lakehouse's
        # filesystem from being remounted read-only (or unmounted) under the engine.
        fd = os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.path.write_text(f"pid {os.getpid()} on {socket.gethostname()} since {started}\n")
        self._fd = fd
        return True

    def wait(self, stop: threading.Event, every_s: float = 0.1) -> bool:
        """Take the lock as soon as it is free (True), or give up when `stop` is set."""
        while not self.take():
            if stop.wait(every_s):
                return False
        return True

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it ('' if unknown)."""
        try:
            return self.path.read_text(errors="replace").strip()
        except OSError:
            return ""

    def release(self) -> None:
        """Let the lock go (closing the file releases it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
