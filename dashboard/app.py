"""Lookout's dashboard: one entry point, one script per page (Streamlit multipage).

Served by `lookout dashboard`, which binds it to 127.0.0.1 unless configured otherwise.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

PAGES = Path(__file__).resolve().parent / "pages"

# Operators see plain messages, never a stack trace (pages catch errors themselves;
# this is the backstop for anything that slips through).
st.set_option("client.showErrorDetails", "none")
st.set_option("client.toolbarMode", "viewer")  # no "Deploy" button for operators
st.set_page_config(page_title="Lookout", page_icon=":vertical_traffic_light:", layout="wide")
navigation = st.navigation(
    [
        st.Page(PAGES / "alerts.py", title="Alerts", icon=":material/notifications:", default=True),
        st.Page(PAGES / "traffic.py", title="Traffic", icon=":material/traffic:"),
        st.Page(PAGES / "rfid.py", title="RFID", icon=":material/nfc:"),
        st.Page(PAGES / "rules.py", title="Rules", icon=":material/rule:"),
        st.Page(PAGES / "health.py", title="Health", icon=":material/monitor_heart:"),
    ]
)
navigation.run()
