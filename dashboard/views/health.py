"""Health: green, or red with each reason in words; engine and ingest up or down,
per-stream recent late, duplicate and conflicting readings, clocks, watermarks and lag,
quarantined payloads, and the version of every Delta table."""

from __future__ import annotations

import time
from typing import Any, Literal

import pandas as pd
import streamlit as st

from dashboard.data import (
    age_seconds,
    delta_tables,
    health,
    ingest_parts,
    lakehouse,
    query,
    table_names,
    table_version,
)
from dashboard.settings import health_limits, settings
from dashboard.ui import empty, panel
from lookout.health import ARRIVALS, Problem, problems

QUARANTINE_ROWS = 50
NO_READINGS = "no readings yet"


def status(record: dict[str, Any] | None, down_after_s: float) -> tuple[str, str]:
    """("up" | "down" | "never started", how long ago it last reported)."""
    age = age_seconds(record)
    if age is None:
        return "never started", "no health file"
    return ("up" if age <= down_after_s else "down"), f"last report {age:.0f} s ago"


def judged() -> list[Problem]:
    """Why health is red now (`lookout.health.problems`; empty: it is not)."""
    names = ["engine", *ingest_parts()]
    return problems(
        {name: health(name) for name in names},
        health_limits(),
        settings().down_after_seconds,
        int(time.time() * 1000),
    )


@panel
def verdict() -> None:
    """Health red with every reason, or green with what that means."""
    found = judged()
    if found:
        st.error("**Health: red**\n\n" + "\n".join(f"- {p.text}" for p in found))
    elif health("engine") is not None:
        limits = health_limits()
        st.success(
            f"**Health: green.** No part is down or failing; over the last "
            f"{limits.window_seconds:g} s no stream's late, duplicate or conflicting "
            f"readings, nor quarantined payloads, ran above their limits, and no stream's "
            f"clock stood still for {limits.clock_stall_seconds:g} s while readings arrived."
        )


@panel
def parts() -> None:
    """One metric per running part, from the age of its health file."""
    down_after_s = settings().down_after_seconds
    names = ["engine", *ingest_parts()]
    if len(names) == 1:
        names.append("ingest-0")  # show ingest as missing rather than leave it out
    for column, name in zip(st.columns(len(names)), names, strict=True):
        record = health(name)
        state, detail = status(record, down_after_s)
        colour: Literal["green", "red", "gray"] = (
            "green" if state == "up" else "red" if state == "down" else "gray"
        )
        column.metric(name, state, detail, delta_color=colour, delta_arrow="off", border=True)
        if name.startswith("ingest") and record and state == "up":
            column.caption(
                f"{record.get('readings_per_s', 0):,.0f} readings/s · "
                f"{record.get('quarantined', 0):,} quarantined · "
                f"broker {'connected' if record.get('connected') else 'DISCONNECTED'}"
            )
    if all(health(n) is None for n in names):
        empty("No part has reported yet.")


@panel
def engine_queries() -> None:
    """The engine's streaming query: its rates, where a batch's time goes, how many keys
    the rules hold state for, and the engine's memory (watermarks are per stream,
    below)."""
    record = health("engine")
    if not record or not record.get("queries"):
        st.caption("The engine has not reported any query yet (`lookout engine`).")
        return
    frame = pd.DataFrame(record["queries"])
    if "keys" in frame:
        frame["live_keys"] = [sum((keys or {}).values()) for keys in frame["keys"]]
    columns = [
        "name",
        "active",
        "batches",
        "input_rows_per_s",
        "processed_rows_per_s",
        "batch_ms",
        "evaluate_ms",
        "commit_ms",
        "restore_ms",
        "live_keys",
    ]
    st.dataframe(frame[[c for c in columns if c in frame]], hide_index=True, width="stretch")
    if memory := record.get("memory"):
        st.caption(
            "Resident memory: "
            + ", ".join(
                f"{part.replace('_', ' ')} {size / 2**20:,.0f} MB" for part, size in memory.items()
            )
        )


