"""The rule set as the pages see it (the library and the user rule store): read once per
change of its files, and the alerts that the Traffic and RFID pages are configured to
build on, checked against it."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard.rule_store import RuleStore
from dashboard.rulebook import Book, read_book
from dashboard.settings import rule_store
from rules.language.access import RulePolicy
from rules.language.loader import rule_files


@st.cache_data(show_spinner=False, max_entries=16)
def _book(
    paths: tuple[str, ...], policy: RulePolicy, stamps: tuple[tuple[str, int, int], ...]
) -> Book:
    # `stamps` (path, mtime, size of each file) is the cache key: an edit means a re-read.
    return read_book([Path(p) for p in paths], policy)


def book_of(store: RuleStore) -> Book:
    """The store's rule set parsed, checked and explained (cached until a file changes)."""
    paths = store.rule_paths()
    files = rule_files(p for p in paths if p.exists())
    stamps = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    return _book(tuple(map(str, paths)), store.policy, stamps)


def configured_alert_problem(setting: str, name: str, column: str) -> str | None:
    """What to tell the operator when the alert named by the `[dashboard]` setting
    `setting` is not an alert keyed by `column` in the rule set (None when it is)."""
    book = book_of(rule_store())
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
