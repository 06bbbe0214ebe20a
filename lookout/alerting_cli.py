"""`lookout notify`, `lookout alertmanager` and `lookout silence`: incidents routed through
Alertmanager (docs/runtime.md, "Notifications")."""

from __future__ import annotations

import argparse
import getpass
import re
import signal
import sys
import threading
from datetime import timedelta
from typing import Any

from lookout.config import load_config

_DURATION = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str) -> timedelta:
    """`90s`, `30m`, `2h30m`, `1d` as a timedelta (argparse type)."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"{text!r}: expected e.g. 30m, 2h, 1d12h")
    return sum((timedelta(**{_UNITS[u]: int(n)}) for n, u in parts), timedelta())


def parse_matcher(text: str) -> tuple[str, str]:
    """`label=value` (argparse type)."""
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise argparse.ArgumentTypeError(f"{text!r}: expected label=value, e.g. station=3")
    return name, value


def _wait_for_signal(alive: Any) -> None:
    """Block until SIGTERM or Ctrl-C, or until `alive()` turns false."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        while not stopping.is_set() and alive():
            stopping.wait(0.5)
    except KeyboardInterrupt:
        pass


def _notify(args: argparse.Namespace) -> int:
    from lookout.notify import Notifier

    config = load_config(args.config)
    if not config.alertmanager.enabled:
        print("lookout notify: [alertmanager] enabled = false", file=sys.stderr)
        return 1
    stop = threading.Event()
    thread = threading.Thread(target=Notifier(config).run, args=(stop,), daemon=True)
    thread.start()
    print(f"posting incidents to {config.alertmanager.url}; Ctrl-C stops", flush=True)
    _wait_for_signal(thread.is_alive)
    stop.set()
    thread.join(timeout=30)
    return 0


def _alertmanager(args: argparse.Namespace) -> int:
    from lookout.alertmanager import WebhookLog
    from lookout.demo import STATE, local_alertmanager

    config = load_config(args.config)
    log_path = (STATE / "logs" / "notifications.jsonl").resolve()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    webhook = WebhookLog(log_path=log_path).start()
    manager = local_alertmanager(config, webhook.url).start()
    print(f"Alertmanager on {manager.url}, state in {manager.state_dir}; its webhook "
          f"notifications go to {log_path}; Ctrl-C stops it", flush=True)  # fmt: skip
    assert manager.process is not None
    process = manager.process
    _wait_for_signal(lambda: process.poll() is None)
    manager.stop()
    webhook.stop()
    return 0


def _silence(args: argparse.Namespace) -> int:
    from lookout.alertmanager import (
        AlertmanagerError,
        create_silence,
        expire_silence,
        list_silences,
    )

    url = args.url or load_config(args.config).alertmanager.url
    try:
        if args.action == "add":
            silence = create_silence(
                url,
                dict(args.matchers),
                args.duration,
                args.author or getpass.getuser(),
                args.comment,
            )
            print(f"silence {silence}")
        elif args.action == "expire":
            expire_silence(url, args.id)
            print(f"expired {args.id}")
        else:
            for s in list_silences(url):
                if s["status"]["state"] == "expired" and not args.all:
                    continue
                matchers = ", ".join(f"{m['name']}={m['value']}" for m in s["matchers"])
                print(f"{s['id']}  {s['status']['state']:8}  until {s['endsAt']}  {matchers}  "
                      f"by {s['createdBy']}: {s['comment']}")  # fmt: skip
    except AlertmanagerError as err:
        print(f"lookout silence: {err}", file=sys.stderr)
        return 1
    return 0


def register(commands: Any) -> None:
    """Add the sub-commands to the `lookout` parser's `commands`."""
    notify = commands.add_parser("notify", help="post the incidents to Alertmanager")
    notify.set_defaults(func=_notify)

    manager = commands.add_parser(
        "alertmanager", help="run Alertmanager (shipped configuration) on [alertmanager] url"
    )
    manager.set_defaults(func=_alertmanager)

    silence = commands.add_parser("silence", help="silence alerts in Alertmanager")
    actions = silence.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="silence the alerts whose labels match")
    add.add_argument("matchers", nargs="+", type=parse_matcher, metavar="LABEL=VALUE")
    add.add_argument("--duration", type=parse_duration, default=timedelta(hours=2))
    add.add_argument("--comment", required=True, help="why (Alertmanager requires one)")
    add.add_argument("--author", default="", help="default: your user name")
    listing = actions.add_parser("list", help="the active and pending silences")
    listing.add_argument("--all", action="store_true", help="expired ones too")
    expire = actions.add_parser("expire", help="end a silence now")
    expire.add_argument("id", metavar="ID")
    for action in (add, listing, expire):
        action.add_argument("--url", help="Alertmanager (default: [alertmanager] url)")
    silence.set_defaults(func=_silence)
