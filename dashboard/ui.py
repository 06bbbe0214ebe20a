"""Page helpers: panels that show a plain error instead of a stack trace, empty states,
durations in words."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import ParamSpec

import streamlit as st

from dashboard.data import DataError

log = logging.getLogger("lookout.dashboard")
P = ParamSpec("P")

START_HINT = (
    "Start everything with `lookout demo`, or run `lookout ingest` and `lookout engine` "
    "and feed them with `lookout simulate traffic` / `lookout simulate rfid`."
)


def panel(fn: Callable[P, None]) -> Callable[P, None]:
    """Run a page section; on failure show one plain sentence (the trace goes to the log)."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except DataError as exc:
            log.warning("%s: %s", fn.__name__, exc)
            st.error(f"{exc}. The page retries on its next refresh.")
        except Exception:
            # Streamlit's own rerun/stop signals are BaseExceptions and pass through.
            log.exception("dashboard panel %s failed", fn.__name__)
            st.error("This panel failed to load; the details are in the dashboard's log.")

    return run


def empty(what: str, how: str = START_HINT) -> None:
    """An empty state: what is missing and what to do about it."""
    st.info(f"{what} {how}")


def duration_text(seconds: float) -> str:
    """A duration in whole minutes or hours (`< 1 min`, `12 min`, `3 h`): the text then
    stays the same across most refreshes (nothing changes size under the cursor)."""
    minutes = max(0.0, seconds) / 60  # a time stamped by a clock a little ahead: 0
    if minutes < 1:
        return "< 1 min"
    if minutes < 120:
        return f"{minutes:.0f} min"
    return f"{minutes / 60:.0f} h"
