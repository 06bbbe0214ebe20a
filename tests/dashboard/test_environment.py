"""The dashboard process runs with the environment it needs only: never the MQTT
password, and the S3 keys only when its lakehouse is in S3."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dashboard.testing import free_port
from lookout.broker import port_is_open
from lookout.config import Config
from lookout.services import dashboard_environment
from tests.waiting import wait_for

SECRETS = {
    "LOOKOUT_MQTT_PASSWORD": "mqtt-secret",
    "LOOKOUT_S3_SECRET_KEY": "s3-secret",
    "LOOKOUT_S3_ACCESS_KEY": "s3-key",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "LOOKOUT_MQTT_TLS_KEY": "/keys/client.key",
    "SOME_TOKEN": "token-secret",
}


def test_a_local_lakehouse_gets_no_secret() -> None:
    base = {"PATH": "/usr/bin", "HOME": "/root", "LOOKOUT_RULES_USER_PATH": "rules.d"}
    env = dashboard_environment(Config(lakehouse="/data/lake"), {**base, **SECRETS})
    assert env == {
        **base,
        "LOOKOUT_LAKEHOUSE_PATH": "/data/lake",
        "LOOKOUT_DASHBOARD_REFRESH_SECONDS": "2.0",
    }


def test_an_s3_lakehouse_gets_the_s3_keys_and_nothing_else() -> None:
    env = dashboard_environment(Config(lakehouse="s3://bucket/lake"), SECRETS)
    assert set(env) - {"LOOKOUT_LAKEHOUSE_PATH", "LOOKOUT_DASHBOARD_REFRESH_SECONDS"} == {
        "LOOKOUT_S3_SECRET_KEY",
        "LOOKOUT_S3_ACCESS_KEY",
        "AWS_SECRET_ACCESS_KEY",
    }


def test_the_served_dashboard_process_holds_no_secret(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        **SECRETS,
        "LOOKOUT_LAKEHOUSE_PATH": str(tmp_path / "lakehouse"),
        "LOOKOUT_DASHBOARD_PORT": str(port),
        "LOOKOUT_DASHBOARD_PASSWORD": "sign-in-secret",
    }
    # `lookout dashboard` replaces itself by the Streamlit server: same process id.
    server = subprocess.Popen(
        [sys.executable, "-m", "lookout.cli", "dashboard"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: port_is_open("127.0.0.1", port), 60, "the dashboard's port")
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
    finally:
        server.terminate()
        server.wait(10)
    names = {item.split(b"=", 1)[0].decode() for item in environ if item}
    assert not names & set(SECRETS)
    assert b"mqtt-secret" not in b"".join(environ)
    # What it needs is there: where to find programs, its sign-in password.
    assert {"PATH", "LOOKOUT_DASHBOARD_PASSWORD", "LOOKOUT_LAKEHOUSE_PATH"} <= names
