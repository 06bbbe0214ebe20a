"""The dashboard end to end in Debian's headless Chromium (Playwright).

A real `streamlit run dashboard/app.py` serves the sample lakehouse on a free loopback
port. The browser opens every page and checks what an operator would look for, then
acknowledges an alert (it must land in the `alert_acks` Delta table) and saves an
invalid rule (refused, the error shown at its line and column) and then a valid one
(written to the rules folder).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from dashboard.sample import write_health
from dashboard.testing import chromium, served

pytestmark = pytest.mark.browser

TIMEOUT_MS = 30_000


@pytest.fixture
def page(lakehouse: Path, rules_folder: Path, tmp_path: Path) -> Iterator[Any]:
    """A browser tab on a dashboard served over the sample lakehouse."""
    write_health(lakehouse, int(time.time() * 1000) + 60_000)  # "up" for the whole test
    with (
        served(lakehouse, rules_folder, log=tmp_path / "streamlit.log") as url,
        chromium() as browser,
    ):
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.set_default_timeout(TIMEOUT_MS)
        tab.base_url = url
        yield tab
    log = (tmp_path / "streamlit.log").read_text()
    assert "Traceback" not in log, log


def visit(page: Any, path: str, *expected: str) -> None:
    """Open a page and wait until each expected text is drawn (table cells are drawn on a
    canvas, so their text is only attached to the DOM for screen readers)."""
    page.goto(f"{page.base_url}/{path}")
    for text in expected:
        page.get_by_text(text, exact=False).first.wait_for(state="attached")
    assert page.get_by_text("Traceback").count() == 0


def choose(page: Any, box: str, text: str) -> None:
    """Pick the first option containing `text` in a multiselect. Typing filters the options
    (and keeps "Select all" out of the way); a rerun right after a page switch redraws the
    widget and closes its list, so the typing is retried until the list stays open."""
    combobox = page.get_by_role("combobox", name=box)
    option = page.get_by_role("option").filter(has_text=text).first
    for _ in range(10):
        combobox.fill(text)
        try:
            option.wait_for(timeout=2000)
            option.click()
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"no option {text!r} in {box!r}")


def save_rule(page: Any, name: str, text: str, outcome: Any) -> None:
    """Type a rule file into the editor and press Save until `outcome` shows (the same
    post-navigation redraw as in `choose` can wipe what was typed)."""
    for _ in range(5):
        page.get_by_placeholder("e.g. my_rules").fill(name)
        page.get_by_placeholder("e.g. my_rules").press("Enter")
        editor = page.get_by_placeholder("CREATE ALERT ... AS SELECT")
        editor.fill(text)
        editor.press("Control+Enter")  # commit the text before the click
        page.get_by_role("button", name="Save").click()
        try:
            outcome.wait_for(timeout=5000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"saving {name} never showed the expected outcome")


def test_every_page_acknowledge_and_rules(page: Any, lakehouse: Path, rules_folder: Path) -> None:
    visit(page, "", "matching alerts", "station 7:", "Alerts over time")
    visit(page, "traffic", "congested", "silent", "Per station, last 60 minutes", "Station detail")
    visit(page, "rfid", "doors with recent reads", "item item-0042 left through door 4")
    visit(
        page,
        "health",
        "Engine queries",
        "stage-congestion",
        "missing field 'ts'",
        "readings_traffic",
    )
    assert page.get_by_text("up", exact=True).count() == 2  # engine and ingest-0

    # Acknowledge the newest open alert with a note.
    visit(page, "", "Acknowledge alerts")
    choose(page, "Open alerts", "station=7")
    page.keyboard.press("Escape")
    page.get_by_label("Note").fill("crew dispatched")
    page.get_by_role("button", name="Acknowledge").click()
    page.get_by_text("Acknowledged 1 alert(s).").wait_for()
    acks = DeltaTable(str(lakehouse / "alert_acks")).to_pyarrow_table().to_pylist()
    assert [a["note"] for a in acks] == ["crew dispatched"]

    # An invalid rule is refused with its line:col; a valid one is saved.
    visit(page, "rules", "alert larceny", "Write or edit a rule file")
    save_rule(
        page,
        "slow_traffic",
        "CREATE ALERT slow SEVERITY warning\n  AS SELECT station, ts FROM trafic;\n",
        page.get_by_text("nothing was saved"),
    )
    page.get_by_text("2:30: unknown stream 'trafic'").first.wait_for()
    assert not (rules_folder / "slow_traffic.sql").exists()

    save_rule(
        page,
        "slow_traffic",
        "CREATE ALERT slow SEVERITY warning\n"
        "  AS SELECT station, ts, speed FROM traffic WHERE speed < 5;\n",
        page.get_by_text(re.compile(r"^Saved ")),
    )
    assert "speed < 5" in (rules_folder / "slow_traffic.sql").read_text()
