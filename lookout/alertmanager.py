"""Alertmanager: a local one from the shipped `deploy/alertmanager.yml`, its v2 API, and
a webhook receiver that logs what it notifies.

Debian's `prometheus-alertmanager` package installs a system service too; Lookout never
relies on it. `lookout demo` and the tests start their own process on a loopback port
with the state (silences, the notification log) in a folder of their own, and with
clustering off (by default Alertmanager gossips on 0.0.0.0:9094).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SHIPPED_CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "alertmanager.yml"
BINARY = "prometheus-alertmanager"  # Debian's name; upstream's is `alertmanager`


class AlertmanagerError(RuntimeError):
    """Alertmanager could not be reached, or refused a request."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status when it answered; None when unreachable


def request(base_url: str, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
    """One call to the API at `base_url` (e.g. `/api/v2/alerts`); the decoded JSON
    answer, None for an empty one. Raises AlertmanagerError."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        base_url.rstrip("/") + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json"} if data is not None else {},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            text = answer.read()
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace").strip()
        raise AlertmanagerError(f"{method} {path}: HTTP {err.code}: {detail}", err.code) from err
    except OSError as err:  # refused, unreachable, timed out
        raise AlertmanagerError(f"{method} {path}: {base_url} unreachable: {err}") from err
    return json.loads(text) if text.strip() else None


def rfc3339(moment: datetime) -> str:
    """An aware datetime as the API's RFC 3339 text, in UTC."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def create_silence(
    base_url: str,
    matchers: dict[str, str],
    duration: timedelta,
    author: str,
    comment: str,
    timeout: float = 10.0,
) -> str:
    """Silence the alerts whose labels equal `matchers` from now for `duration`; the
    silence's id."""
    now = datetime.now(tz=UTC)
    body = {
        "matchers": [
            {"name": name, "value": value, "isRegex": False, "isEqual": True}
            for name, value in matchers.items()
        ],
        "startsAt": rfc3339(now),
        "endsAt": rfc3339(now + duration),
        "createdBy": author,
        "comment": comment,
    }
    return str(request(base_url, "POST", "/api/v2/silences", body, timeout)["silenceID"])


def list_silences(base_url: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Every silence Alertmanager holds (active, pending and expired), as its API gives them."""
    return list(request(base_url, "GET", "/api/v2/silences", timeout=timeout))


def matcher_matches(matcher: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether one of a silence's matchers matches `labels`, as Alertmanager decides: a
    label the alert lacks is the empty string, a regex must match the whole value, and
    `isEqual` false negates (`!=`, `!~`). A regex Python cannot read matches nothing."""
    value = labels.get(str(matcher["name"]), "")
    if matcher.get("isRegex"):
        try:
            found = re.fullmatch(str(matcher["value"]), value) is not None
        except re.error:
            return False
    else:
        found = value == matcher["value"]
    return found if matcher.get("isEqual", True) else not found


def silencing(silences: Iterable[Mapping[str, Any]], labels: Mapping[str, str]) -> list[Any]:
    """The active silences among `silences` (as `list_silences` gives them) that mute an
    alert with `labels`: every one of their matchers matches."""
    return [
        silence
        for silence in silences
        if silence.get("status", {}).get("state") == "active"
        and all(matcher_matches(m, labels) for m in silence.get("matchers", []))
    ]


def expire_silence(base_url: str, silence_id: str, timeout: float = 10.0) -> None:
    """End a silence now."""
    request(base_url, "DELETE", f"/api/v2/silence/{silence_id}", timeout=timeout)


def ready(base_url: str, timeout: float = 1.0) -> bool:
    """True when Alertmanager answers that it is ready."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/-/ready", timeout=timeout) as answer:
            return answer.status == 200
    except OSError:
        return False


@dataclass
class Alertmanager:
    """A running Alertmanager process on `host:port` and where it keeps its state.

    `webhook_url` is where its one receiver posts; the grouping settings fill the
    shipped configuration (tests shorten the intervals)."""

    host: str
    port: int
    state_dir: Path
    webhook_url: str
    group_by: tuple[str, ...] = ("alertname",)
    group_wait: str = "10s"
    group_interval: str = "1m"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The base URL of its API."""
        return f"http://{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.state_dir / "alertmanager.log"

    def write_config(self) -> Path:
        """Render the shipped configuration into the state folder."""
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        text = SHIPPED_CONFIG.read_text()
        text = text.replace("@GROUP_BY@", json.dumps(list(self.group_by)))
        text = text.replace("@GROUP_WAIT@", self.group_wait)
        text = text.replace("@GROUP_INTERVAL@", self.group_interval)
        text = text.replace("@WEBHOOK_URL@", self.webhook_url)
        conf = self.state_dir / "alertmanager.yml"
        conf.write_text(text)
        return conf

    def start(self, timeout: float = 20.0) -> Alertmanager:
        """Start Alertmanager and wait until it is ready."""
        exe = shutil.which(BINARY) or shutil.which("alertmanager")
        if exe is None:
            raise RuntimeError(
                f"no {BINARY} on PATH: install Debian's package of that name (./run does), "
                "or set [alertmanager] enabled = false"
            )
        conf = self.write_config()
        log = open(self.log_file, "ab")  # noqa: SIM115 - the child keeps it open
        # A session of its own, like the broker: `lookout demo` stops it after its users.
        self.process = subprocess.Popen(
            [
                exe,
                f"--config.file={conf}",
                f"--storage.path={self.state_dir / 'data'}",
                f"--web.listen-address={self.host}:{self.port}",
                "--cluster.listen-address=",  # no gossip port: one Alertmanager, loopback only
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"alertmanager exited at start:\n{self.log_file.read_text()}")
            if ready(self.url, 0.5):
                return self
            time.sleep(0.1)
        raise RuntimeError(f"alertmanager not ready on {self.url} in {timeout}s")

    def stop(self) -> None:
        """Stop it; SIGTERM lets it save its silences and notification log."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


class WebhookLog:
    """A webhook receiver on `host:port` (a thread of this process): every notification
    Alertmanager posts is kept in `received` and, with `log_path`, appended to that file
    as one JSON line."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, log_path: Path | None = None):
        self.received: list[dict[str, Any]] = []
        self.log_path = log_path
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                receiver.keep(json.loads(self.rfile.read(length) or b"{}"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # each notification is logged by keep()

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The URL to give Alertmanager's webhook receiver."""
        host, port = self.server.socket.getsockname()[:2]
        return f"http://{host}:{port}/notifications"

    def keep(self, notification: dict[str, Any]) -> None:
        """Record one notification, with when it arrived."""
        notification = {**notification, "received_at": time.time()}
        with self._lock:
            self.received.append(notification)
            if self.log_path is not None:
                with self.log_path.open("a") as out:
                    out.write(json.dumps(notification) + "\n")

    def snapshot(self) -> list[dict[str, Any]]:
        """The notifications received so far."""
        with self._lock:
            return list(self.received)

    def start(self) -> WebhookLog:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