def _stream_row(table: str, late: dict[str, int]) -> dict[str, Any] | None:
    stream = table.removeprefix("readings_")
    stats = query(f"SELECT count(*) AS readings, max(ts) AS newest_event FROM {table}", table)
    if stats is None:
        return None
    newest = stats.at[0, "newest_event"]
    lag = (
        (pd.Timestamp(time.time(), unit="s", tz="UTC") - newest).total_seconds()
        if pd.notna(newest)
        else None
    )
    return {
        "stream": stream,
        "readings": int(stats.at[0, "readings"]),
        "newest event": newest,
        "event lag (s)": lag,
        "late (total)": late.get(stream, 0),
    }


def engine_streams() -> dict[str, dict[str, Any]]:
    """The engine's view of each source stream (watermark, lag, counts), by name."""
    record = health("engine") or {}
    return {s["stream"]: s for s in record.get("streams") or [] if "stream" in s}


def _cap(cap: int | None) -> str | None:
    """A stream's cap on live keys as shown (0: none)."""
    return None if cap is None else "none" if cap == 0 else f"{cap:,}"


def _ms_time(ms: int | None) -> pd.Timestamp | None:
    return None if ms is None else pd.Timestamp(ms, unit="ms", tz="UTC")


# The recent figures first, so they show without scrolling on a 1280 px screen.
STREAM_COLUMNS = [
    "stream",
    "status",
    "arrived/s",
    "late",
    "duplicates",
    "conflicts",
    "capped",
    "clock still (s)",
    "event lag (s)",
    "readings",
    "late (total)",
    "duplicates (total)",
    "conflicts (total)",
    "capped (total)",
    "live keys",
    "key cap",
    "newest event",
    "watermark",
    "engine lag (s)",
]


def _engine_figures(seen: dict[str, Any], window_s: float) -> dict[str, Any]:
    """A stream's columns from the engine's record: recent counts, rate, clock, totals."""
    recent = seen.get("recent") or {}
    arrived = sum(recent.get(what, 0) for what in ARRIVALS)
    lag_ms, still_ms = seen.get("lag_ms"), seen.get("clock_still_ms")
    return {
        "arrived/s": arrived / window_s if recent and window_s else None,
        **{what: recent.get(what) for what in ("late", "duplicates", "conflicts", "capped")},
        "clock still (s)": None if still_ms is None else still_ms / 1000,
        "duplicates (total)": seen.get("duplicates"),
        "conflicts (total)": seen.get("conflicts"),
        "capped (total)": seen.get("capped"),
        "live keys": seen.get("live_keys"),
        "key cap": _cap(seen.get("max_live_keys")),
        "watermark": _ms_time(seen.get("watermark_ms")),
        "engine lag (s)": None if lag_ms is None else lag_ms / 1000,
    }


@panel
def streams() -> None:
    """Per source stream: whether it is red and why in a word; over the last window its
    arrival rate, late readings, duplicates and conflicts, and how long its clock has
    stood still; then totals, newest event, the engine's watermark and lag."""
    tables = table_names("readings_")
    if not tables:
        empty("No readings table yet.")
        return
    late: dict[str, int] = {}
    if table_version("late_readings") is not None:
        counts = query(
            "SELECT stream, count(*) AS n FROM late_readings GROUP BY stream", "late_readings"
        )
        late = {} if counts is None else dict(zip(counts["stream"], counts["n"], strict=True))
    engine = engine_streams()
    window_s = (health("engine") or {}).get("window_ms", 0) / 1000
    red: dict[str, list[str]] = {}
    for problem in judged():
        red.setdefault(problem.subject, []).append(problem.what)
    rows = []
    for table in tables:
        row = _stream_row(table, late)
        if row is None:
            continue
        reasons = red.get(f"stream {row['stream']}")
        figures = _engine_figures(engine.get(row["stream"], {}), window_s)
        if reasons:
            row["status"] = "red: " + ", ".join(reasons)
        elif row["readings"] == 0:
            # No reading, no event time: a watermark reported for the stream is no
            # reading's (1970 at worst), and a lag from it would read as decades.
            row["status"] = NO_READINGS
            figures |= {"watermark": None, "engine lag (s)": None}
        else:
            row["status"] = "ok"
        rows.append(row | figures)
    seconds = st.column_config.NumberColumn(format="%.1f")
    st.dataframe(
        pd.DataFrame(rows, columns=STREAM_COLUMNS),
        hide_index=True,
        width="stretch",
        column_config={
            "arrived/s": seconds,
            "clock still (s)": seconds,
            "event lag (s)": seconds,
            "engine lag (s)": seconds,
        },
    )
    st.caption(
        "arrived/s, late, duplicates, conflicts: readings that reached the engine in the "
        f"last {health_limits().window_seconds:g} s (late: behind the slack; "
        "duplicates: an id and values seen before, dropped; conflicts: an id seen before "
        "with other values, kept in `conflicts`; capped: readings of keys new to a rule "
        "that holds state for its stream's max_live_keys, quarantined). live keys: the "
        "most keys a rule reading the stream holds state for (idle keys are evicted); key "
        "cap: max_live_keys. clock still: how long the stream's "
        "newest event time has not moved. event lag: wall clock minus the newest event "
        "time in the table. Totals: late from `late_readings`, duplicates and conflicts "
        "since the engine started; watermark and engine lag from the engine's last report."
    )


