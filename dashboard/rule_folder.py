"""The rule folder as the pages see it: read once per change of its files, and the
alerts that the Traffic and RFID pages are configured to build on, checked against it."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard.data import rules_dir
from dashboard.rulebook import Book, read_book


@st.cache_data(show_spinner=False, max_entries=16)
def _book(folder: str, stamps: tuple[tuple[str, int, int], ...]) -> Book:
    # `stamps` (name, mtime, size of each file) is the cache key: an edit means a re-read.
    return read_book(Path(folder))


def book_of(folder: Path) -> Book:
    """The rule folder parsed, checked and explained (cached until a file changes)."""
    files = sorted(folder.glob("*.sql")) if folder.is_dir() else []
    stamps = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    return _book(str(folder), stamps)


def configured_alert_problem(setting: str, name: str, column: str) -> str | None:
    """What to tell the operator when the alert named by the `[dashboard]` setting
    `setting` is not an alert keyed by `column` in the rule folder (None when it is)."""
    book = book_of(rules_dir())
    problem = book.alert_problem(name, column)
    if problem is None:
        return None
    choices = book.alerts_keyed_by(column)
    to = (
        f"one of the alerts keyed by {column}: {', '.join(f'`{c}`' for c in choices)}"
        if choices
        else f"an alert keyed by {column} (write one on the Rules page)"
    )
    return (
        f'{problem[0].upper()}{problem[1:]} (`{setting} = "{name}"`). Set `{setting}` under '
        f"`[dashboard]` in lookout.toml, or `LOOKOUT_DASHBOARD_{setting.upper()}`, to {to}."
    )
