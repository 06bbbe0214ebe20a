"""Alerts: the incidents firing now (each with what its rule watches for its key, over the
last hour, and whether Alertmanager silences it), then the recently resolved ones, each
to acknowledge or silence one at a time; below them the alerts (every report) newest
first, with filters, acknowledgement and counts over time. A notification's link
(`?incident=ID`) shows that incident first and chooses it for the actions."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import pandas as pd
import streamlit as st

from dashboard.alert_filters import RANGES, incident_clause, since, where_clause
from dashboard.charts import CLOCK, channel, chart, tip
from dashboard.data import (
    DataError,
    acknowledge,
    acknowledge_incident,
    alert_source,
    incident_source,
    query,
    sql_text,
    sql_time,
    table_version,
)
from dashboard.login import current_user
from dashboard.rule_folder import book_if_read
from dashboard.rulebook import Watched
from dashboard.settings import alertmanager, rule_store, settings
from dashboard.silences import Silences, current, forget
from dashboard.trends import SPARK_MINUTES, trends
from dashboard.ui import duration_text, empty, log, panel
from lookout.alertmanager import AlertmanagerError, create_silence
from lookout.notify import INCIDENT_PARAM, incident_labels

# Chart bucket sizes (seconds), the smallest giving at most ~120 bars is used.
BUCKETS = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
LIST_LIMIT = 500
ACK_CHOICES = 200
RESOLVED_LIMIT = 50
SILENCE_FOR = {
    "1 hour": timedelta(hours=1),
    "2 hours": timedelta(hours=2),
    "8 hours": timedelta(hours=8),
    "1 day": timedelta(days=1),
}
# Highest first; a severity not named here sorts after them.
SEVERITY_ORDER = "CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END"
INCIDENT_COLUMNS = (
    "incident_id, rule, key, severity, message, opened_at, last_report_at, resolved_at, "
    "reports, acked_at, acked_by, note"
)


def _on_ack() -> None:
    # Runs before the rerun, so the list drawn next already shows the acknowledgement.
    ids = st.session_state.get("ack_ids") or []
    if not ids:
        st.session_state["ack_message"] = ("warning", "Choose at least one alert to acknowledge.")
        return
    try:
        acknowledge(ids, st.session_state.get("ack_note", ""), current_user())
    except DataError as exc:
        st.session_state["ack_message"] = ("error", str(exc))
        return
    st.session_state["ack_message"] = ("success", f"Acknowledged {len(ids)} alert(s).")


def firing_incidents(where: str) -> pd.DataFrame | None:
    """The firing incidents matching `where`, the most severe first, then the newest; None
    before the engine wrote the incidents table."""
    source, tables = incident_source()
    return query(
        f"SELECT {INCIDENT_COLUMNS} FROM {source} WHERE resolved_at IS NULL AND {where} "
        f"ORDER BY {SEVERITY_ORDER}, opened_at DESC, incident_id",
        *tables,
    )


def one_incident(incident_id: str) -> pd.DataFrame | None:
    """The incident with this id (no row when there is none)."""
    source, tables = incident_source()
    return query(
        f"SELECT {INCIDENT_COLUMNS} FROM {source} WHERE incident_id = {sql_text(incident_id)}",
        *tables,
    )


def resolved_incidents(where: str, start: datetime | None) -> pd.DataFrame | None:
    """The newest RESOLVED_LIMIT incidents matching `where` resolved since `start`."""
    source, tables = incident_source()
    after = "" if start is None else f"AND resolved_at >= {sql_time(start)}"
    return query(
        f"SELECT {INCIDENT_COLUMNS} FROM {source} WHERE resolved_at IS NOT NULL {after} "
        f"AND {where} ORDER BY resolved_at DESC, incident_id LIMIT {RESOLVED_LIMIT}",
        *tables,
    )


FIRING_COLUMNS = [
    "severity",
    "rule",
    "key",
    "latest",
    "trend",
    "condition",
    "opened_at",
    "duration",
    "silenced",
    "message",
    "reports",
    "last_report_at",
    "acked_by",
    "note",
]
RESOLVED_COLUMNS = [
    "severity",
    "rule",
    "key",
    "opened_at",
    "resolved_at",
    "duration",
    "reports",
    "message",
    "acked_by",
    "note",
]
# A resolved incident shown by its link: what its rule watched, up to its resolution.
LINKED_RESOLVED_COLUMNS = [
    *RESOLVED_COLUMNS[:3],
    "latest",
    "trend",
    "condition",
    *RESOLVED_COLUMNS[3:6],
    "silenced",
    *RESOLVED_COLUMNS[6:],
]
INCIDENT_TABLE_COLUMNS = {
    "opened_at": st.column_config.DatetimeColumn("since (UTC)"),
    "last_report_at": st.column_config.DatetimeColumn("last report (UTC)"),
    "resolved_at": st.column_config.DatetimeColumn("resolved (UTC)"),
    "message": st.column_config.TextColumn("latest message"),
    "acked_by": st.column_config.TextColumn("acknowledged by"),
    "latest": st.column_config.NumberColumn(
        "latest",
        help="The newest value, for this key, of the input column the rule compares "
        "(see *condition*), read from the rule's input stream.",
    ),
    "trend": st.column_config.LineChartColumn(
        f"last {SPARK_MINUTES} min",
        help=f"That column's mean per minute over the last {SPARK_MINUTES} minutes of its "
        "input for this key (up to the resolution for a resolved incident).",
    ),
    "condition": st.column_config.TextColumn(
        "condition",
        help="What the rule compares, from its WHERE; empty when it compares nothing a "
        "table holds (a windowed rule's aggregates).",
    ),
    "silenced": st.column_config.TextColumn(
        "silenced",
        help="An active Alertmanager silence whose matchers match the incident's labels "
        "(rule, severity, key), and until when.",
    ),
}


def show_incidents(
    incidents: pd.DataFrame, ends: pd.Series | pd.Timestamp, columns: list[str]
) -> None:
    """A table of incidents with their duration up to `ends` (now, or their resolution);
    of `columns`, those it has."""
    shown = incidents.assign(
        duration=(ends - incidents["opened_at"]).dt.total_seconds().map(duration_text)
    )
    st.dataframe(
        shown[[c for c in columns if c in shown.columns]],
        hide_index=True,
        width="stretch",
        column_config=INCIDENT_TABLE_COLUMNS,
        placeholder="",
    )


def watched_inputs() -> dict[str, Watched] | None:
    """Per alert of the rule set, what its condition watches (alerts that watch no
    stored column are left out); None while the rule set is being read (the first time
    a dashboard process shows incidents, or after a rule file changed)."""
    book = book_if_read(rule_store())
    if book is None:
        return None
    return {r.name: r.watched for r in book.rules if r.kind == "alert" and r.watched}


def decorate(incidents: pd.DataFrame, silences: Silences | None) -> pd.DataFrame:
    """`incidents` with what their rules watch (condition, latest, trend: one query for
    all of them) and, when incidents go through Alertmanager, `silenced`. A failure to
    read the inputs leaves those columns empty and says why."""
    shown = incidents.drop_duplicates("incident_id")
    try:
        # The rule set is read (once per change of its files) only with incidents shown.
        inputs = watched_inputs() if not shown.empty else {}
        if inputs is None:
            st.caption(
                "What the rules watch is being read from the rule set; it shows from "
                "the next refresh."
            )
        watched = trends(shown, inputs or {})
    except DataError as exc:
        log.warning("incident trends: %s", exc)
        st.caption(f"What the rules watch cannot be shown: {exc}.")
        watched = trends(shown.iloc[0:0], {})
    out = incidents.merge(watched, on="incident_id", how="left")
    if silences is not None:
        out["silenced"] = [silences.of(row) for _, row in out.iterrows()]
    return out


def silence_note(silences: Silences | None) -> None:
    """Say so when the silences could not be read."""
    if silences is not None and silences.problem is not None:
        st.caption(
            f"Silences unknown: Alertmanager did not answer ({silences.problem}). The page "
            "asks again at its next refresh."
        )


def linked_panel(linked: str, found: pd.DataFrame | None, wall: pd.Timestamp) -> None:
    """The incident a notification's link names, whatever the filters, in a frame of
    its own above the others."""
    with st.container(border=True):
        st.subheader("Linked incident")
        if found is None or found.empty:
            st.warning(
                f"The linked incident `{linked}` is not in the incidents table (a "
                "lakehouse reset, or a link from another Lookout)."
            )
            return
        firing = pd.isna(found["resolved_at"].iloc[0])
        state = "Firing" if firing else "Resolved"
        st.caption(
            f"{state}: opened from its notification's link. It is chosen under "
            "*Acknowledge or silence an incident* below."
        )
        if firing:
            show_incidents(found, wall, FIRING_COLUMNS)
        else:
            show_incidents(found, found["resolved_at"], LINKED_RESOLVED_COLUMNS)


@panel
def incidents(where: str, start: datetime | None, linked: str | None) -> None:
    """The linked incident (if any), firing now, then recently resolved (since the time
    range's start)."""
    firing = firing_incidents(where)
    if firing is None:
        st.subheader("Firing now")
        empty("No incidents yet: the engine has not written the `incidents` table.")
        return
    wall = pd.Timestamp(time.time(), unit="s", tz="UTC")
    found = None if linked is None else one_incident(linked)
    silences = current()
    both = pd.concat([firing, found], ignore_index=True) if found is not None else firing
    decorated = decorate(both, silences)
    if linked is not None:
        linked_panel(linked, decorated.iloc[len(firing) :], wall)
    st.subheader("Firing now")
    if firing.empty:
        st.success("No incident is firing under these filters.")
    else:
        show_incidents(decorated.iloc[: len(firing)], wall, FIRING_COLUMNS)
    silence_note(silences)
    st.subheader("Recently resolved")
    resolved = resolved_incidents(where, start)
    assert resolved is not None
    if resolved.empty:
        st.caption("No incident resolved in this time range.")
    else:
        show_incidents(
            resolved,
            resolved["resolved_at"],
            RESOLVED_COLUMNS,
        )
    linked_found = found is not None and not found.empty
    with st.expander(
        "Acknowledge or silence an incident", expanded=not firing.empty or linked_found
    ):
        listed = [firing, resolved, *([found] if linked_found else [])]
        incident_actions(
            pd.concat(listed, ignore_index=True).drop_duplicates("incident_id"), linked
        )
        message = st.session_state.get("incident_message")
        if message:  # the outcome of the last action, until the next one
            getattr(st, message[0])(message[1])


def _label(row: pd.Series) -> str:
    state = "firing" if pd.isna(row["resolved_at"]) else "resolved"
    acked = "" if pd.isna(row["acked_at"]) else " · acknowledged"
    return (
        f"{state} · {row['severity']} · {row['rule']} · {row['key']} · "
        f"since {row['opened_at']:%Y-%m-%d %H:%M} UTC{acked}"
    )


def incident_actions(shown: pd.DataFrame, linked: str | None) -> None:
    """One incident (of those listed) at a time: acknowledge it with a note, or silence
    it in Alertmanager. Nothing is chosen until the operator chooses, except the linked
    incident, chosen once when its link is opened."""
    if shown.empty:
        st.caption("No incident listed to act on.")
        return
    labels = {row["incident_id"]: _label(row) for _, row in shown.iterrows()}
    if linked in labels and st.session_state.get("incident_linked") != linked:
        # Once per link: a later choice of the operator's stands through refreshes.
        st.session_state["incident_pick"] = linked
        st.session_state["incident_linked"] = linked
    st.selectbox(
        "Incident",
        list(labels),
        index=None,
        format_func=labels.__getitem__,
        key="incident_pick",
        placeholder="Choose one incident",
    )
    left, right = st.columns(2)
    with left.form("incident_ack", clear_on_submit=True):
        st.text_input(
            "Note on the incident", key="incident_note", placeholder="e.g. crew dispatched"
        )
        st.form_submit_button(
            "Acknowledge incident", key="incident_ack_submit", on_click=_on_incident_ack
        )
    with right.form("incident_silence", clear_on_submit=True):
        st.selectbox("Silence for", list(SILENCE_FOR), key="silence_for")
        st.text_input("Why (Alertmanager keeps it)", key="silence_comment")
        st.form_submit_button(
            "Silence in Alertmanager", key="incident_silence_submit", on_click=_on_silence
        )
    st.caption(
        "A silence mutes Alertmanager's notifications of every alert with this incident's "
        "labels (rule, severity, key) until it ends, later incidents of the same key too; "
        "`lookout silence list` shows it, `lookout silence expire ID` ends it."
    )


def _chosen_incident() -> dict[str, Any] | None:
    """The chosen incident's row, or None (with the message saying why)."""
    chosen = st.session_state.get("incident_pick")
    if chosen is None:
        st.session_state["incident_message"] = ("warning", "Choose an incident first.")
        return None
    source, tables = incident_source()
    found = query(
        f"SELECT {INCIDENT_COLUMNS} FROM {source} WHERE incident_id = {sql_text(chosen)}",
        *tables,
    )
    if found is None or found.empty:
        st.session_state["incident_message"] = (
            "warning",
            "That incident is no longer in the incidents table.",
        )
        return None
    return found.iloc[0].to_dict()


def _on_incident_ack() -> None:
    # Runs before the rerun, so the tables drawn next already show the acknowledgement.
    try:
        incident = _chosen_incident()
        if incident is None:
            return
        acknowledge_incident(
            incident["incident_id"], st.session_state.get("incident_note", ""), current_user()
        )
    except DataError as exc:
        st.session_state["incident_message"] = ("error", str(exc))
        return
    st.session_state["incident_message"] = (
        "success",
        f"Acknowledged {incident['rule']} at {incident['key']}.",
    )


def _on_silence() -> None:
    try:
        incident = _chosen_incident()
    except DataError as exc:
        st.session_state["incident_message"] = ("error", str(exc))
        return
    if incident is None:
        return
    comment = st.session_state.get("silence_comment", "").strip()
    if not comment:
        st.session_state["incident_message"] = (
            "warning",
            "Say why: Alertmanager requires a comment.",
        )
        return
    config = alertmanager()
    if not config.enabled:
        st.session_state["incident_message"] = (
            "error",
            "Incidents are not routed through Alertmanager (`[alertmanager] enabled = false`): "
            "there is nothing to silence.",
        )
        return
    chosen_for = st.session_state.get("silence_for") or next(iter(SILENCE_FOR))
    try:
        silence = create_silence(
            config.url,
            incident_labels(incident),
            SILENCE_FOR[chosen_for],
            current_user(),
            comment,
            config.timeout_seconds,
        )
    except AlertmanagerError as exc:
        st.session_state["incident_message"] = ("error", f"No silence was made: {exc}")
        return
    forget()  # the tables drawn next show it
    st.session_state["incident_message"] = (
        "success",
        f"Silenced {incident['rule']} at {incident['key']} for {chosen_for} (silence {silence}).",
    )


@panel
def live_alerts(where: str) -> None:
    """Counts, the newest alerts and the chart, re-read every refresh."""
    source, tables = alert_source()
    totals = query(
        f"SELECT count(*) AS alerts, count(acked_at) AS acked FROM {source} WHERE {where}",
        *tables,
    )
    if totals is None:
        return
    shown, acked = int(totals.at[0, "alerts"]), int(totals.at[0, "acked"])
    left, mid, right = st.columns(3)
    left.metric("matching alerts", f"{shown:,}")
    mid.metric("open", f"{shown - acked:,}")
    right.metric("acknowledged", f"{acked:,}")
    if shown == 0:
        st.info("No alert matches these filters. Widen the time range or clear a filter.")
        return
    alerts = query(
        "SELECT event_time, severity, rule, key, message, detected_at, acked_at, acked_by, "
        f"note, alert_id FROM {source} WHERE {where} "
        f"ORDER BY event_time DESC, alert_id LIMIT {LIST_LIMIT}",
        *tables,
    )
    assert alerts is not None
    alerts.insert(
        0, "status", alerts["acked_at"].notna().map({True: "acknowledged", False: "open"})
    )
    st.dataframe(
        alerts,
        hide_index=True,
        width="stretch",
        height=360,
        column_config={
            "event_time": st.column_config.DatetimeColumn("event time (UTC)"),
            "detected_at": st.column_config.DatetimeColumn("detected (UTC)"),
            "acked_at": st.column_config.DatetimeColumn("acknowledged (UTC)"),
            "acked_by": st.column_config.TextColumn("acknowledged by"),
        },
    )
    if shown > LIST_LIMIT:
        st.caption(f"Showing the newest {LIST_LIMIT} of {shown:,}; narrow the filters to see more.")
    counts_chart(source, tables, where)


def counts_chart(source: str, tables: tuple[str, ...], where: str) -> None:
    """Alerts per time bucket and rule, as stacked bars."""
    span = query(
        f"SELECT min(event_time) AS first, max(event_time) AS last FROM {source} WHERE {where}",
        *tables,
    )
    assert span is not None
    seconds = max((span.at[0, "last"] - span.at[0, "first"]).total_seconds(), 1)
    bucket = next((b for b in BUCKETS if seconds / b <= 120), BUCKETS[-1])
    counts = query(
        f"SELECT date_bin(INTERVAL '{bucket} seconds', event_time, "
        "TIMESTAMP '1970-01-01T00:00:00Z') AS bucket, rule, count(*) AS alerts "
        f"FROM {source} WHERE {where} GROUP BY 1, 2 ORDER BY 1",
        *tables,
    )
    assert counts is not None
    st.subheader("Alerts over time")
    spec = chart(
        "bar",
        x=channel(
            "bucket",
            "temporal",
            f"event time (UTC), {bucket // 60}-minute bins",
            # Over a day, the date too (still on the 24-hour clock).
            axis={"format": CLOCK if seconds <= 86400 else f"%d %b {CLOCK}"},
        ),
        y=channel("alerts", "quantitative", "alerts", stack=True),
        color=channel("rule", "nominal", "rule"),
        tooltip=[tip("bucket", "temporal"), tip("rule", "nominal"), tip("alerts", "quantitative")],
    )
    st.vega_lite_chart(counts, spec, width="stretch")


@panel
def ack_form(where: str) -> None:
    """Acknowledge open alerts (of the current filters) with a note."""
    source, tables = alert_source()
    candidates = query(
        f"SELECT alert_id, event_time, rule, key, message FROM {source} "
        f"WHERE {where} AND acked_at IS NULL ORDER BY event_time DESC, alert_id "
        f"LIMIT {ACK_CHOICES}",
        *tables,
    )
    if candidates is None or candidates.empty:
        st.caption("No open alert to acknowledge under these filters.")
        return
    labels = {
        row.alert_id: f"{row.event_time:%Y-%m-%d %H:%M:%S} · {row.rule} · {row.key} · {row.message}"
        for row in candidates.itertuples()
    }
    with st.form("ack", clear_on_submit=True):
        st.multiselect(
            "Open alerts",
            list(labels),
            format_func=labels.__getitem__,
            key="ack_ids",
            placeholder="Choose alerts to acknowledge",
            select_all=False,  # no one-click bulk action atop the list
        )
        st.text_input("Note", key="ack_note", placeholder="e.g. crew dispatched")
        st.form_submit_button("Acknowledge", key="ack_submit", on_click=_on_ack)


def main() -> None:
    """The page: filters (a change reruns the page), then the list and the acknowledgement
    form, refreshed together.

    Every input has a key: a widget's identity then does not depend on its options, so a
    new rule or alert arriving does not reset a choice or typed text. The form sits in
    the refreshing fragment so its list of open alerts follows the live list; a refresh
    re-sends the same keyed widgets, which keep what was typed but not yet submitted."""
    if table_version("alerts") is None:
        empty("No alerts yet: the engine has not written the `alerts` table.")
        return
    options = query("SELECT DISTINCT rule, severity FROM alerts ORDER BY rule", "alerts")
    assert options is not None
    c1, c2, c3, c4, c5 = st.columns([2, 2, 2, 2, 2])
    rules = c1.multiselect(
        "Rule",
        sorted(options["rule"].dropna().unique()),
        placeholder="all rules",
        key="filter_rules",
    )
    severities = c2.multiselect(
        "Severity",
        sorted(options["severity"].dropna().unique()),
        placeholder="all severities",
        key="filter_severities",
    )
    range_name = c3.selectbox("Time range", list(RANGES), key="filter_range")
    key = c4.text_input("Key contains", placeholder="e.g. station=3", key="filter_key")
    status = c5.selectbox("Status", ["all", "open", "acknowledged"], key="filter_status")
    linked = st.query_params.get(INCIDENT_PARAM) or None

    @st.fragment(run_every=settings().refresh_seconds)
    def live() -> None:
        # The time range moves with the clock, so it is recomputed at every refresh.
        start = since(range_name)
        incidents(incident_clause(rules, severities, key), start, linked)
        st.subheader("Alerts")
        st.caption("Every report of every alert rule, newest first.")
        live_alerts(where_clause(rules, severities, start, key, status))
        with st.expander("Acknowledge alerts", expanded=True):
            ack_form(where_clause(rules, severities, start, key, "open"))
            message = st.session_state.get("ack_message")
            if message:  # the outcome of the last acknowledgement, until the next one
                getattr(st, message[0])(message[1])

    live()


panel(main)()
