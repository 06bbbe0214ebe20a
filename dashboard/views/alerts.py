"""Alerts: the live list (newest first) with filters, acknowledgement and counts over time."""

from __future__ import annotations

import streamlit as st

from dashboard.alert_filters import RANGES, since, where_clause
from dashboard.charts import channel, chart, tip
from dashboard.data import DataError, acknowledge, alert_source, query, table_version
from dashboard.login import current_user
from dashboard.settings import settings
from dashboard.ui import empty, panel

# Chart bucket sizes (seconds), the smallest giving at most ~120 bars is used.
BUCKETS = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
LIST_LIMIT = 500
ACK_CHOICES = 200


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
        x=channel("bucket", "temporal", f"event time (UTC), {bucket // 60}-minute bins"),
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
        )
        st.text_input("Note", key="ack_note", placeholder="e.g. crew dispatched")
        st.form_submit_button("Acknowledge", on_click=_on_ack)


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

    @st.fragment(run_every=settings().refresh_seconds)
    def live() -> None:
        # The time range moves with the clock, so it is recomputed at every refresh.
        start = since(range_name)
        live_alerts(where_clause(rules, severities, start, key, status))
        with st.expander("Acknowledge alerts", expanded=True):
            ack_form(where_clause(rules, severities, start, key, "open"))
            message = st.session_state.get("ack_message")
            if message:  # the outcome of the last acknowledgement, until the next one
                getattr(st, message[0])(message[1])

    live()


panel(main)()
