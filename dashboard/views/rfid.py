"""RFID: doors with recent reads, theft alarms and packing groups over time, and the path
of one tag through the doors. "Recent" is measured on the stream's clock (newest read)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
import streamlit as st

from dashboard.charts import channel, chart, tip
from dashboard.data import alert_source, query, sql_text, sql_time, table_version
from dashboard.rule_folder import configured_alert_problem
from dashboard.settings import settings
from dashboard.ui import empty, panel
from lookout.notify import INCIDENT_PARAM

READINGS = "readings_tag_readings"
GROUPS = "packing_groups"
RECENT_MINUTES = 5
BIN = "INTERVAL '5 minutes'"
EPOCH = "TIMESTAMP '1970-01-01T00:00:00Z'"
INCIDENT_LIMIT = 10


def stream_clock() -> datetime | None:
    """The newest tag read's event time (None without reads)."""
    clock = query(f"SELECT max(ts) AS now FROM {READINGS}", READINGS)
    if clock is None or pd.isna(clock.at[0, "now"]):
        return None
    return clock.at[0, "now"].to_pydatetime()


@panel
def doors() -> None:
    """Every door: reads and tags in the last minutes, and its last read."""
    now = stream_clock()
    if now is None:
        empty("No tag reads yet.", "Start the simulator: `lookout simulate rfid`.")
        return
    recent = sql_time(now - timedelta(minutes=RECENT_MINUTES))
    table = query(
        f"SELECT CAST(door AS VARCHAR) AS door, "
        f"count(CASE WHEN ts >= {recent} THEN 1 END) AS recent_reads, "
        f"count(DISTINCT CASE WHEN ts >= {recent} THEN tagid END) AS recent_tags, "
        f"max(ts) AS last_read, count(*) AS all_reads "
        f"FROM {READINGS} GROUP BY 1 ORDER BY 1",
        READINGS,
    )
    assert table is not None
    st.caption(
        f"Stream clock (newest read): {now:%Y-%m-%d %H:%M:%S} UTC; recent = the last "
        f"{RECENT_MINUTES} minutes."
    )
    active = table[table["recent_reads"] > 0]
    st.metric("doors with recent reads", f"{len(active)} of {len(table)}")
    st.dataframe(table, hide_index=True, width="stretch")


@panel
def theft_alarms() -> None:
    """Theft alarms (the configured theft rule's alerts) per 5 minutes, and the latest."""
    rule = settings().theft_rule
    problem = configured_alert_problem("theft_rule", rule, "door")
    if problem:  # else "no theft alarm" would be a false all-clear
        st.warning(f"Theft alarms cannot be shown. {problem}")
        return
    if table_version("alerts") is None:
        empty("No alerts table yet.")
        return
    st.caption(f"Alerts of the rule `{rule}`.")
    theft_incidents(rule)
    source, tables = alert_source()
    alarms = query(
        f"SELECT event_time, key, message, acked_at FROM {source} "
        f"WHERE rule = {sql_text(rule)} ORDER BY event_time DESC LIMIT 200",
        *tables,
    )
    assert alarms is not None
    if alarms.empty:
        st.success("No theft alarm.")
        return
    alarms["bin"] = alarms["event_time"].dt.floor("5min")
    counts = alarms.groupby("bin", as_index=False).size()
    st.vega_lite_chart(
        counts,
        chart(
            {"type": "bar", "color": "#d62728"},
            x=channel("bin", "temporal", "event time (UTC), 5-minute bins"),
            y=channel("size", "quantitative", "theft alarms"),
        ),
        width="stretch",
    )
    st.dataframe(alarms.drop(columns="bin"), hide_index=True, width="stretch")


def theft_incidents(rule: str) -> None:
    """The theft rule's firing incidents (one per door and episode), newest first, each a
    link to it on the Alerts page."""
    firing = query(
        f"SELECT incident_id, key, opened_at, reports FROM incidents "
        f"WHERE rule = {sql_text(rule)} AND resolved_at IS NULL "
        f"ORDER BY opened_at DESC, incident_id LIMIT {INCIDENT_LIMIT}",
        "incidents",
    )
    if firing is None or firing.empty:
        st.caption("No theft incident is firing.")
        return
    for row in firing.itertuples():
        st.page_link(
            "views/alerts.py",
            label=(
                f"Theft incident at {row.key}, firing since {row.opened_at:%H:%M} UTC "
                f"({row.reports} alarm{'s' if row.reports != 1 else ''})"
            ),
            icon=":material/warning:",
            query_params={INCIDENT_PARAM: str(row.incident_id)},
        )


