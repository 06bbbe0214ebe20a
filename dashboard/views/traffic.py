"""Traffic: the highway strip (congested / silent / normal), speed and volume per station,
and one station in detail.

"Now" for the charts and windows on this page is the stream's clock, the newest
reading's event time, so they say the same about live data and about a replay of
yesterday. A station's age on the strip is by the wall clock as well: how long ago its
newest reading arrived, so a station (or a whole stream) whose clock froze looks stale.
"""

from __future__ import annotations

import html
import re
import time
from datetime import datetime, timedelta

import pandas as pd
import streamlit as st

from dashboard.charts import channel, chart, tip, with_threshold
from dashboard.data import alert_source, query, sql_text, sql_time, table_version
from dashboard.rule_folder import book_of, configured_alert_problem
from dashboard.settings import rule_store, settings
from dashboard.ui import duration_text, empty, panel
from lookout.config import DashboardConfig

READINGS = "readings_traffic"
CHART_MINUTES = 60
# Scans stop this far back in stream time, so a refresh costs the same however long the
# table has grown (Delta's file statistics let DataFusion skip older files). A station
# silent for longer than this leaves the strip.
HORIZON_HOURS = 24
COLOURS = {"congested": "#d62728", "silent": "#7f7f7f", "normal": "#2ca02c"}
_STATION_KEY = re.compile(r"(?:^|,\s*)station=(\d+)(?:,|$)")


def stream_clock() -> datetime | None:
    """The newest reading's event time (None without readings)."""
    clock = query(f"SELECT max(ts) AS now FROM {READINGS}", READINGS)
    if clock is None or pd.isna(clock.at[0, "now"]):
        return None
    return clock.at[0, "now"].to_pydatetime()


def congested_stations(now: datetime, rule: str, minutes: float) -> set[int]:
    """Stations with an open alert of `rule` (the configured congestion rule) in the
    last `minutes`."""
    if table_version("alerts") is None:
        return set()
    source, tables = alert_source()
    keys = query(
        f"SELECT DISTINCT key FROM {source} WHERE rule = {sql_text(rule)} "
        f"AND acked_at IS NULL "
        f"AND event_time >= {sql_time(now - timedelta(minutes=minutes))}",
        *tables,
    )
    found = set()
    for key in [] if keys is None else keys["key"].dropna():
        match = _STATION_KEY.search(key)
        if match:
            found.add(int(match.group(1)))
    return found


def station_states(now: datetime, config: DashboardConfig, can_congest: bool) -> pd.DataFrame:
    """Per station: its newest reading's event time and arrival, average speed and
    vehicles over 15 minutes, state (never congested unless `can_congest`: the configured
    congestion rule is an alert keyed by station)."""
    recent = sql_time(now - timedelta(minutes=15))
    stations = query(
        f"SELECT station, max(ts) AS last_reading, max(received_at) AS last_arrival, "
        f"avg(CASE WHEN ts >= {recent} THEN speed END) AS avg_speed, "
        f"count(CASE WHEN ts >= {recent} THEN 1 END) AS vehicles "
        f"FROM {READINGS} WHERE ts >= {sql_time(now - timedelta(hours=HORIZON_HOURS))} "
        "GROUP BY station ORDER BY station",
        READINGS,
    )
    assert stations is not None
    congested = (
        congested_stations(now, config.congestion_rule, config.congested_minutes)
        if can_congest
        else set()
    )
    silent = pd.Timedelta(minutes=config.silent_minutes)
    wall = pd.Timestamp(time.time(), unit="s", tz="UTC")

    def state(row: pd.Series) -> str:
        # Silent by either clock: nothing arrived lately (a frozen station, or a frozen
        # stream whose clock stopped with it), or its newest reading trails the others'.
        if row["last_arrival"] < wall - silent or row["last_reading"] < pd.Timestamp(now) - silent:
            return "silent"
        return "congested" if row["station"] in congested else "normal"

    stations["state"] = stations.apply(state, axis=1) if len(stations) else []
    return stations


