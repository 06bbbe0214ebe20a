"""One engine per lakehouse: the engine lock refuses a second holder, is released by its
holder's death (kill -9 included), and `lookout engine` refuses to start beside a
running engine unless it is a standby. No Spark: the refusals come before it starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from engine.engine_lock import LOCK_NAME, EngineLock

ROOT = Path(__file__).resolve().parents[2]


def test_a_second_holder_is_refused_until_the_first_lets_go(tmp_path: Path) -> None:
    first, second = EngineLock(str(tmp_path)), EngineLock(str(tmp_path))
    assert first.take()
    assert first.take()  # taking it again is a no-op
    assert not second.take()
    assert second.holder().startswith(f"pid {os.getpid()} on ")
    first.release()
    assert second.take()
    assert not first.take()
    second.release()


def test_a_killed_holder_releases_the_lock_and_a_waiter_takes_it(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import time; from engine.engine_lock import EngineLock\n"
         f"assert EngineLock({str(tmp_path)!r}).take()\n"
         "print('held', flush=True); time.sleep(600)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        waiter = EngineLock(str(tmp_path))
        assert not waiter.take()
        assert waiter.holder().startswith(f"pid {holder.pid} on ")
        os.kill(holder.pid, signal.SIGKILL)
        guard = threading.Event()
        threading.Timer(60, guard.set).start()  # a guard against a lock never released
        assert waiter.wait(guard, every_s=0.05)
        guard.set()
        assert waiter.holder().startswith(f"pid {os.getpid()} on ")
    finally:
        holder.kill()
        holder.wait()


def test_the_holder_keeps_no_file_open_for_writing(tmp_path: Path) -> None:
    """A file held open for writing would keep the lakehouse's filesystem from being
    remounted read-only under the engine (the disk-full fault)."""
    lock = EngineLock(str(tmp_path))
    assert lock.take()
    try:
        lock_file = str((tmp_path / LOCK_NAME).resolve())
        held = [
            fd.name for fd in Path("/proc/self/fd").iterdir() if os.path.realpath(fd) == lock_file
        ]
        assert len(held) == 1
        info = Path(f"/proc/self/fdinfo/{held[0]}").read_text()
        flags = int(info.split("flags:")[1].split()[0], 8)
        assert flags & os.O_ACCMODE == os.O_RDONLY
    finally:
        lock.release()


def test_a_waiter_gives_up_when_told_to_stop(tmp_path: Path) -> None:
    held = EngineLock(str(tmp_path))
    assert held.take()
    stop = threading.Event()
    stop.set()
    assert not EngineLock(str(tmp_path)).wait(stop)


def engine_command(lakehouse: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOOKOUT_LAKEHOUSE_PATH": lakehouse}
    return subprocess.run(
        [sys.executable, "-m", "lookout.cli", "engine", "--rules", "rules/traffic.sql", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_engine_refuses_to_start_beside_a_running_engine(tmp_path: Path) -> None:
    held = EngineLock(str(tmp_path))
    assert held.take()
    run = engine_command(str(tmp_path))
    assert run.returncode == 2
    said = run.stderr.strip().splitlines()[-1]
    assert said.startswith(f"lookout engine: another engine runs on {tmp_path} (pid ")
    assert str(tmp_path / LOCK_NAME) in said and "--standby" in said


def test_a_standby_needs_a_lakehouse_it_can_lock() -> None:
    run = engine_command("s3://bucket/lakehouse", "--standby")
    assert run.returncode == 2
    assert "--standby needs the engine lock" in run.stderr
