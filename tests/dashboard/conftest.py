"""Fixtures for the dashboard tests: a small sample lakehouse, a private copy of the rule
library and a user rule store beside it, and no sign-in unless a test turns it on.

The tables are written with delta-rs (no Spark) in the schemas of engine/tables.py;
`dashboard.sample` plants congestion at stations 3 and 7, a silent station 5 and a theft
at door 4, so each page has something definite to show.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.sample import write_sample
from dashboard.testing import APP, copy_rules, free_port


@pytest.fixture(autouse=True)
def no_sign_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages open without signing in (the sign-in tests turn it on), and no account of
    the machine's (users file, password variable) counts. No Alertmanager answers
    (nothing listens at its URL) unless a test starts one: a demo's running on this
    machine is not the tests'."""
    monkeypatch.setenv("LOOKOUT_ALERTMANAGER_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("LOOKOUT_DASHBOARD_LOGIN", "false")
    monkeypatch.setenv("LOOKOUT_DASHBOARD_USERS_FILE", str(tmp_path / "dashboard-users"))
    monkeypatch.delenv("LOOKOUT_DASHBOARD_PASSWORD", raising=False)


@pytest.fixture
def rules_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped rule library (the tests may change it behind the
    dashboard's back), with the user rule store `rules.d` beside it."""
    folder = copy_rules(tmp_path / "rules")
    monkeypatch.setenv("LOOKOUT_RULES_PATHS", str(folder))
    monkeypatch.setenv("LOOKOUT_RULES_USER_PATH", str(tmp_path / "rules.d"))
    return folder


@pytest.fixture
def rule_store(rules_folder: Path) -> Path:
    """The user rule store the Rules page writes (absent until the first save)."""
    return rules_folder.parent / "rules.d"


@pytest.fixture
def empty_lakehouse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rules_folder: Path) -> Path:
    """A lakehouse folder with nothing in it yet."""
    root = tmp_path / "lakehouse"
    root.mkdir()
    monkeypatch.setenv("LOOKOUT_LAKEHOUSE_PATH", str(root))
    return root


@pytest.fixture
def lakehouse(empty_lakehouse: Path) -> Path:
    """The sample lakehouse ending now: 3,000 traffic readings, 40 alerts, RFID reads."""
    write_sample(empty_lakehouse, readings=3000, alerts=40)
    return empty_lakehouse


@pytest.fixture
def open_page() -> Callable[[str], AppTest]:
    """Run the app and switch to one page (`alerts`, `traffic`, ...)."""

    def run(page: str) -> AppTest:
        app = AppTest.from_file(str(APP), default_timeout=60).run()
        app.switch_page(f"views/{page}.py").run()
        assert not app.exception, [e.value for e in app.exception]
        return app

    return run