def strip_html(stations: pd.DataFrame, now: datetime, config: DashboardConfig) -> str:
    """The highway as a row of coloured station boxes, in station order: each with its
    speed, how long ago (wall clock) its newest reading arrived, and how far that
    reading's event time trails the stream clock when it does by a minute or more."""
    wall = pd.Timestamp(time.time(), unit="s", tz="UTC")
    boxes = []
    for row in stations.itertuples():
        arrived = (wall - row.last_arrival).total_seconds()
        behind = (pd.Timestamp(now) - row.last_reading).total_seconds()
        speed = "n/a" if pd.isna(row.avg_speed) else f"{row.avg_speed:.1f} m/s"
        ages = f"arrived {duration_text(arrived)} ago" + (
            f" · {duration_text(behind)} behind" if behind >= 60 else ""
        )
        boxes.append(
            f'<div style="padding:0.5em;border-radius:0.4em;'
            f'background:{COLOURS[row.state]};color:white;text-align:center">'
            f"<b>station {row.station}</b><br>{html.escape(row.state)}<br>"
            f'<span style="font-size:0.8em">{speed} · {html.escape(ages)}'
            "</span></div>"
        )
    legend = " ".join(f'<span style="color:{c}">■</span> {s}' for s, c in COLOURS.items())
    return (
        # A grid of equal columns: a row left short keeps the tiles' width (a wrapped
        # flex row stretched its tiles to fill it).
        '<div style="display:grid;gap:0.4em;'
        'grid-template-columns:repeat(auto-fill,minmax(6.5em,1fr))">' + "".join(boxes) + "</div>"
        f'<div style="font-size:0.8em;margin-top:0.3em">{legend} — congested: an open '
        f"<code>{html.escape(config.congestion_rule)}</code> alert in the last "
        f"{config.congested_minutes:g} min; silent: no reading arrived for "
        f"{config.silent_minutes:g} min (wall clock), or the newest trails the stream "
        f"clock by as much. <i>arrived … ago</i>: wall clock since the station's newest "
        "reading reached Lookout; <i>behind</i>: how far that reading's event time "
        "trails the stream clock</div>"
    )


def per_minute(now: datetime, station: int | None = None) -> pd.DataFrame:
    """Average speed and vehicles per minute (per station, or per lane of one station)
    over the last CHART_MINUTES whole minutes: the minute still running at `now` is left
    out, as is any minute cut by the window's start, since a partial minute would be
    drawn as a fall in volume."""
    group = "station" if station is None else "lane"
    only = "" if station is None else f"AND station = {int(station)}"
    end = now.replace(second=0, microsecond=0)
    frame = query(
        f"SELECT date_trunc('minute', ts) AS minute, {group}, avg(speed) AS avg_speed, "
        f"count(*) AS vehicles FROM {READINGS} "
        f"WHERE ts >= {sql_time(end - timedelta(minutes=CHART_MINUTES))} "
        f"AND ts < {sql_time(end)} {only} "
        f"GROUP BY 1, 2 ORDER BY 1, 2",
        READINGS,
    )
    assert frame is not None
    frame[group] = frame[group].astype(str)
    return frame


def congestion_threshold(rule: str) -> tuple[str, float] | None:
    """(column, m/s) below which the congestion rule fires, when its WHERE says so
    plainly (`avg_speed < 15`) about a speed; None otherwise."""
    found = next((r for r in book_of(rule_store()).rules if r.name == rule), None)
    bound = found.fires_below if found else None
    return bound if bound and "speed" in bound[0] else None


