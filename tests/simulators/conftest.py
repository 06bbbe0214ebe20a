"""A private mosquitto on an ephemeral loopback port (to move to tests/conftest.py later)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """Start ``mosquitto -c conf`` on 127.0.0.1:<free port>; yield (host, port)."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed")
    port = _free_port()
    conf = tmp_path_factory.mktemp("mosquitto") / "mosquitto.conf"
    # Persistence off: mosquitto drops root to user mosquitto, which could not write here.
    conf.write_text(
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        "max_queued_messages 0\n"
        "persistence false\n"
        "log_dest stderr\n"
        "log_type error\n"
    )
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"mosquitto did not start: {proc.stderr.read().decode()}")
            time.sleep(0.05)
    yield "127.0.0.1", port
    proc.terminate()
    proc.wait(10)
