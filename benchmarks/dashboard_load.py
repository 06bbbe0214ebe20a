"""Dashboard load benchmark: first paint and refresh with 1M readings and 100k alerts.

    .venv/bin/python benchmarks/dashboard_load.py [--readings N] [--alerts N] [--rounds N]

Builds a lakehouse with delta-rs (no Spark): `readings_traffic` with N readings in 100
appends (as a streaming writer leaves it: 100 commits, 100 files), `alerts` with N
alerts in 10 appends, plus the small RFID, quarantine and health tables of
`dashboard.sample`. Then:

1. First paint, in Debian's headless Chromium: from navigation until the page's title
   is drawn (first paint) and until its main content is (every query done), per page,
   on a freshly started server and browser (cold: nothing imported, nothing cached) and
   on a second visit (warm).
2. Refresh, server side (Streamlit's AppTest running the page script): a rerun with no
   new commit (served from the version-keyed cache) and a rerun after a new commit to
   `readings_traffic` and `alerts` (every query over them runs again).

Targets (issue 7): first paint <= 3 s, refresh <= 1 s. Figures go in docs/dashboard.md.
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
    rfid_readings,
    side_tables,
    station_speed,
    traffic_readings,
    write_health,
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


def first_paint(root: Path, rules: Path, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """Per page, (title, content) seconds: cold (a freshly started server and browser,
    the page visited first) then warm (visited again), `rounds` times each."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in PAGES}
    warm: dict[str, list[tuple[float, float]]] = {name: [] for name in PAGES}
    for name in PAGES:
        for _ in range(rounds):
            with served(root, rules) as url, chromium() as browser:
                tab = browser.new_page(viewport={"width": 1400, "height": 1000})
                tab.set_default_timeout(60_000)
                times[name].append(_visit(tab, url, name))
                warm[name].append(_visit(tab, url, name))
    return {f"{name} (cold)": times[name] for name in PAGES} | {
        f"{name} (warm)": warm[name] for name in PAGES
    }


def refresh(root: Path, page: str, rounds: int, end_ms: int) -> tuple[float, float]:
    """Median seconds of a page rerun without, and after, a new commit."""
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
        write_deltalake(
            str(root / "readings_traffic"), traffic_readings(new_end, 1000, seed=i), mode="append"
        )
        write_deltalake(str(root / "alerts"), alerts_table(new_end, 10, seed=i), mode="append")
        time.sleep(VERSION_TTL_S + 0.1)
        start = time.perf_counter()
        app.run()
        fresh.append(time.perf_counter() - start)
        assert not app.exception, app.exception
    return statistics.median(cached), statistics.median(fresh)


def main() -> None:
    """Build the lakehouse, measure, print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readings", type=int, default=1_000_000)
    parser.add_argument("--alerts", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
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
        os.environ["LOOKOUT_RULES_DIR"] = str(rules)
        print("\nin Chromium, median (s)       title  content")
        for name, runs in first_paint(root, rules, args.rounds).items():
            title = statistics.median(r[0] for r in runs)
            content = statistics.median(r[1] for r in runs)
            print(f"  {name:<28}{title:6.2f}  {content:7.2f}")
        print("\nrefresh, page rerun (s)        no commit  new commit   (median)")
        for page in ("alerts", "traffic", "rfid", "health"):
            cached, fresh = refresh(root, page, args.rounds, end_ms)
            print(f"  {page:<28}{cached:9.3f}  {fresh:10.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
