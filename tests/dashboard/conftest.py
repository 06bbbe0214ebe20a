"""Fixtures for the dashboard tests: a small sample lakehouse and a private rules folder.

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
from dashboard.testing import APP, copy_rules


@pytest.fixture
def rules_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped rule files that the Rules page may write into."""
    folder = copy_rules(tmp_path / "rules")
    monkeypatch.setenv("LOOKOUT_RULES_DIR", str(folder))
    return folder


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
