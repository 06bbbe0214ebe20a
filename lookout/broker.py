"""Start a local mosquitto from the configuration shipped in `deploy/mosquitto.conf`.

Used by `lookout demo` (when no broker is listening) and by the tests (one broker per
test session on a free port). A packaged mosquitto started as root drops to user
`mosquitto` (DESIGN §7), which cannot reach a state folder inside a private (0700) one
such as pytest's temporary folders: persistence then silently never happens and
sessions do not survive a restart. So the broker started here keeps the uid of whoever
starts it (`user` in the rendered configuration) and owns its state folder as that user.
"""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SHIPPED_CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "mosquitto.conf"


def port_is_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Broker:
    """A running mosquitto process and where it keeps its state."""

    host: str
    port: int
    state_dir: Path
    process: subprocess.Popen[bytes] | None = None
    extra_config: str = ""

    @property
    def log_file(self) -> Path:
        return self.state_dir / "mosquitto.log"

    def write_config(self) -> Path:
        """Render the shipped configuration for this port and state folder."""
        persistence = self.state_dir / "persistence"
        persistence.mkdir(parents=True, exist_ok=True)
        text = SHIPPED_CONFIG.read_text()
        text = text.replace("listener 1883 127.0.0.1", f"listener {self.port} {self.host}")
        text = text.replace("@PERSISTENCE_DIR@", f"{persistence}/")
        text = text.replace("@LOG_FILE@", str(self.log_file))
        conf = self.state_dir / "mosquitto.conf"
        self.log_file.touch()
        keep_uid = "\n# Keep the uid that starts it: the state folder may be private.\n"
        keep_uid += f"user {getpass.getuser()}\n"
        conf.write_text(text + keep_uid + self.extra_config)
        return conf

    def start(self, timeout: float = 10.0) -> Broker:
        """Start mosquitto and wait until it accepts connections."""
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        conf = self.write_config()
        # A session of its own: a terminal's Ctrl-C reaches `lookout demo`, which stops
        # the parts that use the broker first, and the broker last.
        self.process = subprocess.Popen(
            [exe, "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = (
                    self.process.stderr.read().decode(errors="replace")
                    if self.process.stderr
                    else ""
                )
                raise RuntimeError(f"mosquitto exited at start: {err or self.log_file.read_text()}")
            if port_is_open(self.host, self.port):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.host}:{self.port} in {timeout}s")

    def stop(self, kill: bool = False) -> None:
        """Stop mosquitto (SIGTERM saves persistence; kill=True simulates a crash)."""
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, kill: bool = False) -> None:
        """Stop and start again on the same port with the same persistence."""
        self.stop(kill=kill)
        self.start()
