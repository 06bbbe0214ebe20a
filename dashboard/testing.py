"""The dashboard as a real server in a real browser: for the browser tests, the load
benchmark and the screenshots.

`served(lakehouse, rules)` runs `streamlit run dashboard/app.py` on a free loopback
port in a subprocess (sign-in off unless a password is given); `chromium()` opens
Debian's headless Chromium through Playwright (never a downloaded browser).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lookout.config import Config, DashboardConfig
from lookout.passwords import PASSWORD_VARIABLE
from lookout.services import dashboard_command

APP = Path(__file__).resolve().parent / "app.py"  # what dashboard_command serves
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGES = {"alerts": "", "traffic": "traffic", "rfid": "rfid", "rules": "rules", "health": "health"}


def copy_rules(dest: Path) -> Path:
    """Copy the shipped rule files and the data files they name (`*.sql`, `*.csv`)."""
    dest.mkdir(parents=True, exist_ok=True)
    for pattern in ("*.sql", "*.csv"):
        for path in (APP.parent.parent / "rules").glob(pattern):
            shutil.copy(path, dest / path.name)
    return dest


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def served(
    lakehouse: Path,
    rules: Path,
    refresh_seconds: float = 2.0,
    log: Path | None = None,
    script: Path | None = None,
    password: str | None = None,
) -> Iterator[str]:
    """Serve the dashboard (or another Streamlit `script`, the same way) over
    `lakehouse` and the rule library `rules` (the user rule store beside it, `rules.d`),
    with sign-in as `operator` with `password` (None: no sign-in); yields its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "LOOKOUT_LAKEHOUSE_PATH": str(lakehouse),
        "LOOKOUT_RULES_PATHS": str(rules),
        "LOOKOUT_RULES_USER_PATH": str(rules.parent / "rules.d"),
        "LOOKOUT_DASHBOARD_REFRESH_SECONDS": str(refresh_seconds),
        "LOOKOUT_DASHBOARD_LOGIN": "false" if password is None else "true",
        PASSWORD_VARIABLE: password or "",
    }
    # The command line `lookout dashboard` runs, on a free loopback port.
    command = dashboard_command(Config(dashboard=DashboardConfig(address="127.0.0.1", port=port)))
    if script is not None:
        command[command.index(str(APP))] = str(script)
    with open(log or os.devnull, "wb") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(url, server)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _wait_healthy(url: str, server: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"the dashboard did not answer at {url} within {timeout} s")


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Debian's) driven by Playwright; yields the browser."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
