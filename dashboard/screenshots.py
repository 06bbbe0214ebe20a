"""Screenshots of every page over the sample lakehouse, for the docs.

    .venv/bin/python -m dashboard.screenshots docs/screenshots

Writes `<page>.png` for each page: the sample of `dashboard.sample` (with one alert
and the theft incident acknowledged, and station 7's congestion silenced in an
Alertmanager of its own when Debian's `prometheus-alertmanager` is installed), station 3
opened on the Traffic page, item-0110's path on the RFID page, the congestion rule shown
on the Rules page, and `rules-editor.png`: a rule with an error checked in the editor.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from dashboard.sample import write_health, write_sample
from dashboard.testing import PAGES, chromium, copy_rules, free_port, served
from lookout.alertmanager import BINARY, Alertmanager, create_silence

BAD_RULE = (
    "CREATE ALERT very_slow SEVERITY critical\n"
    "  MESSAGE 'station {station}: {speed} m/s'\n"
    "  AS SELECT station, ts, speed FROM traffic WHERE speed < 2 AND lane = 'left';\n"
)


def _prepare(name: str, tab: Any) -> None:
    """Put each page in the state worth showing."""
    if name == "alerts":
        # A new server reads the rule set behind the first page; the next refresh shows
        # what the rules watch.
        tab.get_by_text("avg_speed < 15").first.wait_for(state="attached", timeout=90_000)
    elif name == "traffic":
        tab.get_by_role("combobox", name="Station").click()
        tab.get_by_role("option", name="3", exact=True).click()
    elif name == "rfid":
        tab.get_by_label("Tag id").fill("item-0110")
        tab.get_by_label("Tag id").press("Enter")
        tab.get_by_text("door 1 → 2").first.wait_for()
    elif name == "rules":
        # Typing filters the options: the list draws only those in view.
        tab.get_by_role("combobox", name="Show rule").fill("congestion")
        tab.get_by_role("option", name="congestion", exact=True).click()
        tab.get_by_text("alert congestion").first.wait_for()


def _drawn(tab: Any, timeout: float = 60) -> None:
    """Wait until no element is still a placeholder (on a busy machine a page's tables
    and charts are drawn seconds after its title)."""
    deadline = time.monotonic() + timeout
    while tab.get_by_test_id("stSkeleton").count() and time.monotonic() < deadline:
        time.sleep(0.2)


def _check_bad_rule(tab: Any) -> None:
    """Type a rule with a type error into the editor, check it and scroll to the errors."""
    tab.get_by_placeholder("e.g. my_rules").fill("very_slow")
    tab.get_by_placeholder("e.g. my_rules").press("Enter")
    editor = tab.get_by_placeholder("CREATE ALERT ... AS SELECT")
    editor.fill(BAD_RULE)
    editor.press("Control+Enter")
    tab.get_by_role("button", name="Check").click()
    tab.get_by_text("fix them before saving").wait_for()
    tab.locator('[data-testid="stCode"]').last.scroll_into_view_if_needed()
    time.sleep(1)


@contextmanager
def silenced_station_7(work: Path) -> Iterator[None]:
    """An Alertmanager of its own (when installed) holding a silence of station 7's
    congestion, as the dashboard's `[alertmanager] url`."""
    if shutil.which(BINARY) is None and shutil.which("alertmanager") is None:
        print(f"no {BINARY}: the Alerts page says the silences are unknown")
        yield
        return
    # Nothing is posted to it, so its receiver is never called.
    manager = Alertmanager("127.0.0.1", free_port(), work / "alertmanager", "http://127.0.0.1:9/")
    manager.start()
    try:
        labels = {"alertname": "congestion", "severity": "warning", "station": "7"}
        create_silence(manager.url, labels, timedelta(hours=2), "operator", "lane closed")
        os.environ["LOOKOUT_ALERTMANAGER_URL"] = manager.url
        yield
    finally:
        manager.stop()


def capture(out: Path) -> None:
    """Serve the sample and screenshot each page into `out`."""
    work = Path(tempfile.mkdtemp(prefix="lookout-shots-"))
    try:
        root, rules = work / "lakehouse", copy_rules(work / "rules")
        write_sample(root)
        os.environ["LOOKOUT_LAKEHOUSE_PATH"] = str(root)
        from dashboard.data import acknowledge, acknowledge_incident, query

        stopped = query("SELECT alert_id FROM alerts WHERE rule = 'stopped_vehicle'", "alerts")
        assert stopped is not None
        acknowledge(list(stopped["alert_id"]), "tow truck called", "operator")
        theft = query("SELECT incident_id FROM incidents WHERE rule = 'larceny'", "incidents")
        assert theft is not None
        acknowledge_incident(theft.at[0, "incident_id"], "security at door 4", "operator")
        out.mkdir(parents=True, exist_ok=True)
        with (
            silenced_station_7(work),
            served(root, rules, refresh_seconds=30) as url,
            chromium() as browser,
        ):
            tab = browser.new_page(viewport={"width": 1400, "height": 1700})
            tab.set_default_timeout(30_000)
            for name, path in PAGES.items():
                write_health(root, int(time.time() * 1000))  # the parts show as up
                tab.goto(f"{url}/{path}")
                tab.get_by_role("heading", level=1).first.wait_for()
                time.sleep(2)  # let the first rerun after a page switch settle
                _prepare(name, tab)
                _drawn(tab)
                time.sleep(2)  # charts animate in
                tab.screenshot(path=str(out / f"{name}.png"))
                print(f"wrote {out / f'{name}.png'}")
                if name == "rules":  # the editor's inline errors get a picture of their own
                    _check_bad_rule(tab)
                    tab.screenshot(path=str(out / "rules-editor.png"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    """Command line: the output folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    capture(parser.parse_args().out)


if __name__ == "__main__":
    main()
