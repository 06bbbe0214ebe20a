"""Preview a rule file on stored history: what its alerts would have raised.

The rule set is the library plus the edited file, parsed, checked (the same sandbox as
saving: what a rule may import or read) and compiled like `lookout rules check`. The
rules under preview are the alerts the edited file defines; only the stages they need
are run, over the readings of the source streams they need, read from the lakehouse's
`readings_<stream>` Delta tables with a time predicate (DataFusion skips the files
whose statistics lie outside it).

Evaluation is the live engine's :class:`~engine.core.pipeline.Pipeline`, fed the stored
readings in event-time order and then a heartbeat that brings each stream to its stored
watermark (the highest `arrival_watermark` of its readings): the preview ends where the
live engine's knowledge ended, not at +infinity, so no window closes and no expiration
fires just because the history ends. State starts empty at the start of the history: a
window reaching back before it sees only the readings inside it.

`lookout rules preview` and the dashboard's Rules editor both call :func:`preview`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from engine.alerts import AlertSpec, alert_keys, format_key, incident_record, render_message
from engine.core.incidents import IncidentUpdate
from engine.core.pipeline import BatchResult, Pipeline
from engine.core.plan import Plan
from engine.core.runners import emitted_outputs
from engine.core.subplan import needed_plan
from engine.history import HistoryError, StreamHistory, event_time_slices, heartbeat, read_history
from lookout.config import S3Config
from lookout.storage import DEFAULT_S3
from rules.language import ast
from rules.language.access import DEFAULT_POLICY, RulePolicy
from rules.language.loader import RuleCheckError, analyse

SLICE_MS = 5 * 60_000
"""Event time fed to the pipeline per batch: bounds what a batch holds at once."""


class PreviewError(Exception):
    """The preview cannot run (no alert to preview, no readings table); the message
    says why."""


@dataclass(frozen=True)
class PreviewAlert:
    """One alert the rule would have raised."""

    rule: str
    key: str
    ts: int
    message: str
    row: dict[str, Any]


@dataclass
class Preview:
    """What the alerts of the edited file would have raised over ``[start, end)``."""

    rules: tuple[str, ...]
    """The alerts under preview, in the file's order."""
    start: int
    end: int
    """The history's first instant and its end (the latest stored watermark), epoch ms."""
    streams: list[StreamHistory]
    alerts: list[PreviewAlert] = field(default_factory=list)
    """By event time, then rule and key."""
    incidents: list[dict[str, Any]] = field(default_factory=list)
    """Each incident in its state at the end (``resolved_at`` None: still firing), as
    the ``incidents`` table holds it (times in epoch ms)."""
    read_s: float = 0.0
    evaluate_s: float = 0.0

    def summary(self) -> list[dict[str, Any]]:
        """Per rule under preview and key: its alerts, incidents and incidents still
        firing at the end; a rule that raised nothing is one row with an empty key."""
        rows: dict[tuple[str, str], dict[str, Any]] = {}

        def row(rule: str, key: str) -> dict[str, Any]:
            zero = {"rule": rule, "key": key, "alerts": 0, "incidents": 0, "firing": 0}
            return rows.setdefault((rule, key), zero)

        for alert in self.alerts:
            row(alert.rule, alert.key)["alerts"] += 1
        for incident in self.incidents:
            counts = row(incident["rule"], incident["key"])
            counts["incidents"] += 1
            counts["firing"] += incident["resolved_at"] is None
        for rule in self.rules:
            if not any(r == rule for r, _ in rows):
                row(rule, "")
        order = {rule: i for i, rule in enumerate(self.rules)}
        return [rows[k] for k in sorted(rows, key=lambda k: (order[k[0]], k[1]))]


def parse_duration(text: str) -> int:
    """``90s``, ``15m``, ``1h``, ``2d`` (or a bare number of seconds) as milliseconds."""
    units = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    text = text.strip().lower()
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 15m, 1h, 2d)") from None
    if value <= 0:
        raise ValueError(f"{text!r}: a duration must be positive")
    return int(value * units[unit])


