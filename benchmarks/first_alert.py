"""Time from `git clone` to the first congestion alert on the dashboard screen.

    python benchmarks/first_alert.py [--cold] [--repo PATH]

Clones the repository into a temporary folder, runs its `./run demo` (on free ports, so a
running demo is not disturbed) and watches the Alerts page in headless Chromium until a
congestion alert is on screen. A fresh clone always builds a fresh virtualenv; `--cold`
also bypasses pip's cache and hides Spark's Ivy cache (so the wheels and the Delta jars
are downloaded again). Debian packages already installed are not removed.
Prints the elapsed seconds per phase.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from dashboard.testing import CHROMIUM, CHROMIUM_ARGS
from lookout.broker import free_port

IVY = Path.home() / ".ivy2.5.2"


PASSWORD = "first-alert benchmark"  # the demo's operator signs in with it


def alert_on_screen(url: str, deadline: float) -> float:
    """Sign in and poll the Alerts page until a congestion alert shows; returns when it
    did."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        while time.monotonic() < deadline:
            try:
                page.goto(url, timeout=10_000)
                page.get_by_label("User").fill("operator", timeout=10_000)
                page.get_by_label("Password", exact=True).fill(PASSWORD)
                page.get_by_role("button", name="Sign in").click()
                page.get_by_text("congestion").first.wait_for(timeout=15_000)
                return time.monotonic()
            except Exception:  # not up yet, or no alert yet: look again
                time.sleep(2)
        raise TimeoutError("no congestion alert on screen")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lookout-clone-"))
    hidden = IVY.with_name(".ivy2.5.2.hidden-by-benchmark")
    if args.cold and IVY.exists():
        IVY.rename(hidden)
    port = free_port()
    env = {
        **os.environ,
        "LOOKOUT_DASHBOARD_PORT": str(port),
        "LOOKOUT_MQTT_PORT": str(free_port()),
        "LOOKOUT_DASHBOARD_PASSWORD": PASSWORD,
    }
    env.pop("VIRTUAL_ENV", None)
    if args.cold:
        env["PIP_NO_CACHE_DIR"] = "1"  # every wheel downloaded again
    demo = None
    try:
        start = time.monotonic()
        subprocess.run(["git", "clone", "-q", args.repo, str(work / "lookout")], check=True)
        cloned = time.monotonic()
        demo = subprocess.Popen(
            ["./run", "demo"],
            cwd=work / "lookout",
            env=env,
            start_new_session=True,
            stdout=open(work / "demo.log", "wb"),  # noqa: SIM115 - the demo keeps it
            stderr=subprocess.STDOUT,
        )
        seen = alert_on_screen(f"http://127.0.0.1:{port}/", start + args.timeout)
        print(
            f"{'cold' if args.cold else 'warm'}: clone {cloned - start:.0f} s, "
            f"clone -> first alert on screen {seen - start:.0f} s"
        )
    finally:
        if demo is not None:
            os.killpg(demo.pid, signal.SIGINT)
            demo.wait(timeout=120)
        if hidden.exists():
            if IVY.exists():
                shutil.rmtree(IVY)
            hidden.rename(IVY)
        print(f"demo log: {work / 'demo.log'}")


if __name__ == "__main__":
    main()