@panel
def quarantine() -> None:
    """How many payloads were quarantined, by reason, and the latest ones."""
    if table_version("quarantine") is None:
        st.caption("No quarantine table yet: nothing has been rejected.")
        return
    total = query("SELECT count(*) AS n FROM quarantine", "quarantine")
    assert total is not None
    count = int(total.at[0, "n"])
    st.metric("quarantined payloads", f"{count:,}")
    if count == 0:
        return
    recent = query(
        "SELECT received_at, topic, reason, "
        "coalesce(payload, concat('(binary, base64) ', payload_b64)) AS payload "
        f"FROM quarantine ORDER BY received_at DESC LIMIT {QUARANTINE_ROWS}",
        "quarantine",
    )
    st.dataframe(recent, hide_index=True, width="stretch")


def with_compactions(frame: pd.DataFrame, maintenance: dict[str, Any]) -> pd.DataFrame:
    """The tables (one row each) with what the engine's health record says of their
    maintenance: the last compaction (when, how many small files it replaced), the
    replaced files and the log files no reader needs that it deleted since the engine
    started, and the last error."""

    def name(path: str) -> str:
        return path.rstrip("/").rsplit("/", 1)[-1]

    last = {name(c["table"]): c for c in maintenance.get("compactions") or []}
    errors = {name(path): error for path, error in (maintenance.get("errors") or {}).items()}
    deleted = {name(path): n for path, n in (maintenance.get("vacuumed") or {}).items()}
    log_deleted = {name(path): n for path, n in (maintenance.get("log_cleaned") or {}).items()}
    return frame.assign(
        **{
            "last compacted": [
                _ms_time(last[t]["at_ms"]) if t in last else None for t in frame["table"]
            ],
            "files compacted": [
                last[t]["files_removed"] if t in last else None for t in frame["table"]
            ],
            "files deleted": [deleted.get(t) for t in frame["table"]],
            "log files deleted": [log_deleted.get(t) for t in frame["table"]],
            "maintenance error": [errors.get(t) for t in frame["table"]],
        }
    )


@panel
def tables() -> None:
    """Every Delta table with its current version and its last compaction."""
    frame = delta_tables()
    if frame.empty:
        st.caption(f"No Delta table under `{lakehouse()}` yet.")
        return
    maintenance = (health("engine") or {}).get("maintenance") or {}
    st.dataframe(with_compactions(frame, maintenance), hide_index=True, width="stretch")


def live() -> None:
    """All health panels, refreshed together."""
    verdict()
    parts()
    st.subheader("Engine queries")
    engine_queries()
    st.subheader("Streams")
    streams()
    left, right = st.columns([3, 2])
    with left:
        st.subheader("Quarantine")
        quarantine()
    with right:
        st.subheader("Delta tables")
        tables()


def main() -> None:
    """The page: what "down" means here, then the live panels."""
    config = settings()
    st.caption(
        f"Lakehouse: `{lakehouse()}`; a part is down when its health file is older than "
        f"{config.down_after_seconds:g} s."
    )
    st.fragment(run_every=config.refresh_seconds)(live)()


panel(main)()
