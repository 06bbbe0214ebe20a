"""Whether an incident is silenced: Alertmanager's active silences whose matchers match
the labels the notifier posts the incident with (`lookout.notify.incident_labels`).

Best effort: the silences are read at most every `TTL_SECONDS` per dashboard process,
with a short timeout, and an Alertmanager that does not answer leaves the page as it
was with a sentence saying so; it never fails a page.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from dashboard.settings import alertmanager
from lookout.alertmanager import AlertmanagerError, list_silences, silencing
from lookout.notify import incident_labels

TTL_SECONDS = 5.0
TIMEOUT_SECONDS = 2.0
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Silences:
    """Alertmanager's silences as last read, or why they could not be."""

    url: str
    silences: tuple[dict[str, Any], ...] = ()
    problem: str | None = None
    """Why the silences are unknown (None: they were read)."""

    def of(self, incident: Mapping[str, Any]) -> str:
        """What the page says about one incident: empty when no active silence mutes
        it, `until HH:MM UTC (who)` of the one ending last when some do (with the date
        when that is a day or more away), `unknown` when the silences could not be
        read."""
        if self.problem is not None:
            return UNKNOWN
        muting = silencing(self.silences, incident_labels(incident))
        if not muting:
            return ""
        last = max(muting, key=lambda s: str(s.get("endsAt", "")))
        ends = pd.Timestamp(str(last["endsAt"])).tz_convert("UTC")
        # The clock time alone for a silence ending within a day (most do), else the date.
        soon = ends - pd.Timestamp.now(tz="UTC") < pd.Timedelta(days=1)
        when = f"{ends:%H:%M}" if soon else f"{ends:%Y-%m-%d %H:%M}"
        more = f", +{len(muting) - 1} more" if len(muting) > 1 else ""
        return f"until {when} UTC ({last.get('createdBy', '?')}{more})"


@st.cache_data(ttl=TTL_SECONDS, show_spinner=False)
def _read(url: str, timeout: float) -> tuple[tuple[dict[str, Any], ...], str | None]:
    try:
        return tuple(list_silences(url, timeout)), None
    except AlertmanagerError as exc:
        return (), str(exc)


def current() -> Silences | None:
    """The silences of the configured Alertmanager; None when incidents are not routed
    through one (`[alertmanager] enabled = false`)."""
    config = alertmanager()
    if not config.enabled:
        return None
    silences, problem = _read(config.url, min(TIMEOUT_SECONDS, config.timeout_seconds))
    return Silences(config.url, silences, problem)


def forget() -> None:
    """Read the silences afresh next time (after the page made one)."""
    _read.clear()
