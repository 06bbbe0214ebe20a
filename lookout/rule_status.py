"""`lookout rules status` and `lookout rules deploy`: which version of each rule file
the running engine runs, and putting rule files into the rule store for it to run.

The engine says on its health record which rule files it runs, each with its version
(the start of the SHA-256 of its text), and the last change of the files it refused
(`lookout.rule_watch`). `status` sets that beside the files as they are now: each one
is *running*, *pending* (saved, not yet picked up: the engine looks every
`[engine] rules_poll_seconds`), *refused* (the engine's errors follow) or *removed*
(running, no longer in the files). `deploy` saves files into the rule store like the
dashboard's Rules editor (checked with the whole rule set, atomic, logged with the user
who did it) and waits until the engine runs them.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lookout.config import Config, load_config
from lookout.health import engine_running, read_health
from lookout.rule_watch import version
from rules.language.loader import rule_files

RUNNING, PENDING, REFUSED, REMOVED = "running", "pending", "refused", "removed"
STALE_MS = 30_000
"""An engine record older than this is of an engine no longer running."""


@dataclass(frozen=True)
class FileStatus:
    """One rule file: its version on disk and the one the engine runs (None: none)."""

    file: str
    on_disk: str | None
    running: str | None
    state: str


def file_statuses(config: Config, record: dict[str, Any] | None) -> list[FileStatus]:
    """Each rule file of the configured library and rule store, and each the engine runs,
    with its state (see the module docstring)."""
    rules = (record or {}).get("rules") or {}
    running = {str(Path(f).resolve()): v for f, v in (rules.get("files") or {}).items()}
    refused = rules.get("rejected") is not None
    found = []
    for file in rule_files(config.rule_paths):
        key = str(file.resolve())
        now = version(file.read_text(encoding="utf-8", errors="replace"))
        was = running.pop(key, None)
        state = RUNNING if was == now else REFUSED if refused else PENDING
        found.append(FileStatus(str(file), now, was, state))
    gone = REFUSED if refused else REMOVED
    found += [FileStatus(file, None, was, gone) for file, was in running.items()]
    return found


def status(config: Config) -> tuple[list[FileStatus], dict[str, Any] | None, bool]:
    """The rule files' states, the engine's health record and whether it runs."""
    record = read_health(config.lakehouse, "engine", config.s3)
    fresh = record is not None and time.time() * 1000 - record.get("updated_at_ms", 0) < STALE_MS
    up = record is not None and fresh and engine_running(record, 0)
    return file_statuses(config, record if up else None), record, up


def print_status(config: Config) -> int:
    """Print the rule files' states; 1 if a change was refused or the engine is down."""
    files, record, up = status(config)
    width = max((len(f.file) for f in files), default=4)
    print(f"{'FILE':<{width}}  {'ON DISK':<12}  {'RUNNING':<12}  STATE")
    for f in files:
        state = f.state if up else "engine not running"
        print(f"{f.file:<{width}}  {f.on_disk or '-':<12}  {f.running or '-':<12}  {state}")
    rejected = ((record or {}).get("rules") or {}).get("rejected") if up else None
    if rejected:
        print("\nthe engine refused the latest change of the rule files; it runs the last good:")
        for error in rejected["errors"]:
            print(f"  {error}")
    if not up:
        print("\nno running engine on this lakehouse (start it with `lookout engine`)")
    return 0 if up and not rejected else 1


def deploy(config: Config, files: list[Path], wait_s: float) -> int:
    """Save `files` into the rule store and wait (at most `wait_s`) until the engine runs
    them; 1 on a rule error, 2 when the engine did not take them in time."""
    from rules.store import RuleNameError, RuleStore  # the store's own writer

    library = tuple(Path(path) for path in config.rules.paths)
    store = RuleStore(Path(config.rules.user_path), library, config.rule_policy)
    user = getpass.getuser()
    for file in files:
        try:
            errors = store.save(file.stem, file.read_text(encoding="utf-8"), user)
        except (OSError, RuleNameError) as err:
            print(f"lookout rules deploy: {file}: {err}", file=sys.stderr)
            return 1
        if errors:
            for error in errors:
                print(error.format(), file=sys.stderr)
            print(f"lookout rules deploy: {file} not saved", file=sys.stderr)
            return 1
        print(f"saved {file} into the rule store as {store.path(file.stem)}")
    if wait_s <= 0:
        return 0
    wanted = {str(store.path(f.stem).resolve()) for f in files}
    deadline = time.monotonic() + wait_s
    while True:
        found, _, up = status(config)
        states = {str(Path(f.file).resolve()): f.state for f in found}
        if up and all(states.get(w) == RUNNING for w in wanted):
            print("the engine runs them")
            return print_status(config)
        if (up and any(states.get(w) == REFUSED for w in wanted)) or time.monotonic() > deadline:
            print_status(config)
            return 2
        time.sleep(0.5)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `status` and `deploy` to the `rules` command's subparsers."""
    stat = sub.add_parser("status", help="which version of each rule file the engine runs")
    stat.set_defaults(func=lambda a: print_status(load_config(getattr(a, "config", None))))
    dep = sub.add_parser(
        "deploy",
        help="save rule files into the rule store and wait until the engine runs them",
    )
    dep.add_argument("files", metavar="FILE", nargs="+", type=Path)
    dep.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for the engine (0: no wait)"
    )
    dep.set_defaults(
        func=lambda a: deploy(load_config(getattr(a, "config", None)), a.files, a.wait)
    )
