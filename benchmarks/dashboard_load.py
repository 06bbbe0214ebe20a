"""Dashboard load benchmark: first paint and refresh with 1M readings and 100k alerts.

    .venv/bin/python benchmarks/dashboard_load.py [--readings N] [--alerts N] [--rounds N]

Builds a lakehouse with delta-rs (no Spark): `readings_traffic` with N readings in 100
appends (as a streaming writer leaves it: 100 commits, 100 files), `alerts` with N
alerts in 10 appends, plus the small `station_speed`, incidents, RFID, quarantine and
health tables of `dashboard.sample`. Then:

1. First paint, in Debian's headless Chromium: from navigation until the page's title
   is drawn (first paint) and until its last section is (every query done), per page.
   Cold: a freshly started `streamlit run` process (the command `lookout dashboard`
   runs: nothing of the app imported, every cache empty) and a fresh browser (empty
   HTTP cache), the page being the first one visited (a deep link such as /traffic).
   Warm: the same page visited again. Pages take turns round by round; each figure is
   median [min-max] over the rounds, with the 1-minute load average at the visits (the
   machine is shared). A one-line app (`st.title` only) served and visited the same
   way gives the floor: what Streamlit and Chromium cost here before any of ours.
2. Refresh, server side (Streamlit's AppTest running the page script): a rerun with no
   new commit (served from the version-keyed cache) and a rerun after a new commit to
   `readings_traffic`, `station_speed` and `alerts` (every query over them runs again).

Targets: first paint <= 3 s, refresh <= 1 s. Figures go in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake
from streamlit.testing.v1 import AppTest

from dashboard.data import VERSION_TTL_S
from dashboard.sample import (
    alerts_table,
    incident_rows,
    rfid_readings,
    side_tables,
    station_speed,
    traffic_readings,
    write_health,
    write_incidents,
)
from dashboard.testing import APP, PAGES, chromium, copy_rules, served

# What marks each page as drawn: text that appears only once its queries have run.
READY = {
    "alerts": "Alerts over time",
    "traffic": "Station detail",
    "rfid": "Item path",
    "rules": "Write or edit a rule file",
    "health": "Delta tables",
}


def build(root: Path, readings: int, alerts: int, end_ms: int) -> None:
    """The benchmark lakehouse (see the module docstring)."""
    traffic = traffic_readings(end_ms, readings)
    for batch in traffic.to_batches(max_chunksize=max(1, readings // 100)):
        write_deltalake(
            str(root / "readings_traffic"), pa.Table.from_batches([batch]), mode="append"
        )
    write_deltalake(str(root / "station_speed"), station_speed(traffic), mode="append")
    table = alerts_table(end_ms, alerts)
    for batch in table.to_batches(max_chunksize=max(1, alerts // 10)):
        write_deltalake(str(root / "alerts"), pa.Table.from_batches([batch]), mode="append")
    write_incidents(root, incident_rows(end_ms))
    tags, packing = rfid_readings(end_ms)
    write_deltalake(str(root / "readings_tag_readings"), tags, mode="append")
    write_deltalake(str(root / "packing_groups"), packing, mode="append")
    for name, side in side_tables(end_ms).items():
        write_deltalake(str(root / name), side, mode="append")
    write_health(root, end_ms)


def _visit(tab: Any, url: str, name: str) -> tuple[float, float]:
    """Seconds from navigation to the page's title, and to its main content."""
    start = time.perf_counter()
    tab.goto(f"{url}/{PAGES[name]}")
    tab.get_by_role("heading", level=1).first.wait_for()
    title = time.perf_counter() - start
    tab.get_by_text(READY[name]).first.wait_for(state="attached")
    return title, time.perf_counter() - start


Visit = tuple[float, float, float]  # title s, content s, 1-minute load average at the time


def first_paint(root: Path, rules: Path, rounds: int) -> dict[str, list[Visit]]:
    """Per page, (title, content, load) of each visit: cold (a freshly started server and
    browser, the page visited first) then warm (the same page visited again). The pages
    take turns round by round, so a burst of other work on the machine hits them alike."""
    cold: dict[str, list[Visit]] = {name: [] for name in PAGES}
    warm: dict[str, list[Visit]] = {name: [] for name in PAGES}
    for _ in range(rounds):
        for name in PAGES:
            with served(root, rules) as url, chromium() as browser:
                tab = browser.new_page(viewport={"width": 1400, "height": 1000})
                tab.set_default_timeout(60_000)
                cold[name].append((*_visit(tab, url, name), os.getloadavg()[0]))
                warm[name].append((*_visit(tab, url, name), os.getloadavg()[0]))
    return {f"{name} (cold)": cold[name] for name in PAGES} | {
        f"{name} (warm)": warm[name] for name in PAGES
    }