@panel
def packing_groups() -> None:
    """Packing groups started per door and 5 minutes, and the newest groups' items."""
    if table_version(GROUPS) is None:
        empty(
            "No packing groups yet: the `packing_groups` stream has not been written.",
            "It is created by the `packing_groups` rule in `rules/rfid.sql`.",
        )
        return
    per_bin = query(
        f"SELECT date_bin({BIN}, ts, {EPOCH}) AS bin, CAST(door AS VARCHAR) AS door, "
        f"count(DISTINCT group_no) AS groups, count(*) AS items "
        f"FROM {GROUPS} GROUP BY 1, 2 ORDER BY 1, 2",
        GROUPS,
    )
    assert per_bin is not None
    if per_bin.empty:
        st.info("No packing group yet.")
        return
    st.vega_lite_chart(
        per_bin,
        chart(
            "bar",
            x=channel("bin", "temporal", "event time (UTC), 5-minute bins"),
            y=channel("groups", "quantitative", "packing groups", stack=True),
            color=channel("door", "nominal", "door"),
            tooltip=[
                tip("bin", "temporal"),
                tip("door", "nominal"),
                tip("groups", "quantitative"),
                tip("items", "quantitative"),
            ],
        ),
        width="stretch",
    )
    newest = query(
        f"SELECT CAST(door AS VARCHAR) AS door, group_no, min(ts) AS first_item, "
        f"count(*) AS items, string_agg(tagid, ', ') AS tags FROM {GROUPS} "
        f"GROUP BY 1, 2 ORDER BY first_item DESC LIMIT 20",
        GROUPS,
    )
    st.dataframe(newest, hide_index=True, width="stretch")


@panel
def item_path(tagid: str) -> None:
    """Every read of one tag, in event-time order: its path through the doors."""
    path = query(
        f"SELECT ts, CAST(door AS VARCHAR) AS door, tagtype FROM {READINGS} "
        f"WHERE tagid = {sql_text(tagid)} ORDER BY ts",
        READINGS,
    )
    if path is None or path.empty:
        st.info(
            f"No read of tag `{tagid}`. Tag ids look like the ones in the theft alarms "
            "and packing groups above."
        )
        return
    route = " → ".join(path["door"].loc[path["door"] != path["door"].shift()])
    st.markdown(f"**{tagid}** ({path['tagtype'].iloc[0]}): door {route}")
    st.vega_lite_chart(
        path,
        chart(
            {"type": "line", "point": True},
            x=channel("ts", "temporal", "event time (UTC)"),
            y=channel("door", "ordinal", "door"),
            tooltip=[tip("ts", "temporal"), tip("door", "ordinal")],
        ),
        width="stretch",
    )
    st.dataframe(path, hide_index=True, width="stretch")


def main() -> None:
    """The page: live door, alarm and group panels, then the item-path lookup."""
    if table_version(READINGS) is None:
        empty(
            "No RFID reads yet: the `readings_tag_readings` table does not exist.",
            "Start the simulator: `lookout simulate rfid` (with `lookout ingest` and "
            "`lookout engine` running), or everything with `lookout demo`.",
        )
        return
    st.subheader("Doors")
    refresh = settings().refresh_seconds
    st.fragment(run_every=refresh)(doors)()
    left, right = st.columns(2)
    with left:
        st.subheader("Theft alarms")
        st.fragment(run_every=refresh)(theft_alarms)()
    with right:
        st.subheader("Packing groups")
        st.fragment(run_every=refresh)(packing_groups)()
    st.subheader("Item path")
    tagid = st.text_input("Tag id", placeholder="e.g. item-0042", key="tagid")
    if tagid.strip():
        item_path(tagid.strip())


panel(main)()
