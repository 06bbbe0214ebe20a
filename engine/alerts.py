"""Alert and incident records: deterministic ids and messages (pure; shared by the live
job and replay).

An alert's id is a hash of what it is — rule, key, event time, the row the rule
selected and its place in the emitting evaluator's output — never of when or where it
was computed, so re-running the same input, or restarting the job mid-stream, gives the
same ids. An incident's id is a hash of its rule, key and opening instant (a key has
one incident open at a time).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from engine.core.incidents import IncidentUpdate
from engine.core.pipeline import stage_sinks
from engine.core.plan import Plan
from engine.tables import to_timestamp

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class AlertSpec:
    """What `CREATE ALERT name SEVERITY s MESSAGE 'text'` declares besides its query."""

    name: str
    severity: str
    message: str | None = None


def canonical_json(row: Mapping[str, Any]) -> str:
    """The row as JSON with sorted keys: the same row always gives the same text."""
    return orjson.dumps(dict(row), option=orjson.OPT_SORT_KEYS).decode()


def alert_id(
    rule: str, key: str, event_ms: int, row: Mapping[str, Any], source: str, seq: int
) -> str:
    """A stable id for one alert (hex, 24 characters).

    `source` and `seq` are the output's tie order (the evaluator that emitted it and its
    emission count): two outputs with equal rows — two vehicles speeding alike in one
    millisecond — are two alerts, and a re-run still gives each the same id.
    """
    text = f"{rule}\x1f{key}\x1f{event_ms}\x1f{canonical_json(row)}\x1f{source}\x1f{seq}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "NULL" if value is None else str(value)


def render_message(spec: AlertSpec, row: Mapping[str, Any]) -> str:
    """Fill `{column}` placeholders from the row (no format-string evaluation)."""
    if not spec.message:
        return f"{spec.name}: " + ", ".join(f"{k}={_show(v)}" for k, v in row.items())
    return _PLACEHOLDER.sub(
        lambda m: _show(row[m.group(1)]) if m.group(1) in row else m.group(0), spec.message
    )


def format_key(names: tuple[str, ...], values: tuple[Any, ...]) -> str:
    """The partition key as text, e.g. `station=3` (empty for an unkeyed rule)."""
    return ", ".join(f"{n}={_show(v)}" for n, v in zip(names, values, strict=True))


def iso_utc(ms: int) -> str:
    """Epoch ms as ISO-8601 UTC text with milliseconds (the replay output format)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def alert_rows(spec: AlertSpec, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the `alerts` table for one alert's outputs (ids from content only)."""
    detected = datetime.now(tz=UTC)
    rows = []
    for r in records:
        row = orjson.loads(r["row"])
        rows.append(
            {
                "alert_id": alert_id(spec.name, r["key"], r["ts"], row, r["source"], r["seq"]),
                "rule": spec.name,
                "severity": spec.severity,
                "key": r["key"],
                "event_time": to_timestamp(r["ts"]),
                "detected_at": detected,
                "message": render_message(spec, row),
                "payload": r["row"],
            }
        )
    return rows


def alert_keys(plan: Plan) -> dict[str, tuple[str, ...]]:
    """Each alert's key columns: those of the stage that emits it (the first, for a
    UNION ALL)."""
    keys: dict[str, tuple[str, ...]] = {}
    for stage in plan.stages():
        for sink in stage_sinks(stage):
            keys.setdefault(sink, stage.key)
    return keys


def incident_id(rule: str, key: str, opened_ms: int) -> str:
    """A stable id for one incident (hex, 24 characters)."""
    return hashlib.sha256(f"{rule}\x1f{key}\x1f{opened_ms}".encode()).hexdigest()[:24]


def incident_record(
    spec: AlertSpec, key_names: tuple[str, ...], update: IncidentUpdate
) -> dict[str, Any]:
    """An incident's state as the `incidents` table and replay keep it (times in epoch
    ms; the operators' columns left out)."""
    key = format_key(key_names, tuple(orjson.loads(update.key)))
    return {
        "incident_id": incident_id(spec.name, key, update.opened_at),
        "rule": spec.name,
        "key": key,
        "severity": spec.severity,
        "message": render_message(spec, update.row),
        "opened_at": update.opened_at,
        "last_report_at": update.last_report_at,
        "resolved_at": update.resolved_at,
        "reports": update.reports,
    }
