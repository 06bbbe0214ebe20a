"""Lookout's dashboard: one entry point, one script per page (Streamlit multipage).

The page scripts live in `views/`, not `pages/`: Streamlit treats a `pages/` folder
beside the entry point as the old multipage layout, and a fresh server then runs a
deep link such as `/traffic` straight from that folder, skipping this file.

Served by `lookout dashboard`, which binds it to 127.0.0.1 unless configured otherwise.
No page runs before a user has signed in (`dashboard.login`).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard.login import require_login, signed_in

VIEWS = Path(__file__).resolve().parent / "views"

# Operators see plain messages, never a stack trace (pages catch errors themselves;
# this is the backstop for anything that slips through).
st.set_option("client.showErrorDetails", "none")
st.set_option("client.toolbarMode", "viewer")  # no "Deploy" button for operators
st.set_page_config(page_title="Lookout", page_icon=":vertical_traffic_light:", layout="wide")
# The page is chosen (from the URL) before signing in, so that a deep link such as
# `/traffic` opens that page once signed in; the menu shows only after it.
navigation = st.navigation(
    [
        st.Page(VIEWS / "alerts.py", title="Alerts", icon=":material/notifications:", default=True),
        st.Page(VIEWS / "traffic.py", title="Traffic", icon=":material/traffic:"),
        st.Page(VIEWS / "rfid.py", title="RFID", icon=":material/nfc:"),
        st.Page(VIEWS / "rules.py", title="Rules", icon=":material/rule:"),
        st.Page(VIEWS / "health.py", title="Health", icon=":material/monitor_heart:"),
    ],
    position="sidebar" if signed_in() else "hidden",
)
require_login()
# The title first: the page script's imports (pandas, delta-rs) and first queries
# then run behind it instead of before anything is on screen.
st.title(navigation.title)
navigation.run()
