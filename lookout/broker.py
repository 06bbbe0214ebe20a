"""Start a local mosquitto from the configuration shipped in `deploy/mosquitto.conf`.

Used by `lookout broker`, `lookout demo` (when no broker is listening) and by the tests
(one broker per test session on a free port). It logs clients in with the
installation's credentials (`lookout.mqtt_auth`): its password and ACL files are written
from them into its state folder, which is private (0700) since its log names every
client id. A packaged mosquitto started as root drops to user `mosquitto`, which cannot
reach a state folder inside a private one such as pytest's temporary folders:
persistence then silently never happens and sessions do not survive a restart. So the
broker started here keeps the uid of whoever starts it (`user` in the rendered
configuration) and owns its state folder as that user.
"""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from lookout.config import MqttConfig
from lookout.mqtt_auth import Credentials, broker_auth_files, load_or_create_credentials

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
    """A running mosquitto process and where it keeps its state.

    `credentials` are the logins it accepts; None: the installation's in the state
    folder (`mqtt-credentials`, made on first start).
    """

    host: str
    port: int
    state_dir: Path
    process: subprocess.Popen[bytes] | None = None
    extra_config: str = ""
    credentials: Credentials | None = None

    @property
    def log_file(self) -> Path:
        return self.state_dir / "mosquitto.log"

    def mqtt_config(self) -> MqttConfig:
        """How a Lookout part reaches this broker: its address and credentials file."""
        assert self.credentials is not None, "start() first"
        return MqttConfig(
            host=self.host, port=self.port, credentials_file=str(self.credentials.path)
        )

    def write_config(self) -> Path:
        """Render the shipped configuration for this port, state folder and logins."""
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)
        if self.credentials is None:
            self.credentials = load_or_create_credentials(self.state_dir / "mqtt-credentials")
        passwords, acl = broker_auth_files(self.credentials, self.state_dir)
        persistence = self.state_dir / "persistence"
        persistence.mkdir(parents=True, exist_ok=True)
        text = SHIPPED_CONFIG.read_text()
        text = text.replace("listener 1883 127.0.0.1", f"listener {self.port} {self.host}")
        text = text.replace("@PERSISTENCE_DIR@", f"{persistence}/")
        text = text.replace("@LOG_FILE@", str(self.log_file))
        text = text.replace("@PASSWORD_FILE@", str(passwords))
        text = text.replace("@ACL_FILE@", str(acl))
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
