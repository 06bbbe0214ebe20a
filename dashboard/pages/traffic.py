"""Traffic: average speed per station and minute, from the accepted readings."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboard.data import query
from dashboard.settings import REFRESH_SECONDS

st.title("Traffic")


@st.fragment(run_every=REFRESH_SECONDS)
def station_speeds() -> None:
    speeds = query(
        "readings_traffic",
        "SELECT date_trunc('minute', ts) AS minute, station, avg(speed) AS avg_speed, "
        "count(*) AS vehicles FROM readings_traffic "
        "WHERE ts >= (SELECT max(ts) FROM readings_traffic) - INTERVAL '60 minutes' "
        "GROUP BY 1, 2 ORDER BY 1, 2",
    )
    if speeds is None or speeds.empty:
        st.info("No traffic readings yet. Start the simulator: `lookout simulate traffic`.")
        return
    speeds["station"] = speeds["station"].astype(str)
    chart = (
        alt.Chart(speeds)
        .mark_line(point=True)
        .encode(
            x=alt.X("minute:T", title="minute (UTC)"),
            y=alt.Y("avg_speed:Q", title="average speed (m/s)"),
            color=alt.Color("station:N", title="station"),
            tooltip=[
                "minute:T",
                "station:N",
                alt.Tooltip("avg_speed:Q", format=".1f"),
                "vehicles:Q",
            ],
        )
    )
    threshold = alt.Chart().mark_rule(strokeDash=[4, 4], color="red").encode(y=alt.datum(15))
    st.altair_chart(chart + threshold, width="stretch")
    st.caption("Dashed line: the congestion threshold of 15 m/s (PIPES §2.2).")


station_speeds()
