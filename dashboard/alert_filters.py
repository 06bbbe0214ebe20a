"""The Alerts page's filters as SQL: rules, severities, time range, key text, status (the
incidents take the first three and the key text)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dashboard.data import sql_text, sql_time

RANGES: dict[str, timedelta | None] = {
    "all time": None,
    "last 15 minutes": timedelta(minutes=15),
    "last hour": timedelta(hours=1),
    "last 6 hours": timedelta(hours=6),
    "last 24 hours": timedelta(days=1),
}


def where_clause(
    rules: list[str], severities: list[str], since: datetime | None, key: str, status: str
) -> str:
    """The SQL filter of the alerts for the chosen rules, severities, start time, key text
    and status."""
    terms = [incident_clause(rules, severities, key)]
    if since is not None:
        terms.append(f"event_time >= {sql_time(since)}")
    if status == "open":
        terms.append("acked_at IS NULL")
    elif status == "acknowledged":
        terms.append("acked_at IS NOT NULL")
    return " AND ".join(terms)


def incident_clause(rules: list[str], severities: list[str], key: str) -> str:
    """The SQL filter for the chosen rules, severities and key text (columns the alerts
    and the incidents share)."""
    terms = ["TRUE"]
    if rules:
        terms.append(f"rule IN ({', '.join(map(sql_text, rules))})")
    if severities:
        terms.append(f"severity IN ({', '.join(map(sql_text, severities))})")
    if key.strip():
        terms.append(f"strpos(key, {sql_text(key.strip())}) > 0")
    return " AND ".join(terms)


def since(range_name: str) -> datetime | None:
    """Start of the chosen time range (now floored to 10 s, so refreshes share a cache)."""
    span = RANGES[range_name]
    if span is None:
        return None
    now = datetime.now(UTC)
    return now.replace(second=now.second - now.second % 10, microsecond=0) - span
