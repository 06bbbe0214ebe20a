"""What an incident's rule watches, for its key, as the Alerts page shows it: the
latest value of the compared input column and its per-minute mean over the last hour.

The values are read where the engine stores the rule's input (`dashboard.rulebook.
Watched`): for `congestion` at `station=3`, the `station_speed` table's `avg_speed`
rows of station 3. One SQL query covers every incident shown (a UNION ALL of one
branch per rule, each reading only its incidents' keys and hours), so a refresh costs
one query whatever the number of incidents.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import pandas as pd

from dashboard.data import query, sql_text, sql_time, table_version
from dashboard.rulebook import Watched

SPARK_MINUTES = 60
# A firing incident whose last report is older than the newest one shown by more than
# this is read over its last day only (an input that stopped leaves no hour to show).
HORIZON = timedelta(hours=24)
EPOCH = "TIMESTAMP '1970-01-01T00:00:00Z'"
COLUMNS = ["incident_id", "condition", "latest", "trend"]


def _name(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def key_sql(key: tuple[str, ...]) -> str:
    """SQL giving the alerts' key text (`station=3, lane=1`: `engine.alerts.format_key`)
    from the key columns (integers and strings, whose text is their VARCHAR cast)."""
    if not key:
        return "''"
    parts = []
    for i, column in enumerate(key):
        parts.append(sql_text(f"{', ' if i else ''}{column}="))
        parts.append(f"CAST({_name(column)} AS VARCHAR)")
    return f"concat({', '.join(parts)})"


def _instant(when: pd.Timestamp) -> str:
    """A UTC instant to the microsecond as a SQL timestamp literal (`sql_time` stops at
    the second)."""
    return sql_text(when.tz_convert("UTC").strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


def _window(row: pd.Series, newest: pd.Timestamp) -> tuple[pd.Timestamp, pd.Timestamp | None]:
    """The span of input read for one incident: the hour before its resolution, or from
    the hour before its last report on (whole minutes, so refreshes share a query)."""
    if pd.notna(row["resolved_at"]):
        end = row["resolved_at"]
        return (end - timedelta(minutes=SPARK_MINUTES)).floor("min"), end
    last = max(row["last_report_at"], newest - HORIZON)
    return (last - timedelta(minutes=SPARK_MINUTES)).floor("min"), None


def trend_sql(
    incidents: pd.DataFrame, watched: Mapping[str, Watched]
) -> tuple[str, tuple[str, ...]] | None:
    """The one query over the watched inputs of `incidents`' rules (tables that exist
    only), per rule, key and minute: the mean and the last value; None when no incident
    has one."""
    newest = incidents["last_report_at"].max()
    branches, tables = [], []
    for rule, rows in incidents.groupby("rule", sort=True):
        what = watched.get(str(rule))
        if what is None or table_version(what.table) is None:
            continue
        key, ts, value = key_sql(what.key), _name(what.timestamp), _name(what.column)
        spans = []
        for _, row in rows.iterrows():
            start, end = _window(row, newest)
            upper = "" if end is None else f" AND {ts} <= {_instant(end)}"
            spans.append(f"({key} = {sql_text(row['key'])} AND {ts} >= {sql_time(start)}{upper})")
        branches.append(
            f"SELECT {sql_text(str(rule))} AS rule, {key} AS key, "
            f"date_bin(INTERVAL '1 minute', {ts}, {EPOCH}) AS minute, "
            f"avg(CAST({value} AS DOUBLE)) AS mean, "
            f"last_value(CAST({value} AS DOUBLE) ORDER BY {ts}) AS last "
            f"FROM {what.table} WHERE {' OR '.join(sorted(set(spans)))} GROUP BY 1, 2, 3"
        )
        tables.append(what.table)
    if not branches:
        return None
    return " UNION ALL ".join(branches) + " ORDER BY rule, key, minute", tuple(tables)


def trends(incidents: pd.DataFrame, watched: Mapping[str, Watched]) -> pd.DataFrame:
    """Per incident whose rule has a watched input: the condition (`avg_speed < 15`),
    the latest value (the newest row's, in its span) and the per-minute means of its
    span's last SPARK_MINUTES minutes, oldest first (empty when the input has no row
    there)."""
    if incidents.empty:
        return pd.DataFrame(columns=COLUMNS)
    planned = trend_sql(incidents, watched)
    values = None if planned is None else query(planned[0], *planned[1])
    if values is None:
        values = pd.DataFrame(columns=["rule", "key", "minute", "mean", "last"])
    groups = {k: g for k, g in values.groupby(["rule", "key"], sort=False)}
    newest = incidents["last_report_at"].max()
    out = []
    for _, row in incidents.iterrows():
        what = watched.get(row["rule"])
        if what is None:
            continue
        bins = groups.get((row["rule"], row["key"]))
        points = values.iloc[0:0] if bins is None else bins
        start, end = _window(row, newest)
        points = points[points["minute"] >= start]
        if end is not None:
            points = points[points["minute"] <= end]
        if not points.empty:
            recent = points["minute"].iloc[-1] - timedelta(minutes=SPARK_MINUTES - 1)
            points = points[points["minute"] >= recent]
        out.append(
            {
                "incident_id": row["incident_id"],
                "condition": what.condition,
                "latest": None if points.empty else round(float(points["last"].iloc[-1]), 2),
                "trend": [round(float(v), 2) for v in points["mean"]],
            }
        )
    return pd.DataFrame(out, columns=COLUMNS)