def floor(rounds: int, work: Path) -> list[Visit]:
    """The same cold visit to a one-line Streamlit app (`st.title`): what Streamlit,
    Chromium and this machine cost before any of the dashboard's own work."""
    script = work / "title_only.py"
    script.write_text('import streamlit as st\n\nst.title("Alerts")\n')
    visits: list[Visit] = []
    for _ in range(rounds):
        with served(work, work, script=script) as url, chromium() as browser:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            start = time.perf_counter()
            tab.goto(url)
            tab.get_by_role("heading", level=1).first.wait_for()
            took = time.perf_counter() - start
            visits.append((took, took, os.getloadavg()[0]))
    return visits


def spread(values: list[float], digits: int = 2) -> str:
    """`median [min-max]`."""
    return (
        f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-"
        f"{max(values):.{digits}f}]"
    )


def refresh(root: Path, page: str, rounds: int, end_ms: int) -> tuple[list[float], list[float]]:
    """Seconds of each page rerun without, and after, a new commit."""
    app = AppTest.from_file(str(APP), default_timeout=120).run()
    app.switch_page(f"views/{page}.py").run()
    cached, fresh = [], []
    assert app.title[0].value.lower() == page, app.title
    for i in range(rounds):
        # Wait out the version lookup's cache, as the refresh interval does live.
        time.sleep(VERSION_TTL_S + 0.1)
        start = time.perf_counter()
        app.run()
        cached.append(time.perf_counter() - start)
        new_end = end_ms + (i + 1) * 1000
        new = traffic_readings(new_end, 1000, seed=i)
        write_deltalake(str(root / "readings_traffic"), new, mode="append")
        write_deltalake(str(root / "station_speed"), station_speed(new), mode="append")
        write_deltalake(str(root / "alerts"), alerts_table(new_end, 10, seed=i), mode="append")
        time.sleep(VERSION_TTL_S + 0.1)
        write_health(root, int(time.time() * 1000))  # the parts are up, as when live
        start = time.perf_counter()
        app.run()
        fresh.append(time.perf_counter() - start)
        assert not app.exception and not app.error, (app.exception, app.error)
    return cached, fresh


def main() -> None:
    """Build the lakehouse, measure, print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readings", type=int, default=1_000_000)
    parser.add_argument("--alerts", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lookout-dashboard-bench-"))
    try:
        root, rules = work / "lakehouse", copy_rules(work / "rules")
        end_ms = int(time.time() * 1000)
        start = time.perf_counter()
        build(root, args.readings, args.alerts, end_ms)
        print(
            f"lakehouse: {args.readings:,} readings, {args.alerts:,} alerts "
            f"(built in {time.perf_counter() - start:.1f} s)"
        )
        print(f"machine: {os.cpu_count()} cores, {platform.python_version()}")
        os.environ["LOOKOUT_LAKEHOUSE_PATH"] = str(root)
        os.environ["LOOKOUT_RULES_PATHS"] = str(rules)
        os.environ["LOOKOUT_RULES_USER_PATH"] = str(work / "rules.d")
        os.environ["LOOKOUT_DASHBOARD_LOGIN"] = "false"  # the page reruns, not the sign-in
        print(f"\nin Chromium, {args.rounds} visits each: median [min-max] seconds")
        print(f"  {'':<16}{'title':<18}{'content':<18}load average")
        visits = first_paint(root, rules, args.rounds)
        visits["title-only app (cold)"] = floor(args.rounds, work)
        for name, runs in visits.items():
            title, content, load = (spread([r[i] for r in runs]) for i in range(3))
            print(f"  {name:<16}{title:<18}{content:<18}{load}")
        print("\nrefresh, page rerun: median [min-max] seconds")
        print(f"  {'':<16}{'no new commit':<22}after a commit")
        for page in ("alerts", "traffic", "rfid", "health"):
            cached, fresh = refresh(root, page, args.rounds, end_ms)
            print(f"  {page:<16}{spread(cached, 3):<22}{spread(fresh, 3)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
