"""The rule set as the pages see it (the library and the user rule store): read once per
change of its files, and the alerts that the Traffic and RFID pages are configured to
build on, checked against it.

Reading a rule set (parse, check, compile, explain) costs about 0.4 s the first time a
dashboard process does it. Pages that cannot do without it wait for it (`book_of`); the
Alerts page only asks whether it is there yet (`book_if_read`), and starts reading it in
the background otherwise, so the first page a new server draws is not held up by it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from dashboard.rulebook import Book, read_book
from dashboard.settings import rule_store
from rules.language.access import RulePolicy
from rules.language.loader import rule_files
from rules.store import RuleStore

KEPT = 16  # rule sets (one per change of the files) kept in memory

# (paths, policy, (path, mtime, size) of each file) -> the rule set as read then. The
# file stamps are part of the key: an edit means a new read.
Key = tuple[tuple[str, ...], RulePolicy, tuple[tuple[str, int, int], ...]]
_books: OrderedDict[Key, Future[Book]] = OrderedDict()
_lock = threading.Lock()
_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lookout-rule-book")


def _read(store: RuleStore) -> Future[Book]:
    """The read of the store's rule set as its files are now: done, under way, or
    started now (one at a time per rule set, however many sessions ask)."""
    paths = store.rule_paths()
    files = rule_files(p for p in paths if p.exists())
    stamps = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    key: Key = (tuple(map(str, paths)), store.policy, stamps)
    with _lock:
        future = _books.get(key)
        if future is None:
            future = _reader.submit(read_book, [Path(p) for p in key[0]], store.policy)
            _books[key] = future
            while len(_books) > KEPT:
                _books.popitem(last=False)
        _books.move_to_end(key)
        return future


def book_of(store: RuleStore) -> Book:
    """The store's rule set parsed, checked and explained (read once per change of its
    files; waits for the read)."""
    return _read(store).result()


def book_if_read(store: RuleStore) -> Book | None:
    """The store's rule set if it has been read as its files are now; None while it is
    being read (the read is started if it was not)."""
    future = _read(store)
    return future.result() if future.done() else None


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
