"""The dashboard end to end in Debian's headless Chromium (Playwright).

A real `streamlit run dashboard/app.py` serves the sample lakehouse on a free loopback
port, with sign-in on: the browser signs in on every page it opens (a new page load is
a new session), checks what an operator would look for, then acknowledges an alert (it
must land in the `alert_acks` Delta table, under the user's name) and saves an invalid
rule (refused, the error shown at its line and column) and then a valid one (written to
the user rule store).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from dashboard.sample import (
    alerts_table,
    rfid_readings,
    traffic_readings,
    write_health,
    write_red_health,
)
from dashboard.testing import chromium, served
from lookout.config import Config, DashboardConfig
from lookout.notify import to_alert

pytestmark = pytest.mark.browser

TIMEOUT_MS = 30_000


REFRESH_S = 1.0  # the live panels' refresh period in these tests
PASSWORD = "browser test password"


@pytest.fixture
def page(lakehouse: Path, rules_folder: Path, tmp_path: Path) -> Iterator[Any]:
    """A browser tab on a dashboard served over the sample lakehouse."""
    write_health(lakehouse, int(time.time() * 1000) + 60_000)  # "up" for the whole test
    log = tmp_path / "streamlit.log"
    with (
        served(lakehouse, rules_folder, REFRESH_S, log=log, password=PASSWORD) as url,
        chromium() as browser,
    ):
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.set_default_timeout(TIMEOUT_MS)
        tab.base_url = url
        yield tab
    log = (tmp_path / "streamlit.log").read_text()
    assert "Traceback" not in log, log


def visit(page: Any, path: str, *expected: str) -> None:
    """Open a page, sign in, and wait until each expected text is drawn (table cells are
    drawn on a canvas, so their text is only attached to the DOM for screen readers)."""
    page.goto(f"{page.base_url}/{path}")
    page.get_by_label("User").fill("operator")
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_text("Signed in as").wait_for()
    for text in expected:
        page.get_by_text(text, exact=False).first.wait_for(state="attached")
    assert page.get_by_text("Traceback").count() == 0


def choose(page: Any, box: str, text: str) -> None:
    """Pick the first option containing `text` in a multiselect or selectbox. Typing
    filters the options; a rerun right after a page switch redraws the widget and closes
    its list, so the typing is retried until the list stays open. While a rerun is
    drawing, Streamlit may briefly show the old widget beside the new one (two boxes
    of one name, which Playwright refuses to fill); that is retried too."""
    combobox = page.get_by_role("combobox", name=box)
    option = page.get_by_role("option").filter(has_text=text).first
    for _ in range(10):
        try:
            combobox.fill(text)
            option.wait_for(timeout=2000)
            option.click()
            return
        except PlaywrightTimeout:
            continue
        except PlaywrightError as error:
            if "strict mode violation" not in str(error):
                raise
            time.sleep(0.5)
    raise AssertionError(f"no option {text!r} in {box!r}")


def save_rule(page: Any, name: str, text: str, outcome: Any) -> None:
    """Type a rule file into the editor, press Save and wait for `outcome`. Once: since
    the pages moved out of `pages/`, nothing redraws the editor after navigation."""
    page.get_by_placeholder("e.g. my_rules").fill(name)
    page.get_by_placeholder("e.g. my_rules").press("Enter")
    editor = page.get_by_placeholder("CREATE ALERT ... AS SELECT")
    editor.fill(text)
    editor.press("Control+Enter")  # commit the text before the click
    page.get_by_role("button", name="Save").click()
    outcome.wait_for()


def test_every_page_acknowledge_and_rules(page: Any, lakehouse: Path, rule_store: Path) -> None:
    visit(page, "", "matching alerts", "station 7:", "Alerts over time")
    visit(page, "traffic", "congested", "silent", "Per station, last 60 minutes", "Station detail")
    visit(page, "rfid", "doors with recent reads", "item item-0042 left through door 4")
    visit(
        page,
        "health",
        "Engine queries",
        "Resident memory",
        "missing field 'ts'",
        "readings_traffic",
    )
    assert page.get_by_text("up", exact=True).count() == 2  # engine and ingest-0

    # Acknowledge one firing incident, then the newest open alert, each with a note.
    visit(page, "", "Acknowledge alerts")
    choose(page, "Incident", "station=3")
    page.get_by_label("Note on the incident").fill("lane closed")
    page.get_by_role("button", name="Acknowledge incident").click()
    page.get_by_text("Acknowledged congestion at station=3.").wait_for()
    acks = DeltaTable(str(lakehouse / "incident_acks")).to_pyarrow_table().to_pylist()
    assert [(a["note"], a["acked_by"]) for a in acks] == [("lane closed", "operator")]
    choose(page, "Open alerts", "station=7")
    page.keyboard.press("Escape")
    page.get_by_label("Note", exact=True).fill("crew dispatched")
    page.get_by_role("button", name="Acknowledge", exact=True).click()
    page.get_by_text("Acknowledged 1 alert(s).").wait_for()
    acks = DeltaTable(str(lakehouse / "alert_acks")).to_pyarrow_table().to_pylist()
    assert [(a["note"], a["acked_by"]) for a in acks] == [("crew dispatched", "operator")]

    # An invalid rule is refused with its line:col; a valid one is saved.
    visit(page, "rules", "alert larceny", "Write or edit a rule file")
    save_rule(
        page,
        "slow_traffic",
        "CREATE ALERT slow SEVERITY warning\n  AS SELECT station, ts FROM trafic;\n",
        page.get_by_text("nothing was saved"),
    )
    page.get_by_text("2:30: unknown stream 'trafic'").first.wait_for()
    assert not (rule_store / "slow_traffic.sql").exists()

    save_rule(
        page,
        "slow_traffic",
        "CREATE ALERT slow SEVERITY warning\n"
        "  AS SELECT station, ts, speed FROM traffic WHERE speed < 5;\n",
        page.get_by_text(re.compile(r"^Saved ")),
    )
    assert "speed < 5" in (rule_store / "slow_traffic.sql").read_text()


def test_health_red_and_the_recent_figures_on_a_1280_px_screen(page: Any, lakehouse: Path) -> None:
    write_red_health(lakehouse, int(time.time() * 1000) + 60_000)
    page.set_viewport_size({"width": 1280, "height": 800})
    visit(page, "health", "Health: red", "were duplicates (99.9 %; the limit is 5 %)")
    page.get_by_text("has stood at").wait_for(state="attached")
    column = page.locator("[role=columnheader]")
    column.filter(has_text=re.compile("^arrived/s$")).wait_for(state="attached")
    # The grid draws on a canvas; its screen-reader table holds the columns in view only.
    for name in ("status", "late", "duplicates", "conflicts", "clock still (s)"):
        header = column.filter(has_text=re.compile(f"^{re.escape(name)}$"))
        assert header.count() == 1, f"column {name!r} is not in view at 1280 px"


# ---- what an operator expects of the demo's data ------------------------------------------


def grid_rows(page: Any, after_heading: str) -> list[list[str]]:
    """The cells of each data row of the first table drawn after a heading (from the
    grid's screen-reader table, which holds the rows and columns in view)."""
    heading = page.get_by_role("heading", name=after_heading, exact=True)
    grid = heading.locator("xpath=following::*[@data-testid='stDataFrame'][1]")
    grid.locator("[role=gridcell]").first.wait_for(state="attached")
    rows = grid.locator("[role=row]")
    return [
        [cell.inner_text() for cell in rows.nth(i).locator("[role=gridcell]").all()]
        for i in range(1, rows.count())
    ]


def test_the_demo_data_shows_firing_incidents_doors_groups_and_the_theft(page: Any) -> None:
    # (A new server's first run reads the rule set in the background; the next refresh
    # shows what the rules watch.)
    visit(page, "", "Firing now", "Recently resolved", "Alerts over time", "avg_speed < 15")
    # Four incidents, not the forty reports behind them, on the first screen.
    firing = grid_rows(page, "Firing now")
    by_key = {row[2]: row for row in firing}
    assert len(firing) == 4 and set(by_key) == {"station=3", "station=7", "station=5", "door=4"}
    for key in ("station=3", "station=7"):
        severity, rule, _, latest, trend, condition = by_key[key][:6]
        assert (severity, rule, condition) == ("warning", "congestion", "avg_speed < 15")
        line = [float(v) for v in trend.split(",")]
        assert len(line) >= 30  # the last hour, a point a minute
        assert float(latest) < 15 < line[0]  # slow now, fast an hour ago
    screen = page.viewport_size["height"]
    assert page.get_by_role("heading", name="Firing now").bounding_box()["y"] < screen / 2
    reports = page.get_by_role("heading", name="Alerts", exact=True, level=3).bounding_box()
    assert reports["y"] > screen  # every report is below the first screen

    visit(page, "rfid", "doors with recent reads", "Packing groups")
    assert page.get_by_test_id("stMetricValue").first.inner_text() == "4 of 4"
    assert [row[0] for row in grid_rows(page, "Doors")] == ["1", "2", "3", "4"]
    groups = grid_rows(page, "Packing groups")
    assert groups and all(int(row[3]) >= 3 for row in groups)  # items per group
    theft = page.get_by_role("link", name=re.compile("^Theft incident at door=4"))
    theft.click()  # to the incident on the Alerts page
    page.get_by_text("Linked incident").wait_for()
    assert grid_rows(page, "Linked incident")[0][1:3] == ["larceny", "door=4"]


def test_a_notification_link_opens_its_incident(page: Any, lakehouse: Path) -> None:
    incidents = DeltaTable(str(lakehouse / "incidents")).to_pyarrow_table().to_pylist()
    (congestion,) = [r for r in incidents if r["key"] == "station=7" and r["resolved_at"]]
    port = int(page.base_url.rsplit(":", 1)[1])
    dashboard = Config(dashboard=DashboardConfig(address="127.0.0.1", port=port))
    link = to_alert(congestion, datetime.now(UTC), dashboard)["generatorURL"]
    assert link.startswith(f"{page.base_url}/?")
    visit(page, link.removeprefix(f"{page.base_url}/"), "Linked incident", "Firing now")
    (row,) = grid_rows(page, "Linked incident")
    assert row[1:3] == ["congestion", "station=7"]
    assert "Resolved: opened from its notification's link" in page.content()
    # The select box takes the linked incident in the page's rerun: waited for, not read once.
    expect(page.get_by_role("combobox", name="Incident")).to_have_value(
        re.compile(r"^resolved · warning · congestion · station=7")
    )
    # Acknowledged from there, it is that incident that is acknowledged.
    page.get_by_label("Note on the incident").fill("was roadworks")
    page.get_by_role("button", name="Acknowledge incident").click()
    page.get_by_text("Acknowledged congestion at station=7.").wait_for()
    (ack,) = DeltaTable(str(lakehouse / "incident_acks")).to_pyarrow_table().to_pylist()
    assert (ack["incident_id"], ack["note"]) == (congestion["incident_id"], "was roadworks")


# ---- what was typed survives the live panels' refreshes ----------------------------------


def shown(page: Any, test_id: str, containing: str = "") -> str:
    """The text of the first element with this Streamlit test id (and text)."""
    return page.get_by_test_id(test_id).filter(has_text=containing).first.inner_text()


def refreshed_twice(page: Any, test_id: str, containing: str, write: Any) -> None:
    """Write new data twice and wait each time until a live panel shows it: two
    refreshes (of at least one period each) that redrew the panel with new content."""
    for round_no in (1, 2):
        before = shown(page, test_id, containing)
        write(round_no)
        deadline = time.monotonic() + TIMEOUT_MS / 1000
        while shown(page, test_id, containing) == before:
            assert time.monotonic() < deadline, f"{containing!r} never refreshed"
            time.sleep(0.2)
    time.sleep(2 * REFRESH_S)  # and two more periods with no new data


def test_typed_text_and_choices_survive_refreshes(page: Any, lakehouse: Path) -> None:
    def new_alert(round_no: int) -> None:
        rows = alerts_table(int(time.time() * 1000), 1, seed=100 + round_no)
        ids = pa.array([f"new-{round_no}"])
        write_deltalake(
            str(lakehouse / "alerts"), rows.set_column(0, "alert_id", ids), mode="append"
        )

    # Alerts: a chosen alert and a note in the (refreshing) acknowledgement form, and
    # a key filter typed but not sent (the cursor stays in it).
    visit(page, "", "Acknowledge alerts", "Alerts over time")
    choose(page, "Open alerts", "station=7")
    page.keyboard.press("Escape")
    page.get_by_label("Note", exact=True).fill("crew on the way")
    key_filter = page.get_by_label("Key contains")
    key_filter.click()
    key_filter.press_sequentially("station=", delay=50)
    refreshed_twice(page, "stMetricValue", "", new_alert)
    assert shown(page, "stMetricValue") == "42"  # 40 + 2: the filter was never sent
    assert key_filter.input_value() == "station="
    assert page.get_by_label("Note", exact=True).input_value() == "crew on the way"
    chosen = page.get_by_test_id("stMultiSelect").filter(has_text="Open alerts")
    assert "station=7" in chosen.inner_text()

    # Traffic: the station chosen for the detail stays chosen.
    def new_readings(round_no: int) -> None:
        end = int(time.time() * 1000) + round_no * 3_600_000  # a newer stream clock
        rows = traffic_readings(end, 50, seed=round_no)
        write_deltalake(str(lakehouse / "readings_traffic"), rows, mode="append")

    visit(page, "traffic", "Station detail")
    choose(page, "Station", "3")
    refreshed_twice(page, "stCaptionContainer", "Stream clock", new_readings)
    assert page.get_by_role("combobox", name="Station").input_value() == "3"

    # RFID: a tag id typed but not sent.
    def new_reads(round_no: int) -> None:
        reads, _ = rfid_readings(int(time.time() * 1000) + round_no * 60_000)
        write_deltalake(str(lakehouse / "readings_tag_readings"), reads, mode="append")

    visit(page, "rfid", "Item path")
    tag = page.get_by_label("Tag id")
    tag.click()
    tag.press_sequentially("item-01", delay=50)
    refreshed_twice(page, "stCaptionContainer", "Stream clock", new_reads)
    assert tag.input_value() == "item-01"


PREVIEWED = """CREATE ALERT hushed SEVERITY warning RESOLVE WHEN TRUE
  AS SELECT station,
            silence(ts) OVER (PARTITION BY station RANGE 5 MINUTES PRECEDING ACTIVE EXPIRATION)
              AS last_reading
     FROM traffic;
"""


def test_preview_shows_a_rules_alerts_over_the_last_hour_as_the_command_prints(
    page: Any, lakehouse: Path, rules_folder: Path, rule_store: Path, tmp_path: Path
) -> None:
    from lookout.preview import preview
    from lookout.preview_cli import report

    file = tmp_path / "hushed.sql"
    file.write_text(PREVIEWED)
    printed = report(preview([rules_folder], file, PREVIEWED, str(lakehouse), 3_600_000), 10)
    assert "  station=5        1          1       1" in printed, printed
    history = re.match(r"history (\S+) \.\. (\S+) ", printed)
    assert history is not None, printed
    start, end = history.groups()

    visit(page, "rules", "Write or edit a rule file")
    page.get_by_placeholder("e.g. my_rules").fill("hushed")
    page.get_by_placeholder("e.g. my_rules").press("Enter")
    editor = page.get_by_placeholder("CREATE ALERT ... AS SELECT")
    editor.fill(PREVIEWED)
    editor.press("Control+Enter")
    page.get_by_role("button", name="Preview").click()  # over the last hour by default
    page.get_by_text(f"Preview from {start} to {end} (the stored watermark)").wait_for()
    # The summary (drawn on a canvas; its cells are attached for screen readers) and the
    # chart of alerts per minute: station 5, one alert, one incident still firing.
    page.get_by_text("station=5", exact=True).first.wait_for(state="attached")
    assert page.locator("canvas").count() >= 1
    assert not (rule_store / "hushed.sql").exists(), "a preview saves nothing"
