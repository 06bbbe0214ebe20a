"""Fixtures for tests against a real Alertmanager (Debian's, on loopback) and a real
webhook receiver on loopback, shared by the notifier's and the dashboard's tests
(loaded by tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lookout.alertmanager import Alertmanager, WebhookLog
from lookout.broker import free_port

GROUP_INTERVAL = 3.0


@pytest.fixture
def webhook() -> Iterator[WebhookLog]:
    receiver = WebhookLog().start()
    yield receiver
    receiver.stop()


@pytest.fixture
def alertmanager(tmp_path: Path, webhook: WebhookLog) -> Iterator[Alertmanager]:
    """One group per alert (`...`), so each notification is about one incident."""
    manager = Alertmanager(
        "127.0.0.1",
        free_port(),
        tmp_path / "alertmanager",
        webhook.url,
        group_by=("...",),
        group_wait="1s",
        group_interval=f"{GROUP_INTERVAL:.0f}s",
    ).start()
    yield manager
    manager.stop()
