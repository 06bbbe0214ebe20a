"""Alerts: the live list, newest first, refreshing on its own."""

from __future__ import annotations

import streamlit as st

from dashboard.data import query
from dashboard.settings import REFRESH_SECONDS

st.title("Alerts")


@st.fragment(run_every=REFRESH_SECONDS)
def live_alerts() -> None:
    alerts = query(
        "alerts",
        "SELECT event_time, severity, rule, key, message, detected_at, alert_id "
        "FROM alerts ORDER BY event_time DESC, alert_id LIMIT 500",
    )
    if alerts is None or alerts.empty:
        st.info(
            "No alerts yet. Start everything with `./run demo`, or run "
            "`lookout simulate traffic --congestion 3,7` against a running "
            "`lookout ingest` and `lookout engine`."
        )
        return
    st.metric("alerts shown", len(alerts))
    st.dataframe(alerts, hide_index=True, width="stretch")


live_alerts()