def preview(
    rule_paths: Sequence[str | Path],
    file: Path,
    text: str,
    lakehouse: str,
    since_ms: int,
    policy: RulePolicy = DEFAULT_POLICY,
    s3: S3Config = DEFAULT_S3,
) -> Preview:
    """The alerts and incidents `file` holding `text` would have raised, with the rules
    at `rule_paths` beside it, over the last `since_ms` of the history stored in
    `lakehouse` (ending at its watermark). RuleCheckError when the rule set has
    errors (nothing is evaluated then); PreviewError when there is nothing to preview."""
    analysis = analyse(rule_paths, policy, {file: text})
    if analysis.errors or analysis.plan is None:
        raise RuleCheckError(analysis.errors)
    mine = file.resolve()
    statements = [s for s in analysis.statements if Path(s.file).resolve() == mine]
    specs = {
        s.name.name: AlertSpec(s.name.name, str(s.severity), s.message)
        for s in statements
        if isinstance(s, ast.CreateAlert)
    }
    if not specs:
        raise PreviewError(f"{file.name} defines no alert (CREATE ALERT) to preview")
    plan = needed_plan(analysis.plan, specs)
    began = time.perf_counter()
    try:
        history = read_history(plan, lakehouse, since_ms, s3)
    except HistoryError as err:
        raise PreviewError(f"nothing to preview on: {err}") from None
    read_s = time.perf_counter() - began
    began = time.perf_counter()
    marks = {s.stream: s.watermark for s in history.streams}
    alerts, incidents = evaluate(plan, specs, history.tables, marks)
    return Preview(
        tuple(specs),
        history.start,
        history.end,
        history.streams,
        alerts,
        incidents,
        read_s,
        time.perf_counter() - began,
    )


def evaluate(
    plan: Plan,
    specs: dict[str, AlertSpec],
    tables: dict[str, pa.Table],
    watermarks: dict[str, int | None],
) -> tuple[list[PreviewAlert], list[dict[str, Any]]]:
    """Run `plan` over the arrival `tables` (sorted by event time) a slice of event
    time at a time, then bring each stream to its stored watermark with a heartbeat
    (never past it): the alerts of `specs` by event time, and their incidents as
    records (:func:`~engine.alerts.incident_record`) by opening time."""
    pipeline = Pipeline(plan)
    keys = alert_keys(plan)
    alerts: list[tuple[int, str, str, int, PreviewAlert]] = []
    incidents: dict[tuple[str, str, int], IncidentUpdate] = {}

    def collect(step: BatchResult) -> None:
        for update in step.incidents:
            incidents[(update.alert, update.key, update.opened_at)] = update
        for emitted in step.outputs:
            if emitted.sink not in specs:
                continue
            for values, out in emitted_outputs(emitted):
                key = format_key(keys[emitted.sink], values)
                message = render_message(specs[out.sink], out.row)
                alerts.append(
                    (
                        out.ts,
                        out.sink,
                        key,
                        out.seq,
                        PreviewAlert(out.sink, key, out.ts, message, out.row),
                    )
                )

    for batch in event_time_slices(plan, tables, SLICE_MS):
        collect(pipeline.process(batch))
    # A heartbeat at watermark + slack moves the stream's clock to exactly its watermark.
    beats = {
        name: heartbeat(schema, mark + schema.slack_ms)
        for name, schema in pipeline.sources.items()
        if (mark := watermarks.get(name)) is not None
    }
    collect(pipeline.process(beats))
    alerts.sort(key=lambda a: a[:4])
    records = [
        incident_record(specs[u.alert], keys[u.alert], u)
        for k, u in sorted(incidents.items(), key=lambda item: (item[0][2], item[0][0], item[0][1]))
        if u.alert in specs
    ]
    return [a[4] for a in alerts], records