def charts(frame: pd.DataFrame, group: str, threshold: float | None) -> None:
    """Speed (with the congestion threshold, if known) and volume per minute, side by
    side."""
    x = channel("minute", "temporal", "minute (UTC)")
    color = channel(group, "nominal", group)
    tooltip = [
        tip("minute", "temporal"),
        tip(group, "nominal"),
        tip("avg_speed", "quantitative", format=".1f"),
        tip("vehicles", "quantitative"),
    ]
    speed = chart(
        "line", x, channel("avg_speed", "quantitative", "average speed (m/s)"), color, tooltip
    )
    volume = chart(
        "line", x, channel("vehicles", "quantitative", "vehicles per minute"), color, tooltip
    )
    left, right = st.columns(2)
    left.vega_lite_chart(
        frame, speed if threshold is None else with_threshold(speed, threshold), width="stretch"
    )
    right.vega_lite_chart(frame, volume, width="stretch")


@panel
def overview() -> None:
    """The strip and the per-station charts."""
    now = stream_clock()
    if now is None:
        empty("No traffic readings yet.", "Start the simulator: `lookout simulate traffic`.")
        return
    config = settings()  # read at each refresh: an edited lookout.toml applies at once
    # Before the strip: alerts of a rule that is not (or no longer) an alert keyed by
    # station colour no tile, as the warning below the strip says.
    problem = configured_alert_problem("congestion_rule", config.congestion_rule, "station")
    stations = station_states(now, config, can_congest=problem is None)
    st.caption(f"Stream clock (newest reading): {now:%Y-%m-%d %H:%M:%S} UTC")
    st.markdown(strip_html(stations, now, config), unsafe_allow_html=True)
    if problem:
        st.warning(f"No station can show as congested. {problem}")
    st.subheader(f"Per station, last {CHART_MINUTES} minutes")
    threshold = congestion_threshold(config.congestion_rule)
    charts(per_minute(now), "station", None if threshold is None else threshold[1])
    if threshold:
        column, bound = threshold
        st.caption(
            f"Dashed line: `{config.congestion_rule}` fires below {bound:g} m/s "
            f"(`{column} < {bound:g}` in its rule)."
        )


@panel
def station_detail(station: int) -> None:
    """One station: per-lane speed and volume, its latest readings and its alerts."""
    now = stream_clock()
    if now is None:
        return
    threshold = congestion_threshold(settings().congestion_rule)
    charts(per_minute(now, station), "lane", None if threshold is None else threshold[1])
    left, right = st.columns(2)
    latest = query(
        f"SELECT ts, lane, speed, length, source, seq FROM {READINGS} "
        f"WHERE station = {int(station)} "
        f"AND ts >= {sql_time(now - timedelta(hours=HORIZON_HOURS))} "
        "ORDER BY ts DESC LIMIT 20",
        READINGS,
    )
    left.markdown("**Latest readings**")
    left.dataframe(latest, hide_index=True, width="stretch")
    right.markdown("**Alerts at this station**")
    if table_version("alerts") is None:
        right.caption("No alerts table yet.")
        return
    source, tables = alert_source()
    alerts = query(
        f"SELECT event_time, rule, severity, message, acked_at FROM {source} "
        f"WHERE key = 'station={int(station)}' OR strpos(key, 'station={int(station)},') = 1 "
        "ORDER BY event_time DESC LIMIT 20",
        *tables,
    )
    if alerts is None or alerts.empty:
        right.caption("None.")
    else:
        right.dataframe(alerts, hide_index=True, width="stretch")


def main() -> None:
    """The page: live overview, then the drill-down into the chosen station."""
    if table_version(READINGS) is None:
        empty("No traffic readings yet: the `readings_traffic` table does not exist.")
        return
    refresh = settings().refresh_seconds
    st.fragment(run_every=refresh)(overview)()
    now = stream_clock()
    if now is None:
        return
    stations = query(
        f"SELECT DISTINCT station FROM {READINGS} "
        f"WHERE ts >= {sql_time(now - timedelta(hours=HORIZON_HOURS))} ORDER BY station",
        READINGS,
    )
    if stations is None or stations.empty:
        return
    st.subheader("Station detail")
    station = st.selectbox("Station", stations["station"].tolist(), key="station")
    st.fragment(run_every=refresh)(station_detail)(station)


panel(main)()
