"""Lookout's dashboard: one entry point, one script per page (Streamlit multipage)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

PAGES = Path(__file__).resolve().parent / "pages"

st.set_page_config(page_title="Lookout", page_icon=":vertical_traffic_light:", layout="wide")
navigation = st.navigation(
    [
        st.Page(PAGES / "alerts.py", title="Alerts", icon=":material/notifications:", default=True),
        st.Page(PAGES / "traffic.py", title="Traffic", icon=":material/traffic:"),
    ]
)
navigation.run()
