"""`rules explain NAME`: a rule's streams, keys, slack, windows and outputs in words,
with the window's scope at a few sample instants."""

from __future__ import annotations

from datetime import UTC, datetime

from engine.core.patterns import compile_pattern
from rules.language import ast
from rules.language.checker import Catalog, QueryInfo, Relation, SelectInfo, window_key
from rules.language.compiler import plan_pattern
from rules.language.recognize import pattern_variables

# Sample instants are shown from this origin: an hour after a midnight, so sample
# frames reaching back stay on one day.
_ORIGIN_MS = int(datetime(2026, 1, 1, 1, tzinfo=UTC).timestamp() * 1000)


def slack_words(stream: Relation) -> str:
    """`slack 2 seconds`, or `slack 2 seconds per source (idle after 1 minute)`."""
    words = f"slack {duration_words(stream.slack_ms)}"
    if stream.source_idle_ms is not None:
        words += f" per source (idle after {duration_words(stream.source_idle_ms)})"
    return words


def duration_words(ms: int) -> str:
    """`90000` -> `1 minute 30 seconds`."""
    parts = []
    for unit, size in (
        ("day", 86_400_000),
        ("hour", 3_600_000),
        ("minute", 60_000),
        ("second", 1_000),
        ("millisecond", 1),
    ):
        amount, ms = divmod(ms, size)
        if amount:
            parts.append(f"{amount} {unit}{'s' if amount != 1 else ''}")
    return " ".join(parts) or "0 seconds"


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%m-%d %H:%M:%S")


def _stamp(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _base_streams(catalog: Catalog, name: str) -> list[Relation]:
    """The source streams (with SOURCE topics) a stream is derived from."""
    rel = catalog.relations.get(name)
    if rel is None:
        return []
    if isinstance(rel.statement, ast.CreateStream):
        return [rel]
    info = next(q for q in catalog.queries if q.statement is rel.statement)
    return [
        b for sel in info.selects if sel.stream for b in _base_streams(catalog, sel.stream.name)
    ]


def window_lines(spec: ast.WindowSpec, relation: bool = False) -> list[str]:
    """The window in words, then its scope at sample instants; `relation`: the query
    reads it through ISTREAM / DSTREAM / RSTREAM (CQL's relation at every instant)."""
    keys = ", ".join(p.name for p in spec.partition)
    per = f" per {keys}" if keys else ""
    t0 = _ORIGIN_MS
    lines: list[str] = []
    if spec.kind == "range" and spec.origin == "from" and relation and not spec.slide_ms:
        assert spec.range_ms is not None
        r, lag = spec.range_ms, spec.lag_ms or 0
        if lag:
            lines.append(
                f"CQL time-based sliding window delayed by {duration_words(lag)}: at every "
                f"instant t, the tuples in [t - {duration_words(lag)} - {duration_words(r)}, "
                f"t - {duration_words(lag)}]"
            )
        else:
            lines.append(
                f"CQL time-based sliding window: at every instant t, the tuples in "
                f"[t - {duration_words(r)}, t]; the relation changes when a tuple arrives "
                f"and {duration_words(r)} + 1 ms after it, when it leaves"
            )
        lines.append(
            f"  a tuple at {_clock(t0)} is in the relation from {_clock(t0 + lag)} "
            f"to {_clock(t0 + lag + r)} inclusive"
        )
        return lines
    if spec.kind == "range" and spec.origin == "from":
        assert spec.range_ms is not None
        slide = spec.slide_ms or spec.range_ms
        shape = "tumbling" if slide >= spec.range_ms else "hopping"
        lines.append(
            f"domain-driven {shape} window: extents of "
            f"{duration_words(spec.range_ms)} every {duration_words(slide)}, "
            "aligned to the epoch; each extent's result is emitted once, when the "
            "watermark passes its end"
        )
        base = t0 - t0 % slide  # extents end at multiples of the slide from the epoch
        for k in range(1, 4):
            end = base + k * slide
            lines.append(
                f"  extent [{_clock(end - spec.range_ms)}, {_clock(end)}) "
                f"is emitted when the watermark reaches {_clock(end)}"
            )
        return lines
    if spec.kind == "rows" and spec.rows is None:
        lines.append(
            f"count-based landmark window{per}: each tuple with every tuple before it "
            "(ties in time ordered by source and sequence number; later ties excluded)"
        )
    elif spec.kind == "rows":
        lines.append(f"count-based window{per}: each tuple with the {spec.rows} before it")
    elif spec.kind == "partition_rows":
        lines.append(f"partitioned window: the last {spec.rows} tuples{per}")
    elif spec.kind == "now":
        lines.append("NOW window: the tuples of the current instant only")
    elif spec.kind == "unbounded":
        if spec.reset_ms:
            lines.append(
                f"landmark window{per}: every tuple since the start of the current "
                f"{duration_words(spec.reset_ms)} period (periods aligned to the "
                "epoch, so 1 DAY resets at midnight UTC)"
            )
        else:
            lines.append(f"landmark window{per}: every tuple since the stream began")
    elif spec.kind == "since":
        assert spec.lower_ms is not None
        lines.append(
            f"lower-bounded landmark window{per}: tuples from "
            f"{_stamp(spec.lower_ms)} up to the current one"
        )
    elif spec.kind == "until":
        assert spec.upper_ms is not None
        lines.append(
            f"upper-bounded landmark window{per}: tuples up to the current one, "
            f"and none after {_stamp(spec.upper_ms)}"
        )
    elif spec.kind == "band":
        assert spec.lower_ms is not None and spec.upper_ms is not None
        lines.append(
            f"fixed-band window{per}: tuples in [{_stamp(spec.lower_ms)}, {_stamp(spec.upper_ms)}]"
        )
    else:  # time-based sliding, data-driven
        assert spec.range_ms is not None
        lag = spec.lag_ms or 0
        lag_words = f", delayed by {duration_words(lag)}" if lag else ""
        lines.append(
            f"time-based window{per}: for a tuple at t, the tuples in "
            f"[t - {duration_words(spec.range_ms)}, t]{lag_words} "
            "(tuples with equal timestamps included)"
        )
        for k in (1, 2, 4):
            t = t0 + k * spec.range_ms // 2
            lines.append(
                f"  a tuple at {_clock(t)} sees [{_clock(t - lag - spec.range_ms)}, "
                f"{_clock(t - lag)}]"
            )
        if spec.active_expiration:
            lines.append(
                f"  active expiration: a tuple at t expires at t + "
                f"{duration_words(spec.range_ms)} (at {_clock(t0 + spec.range_ms)} "
                f"for one at {_clock(t0)}), and may emit then"
            )
    if spec.slide_rows:
        lines.append(
            f"  SLIDE {spec.slide_rows}: only the last tuple of every "
            f"{spec.slide_rows} rows is output"
        )
    if spec.slide_ms:
        lines.append(
            f"  SLIDE {duration_words(spec.slide_ms)}: only the last tuple of each "
            f"slot is output, e.g. [{_clock(t0)}, {_clock(t0 + spec.slide_ms)}), "
            f"[{_clock(t0 + spec.slide_ms)}, {_clock(t0 + 2 * spec.slide_ms)})"
        )
    return lines


_R2S_WORDS = {
    "ISTREAM": "a row is streamed when its tuple enters the window (unless an equal row "
    "leaves at that instant)",
    "DSTREAM": "a row is streamed when its tuple leaves the window (unless an equal row "
    "enters at that instant)",
    "RSTREAM": "the whole relation is streamed at every instant where a tuple enters or "
    "leaves the window",
}


def pattern_lines(match: ast.MatchRecognize) -> list[str]:
    """MATCH_RECOGNIZE in words: its variables, its automaton's states, its time bound."""
    variables = list(dict.fromkeys(v.name for v in pattern_variables(match.pattern)))
    defined = {var.name for var, _ in match.defines}
    within = match.within_ms
    resume = "past its last row" if match.skip == "PAST LAST ROW" else "at the row after its first"
    lines = [
        "MATCH_RECOGNIZE (SQL:2016 row pattern recognition), one row per match; after a "
        f"match the search resumes {resume}",
        "  variables: "
        + ", ".join(v if v in defined else f"{v} (no DEFINE: any row)" for v in variables),
        "  time bound: "
        + (
            f"a match's last row is at most {duration_words(within)} after its first"
            if within is not None
            else "none (the pattern bounds a match's rows)"
        ),
        "  automaton (states tried in preferment order):",
    ]
    nfa = compile_pattern(plan_pattern(match.pattern))
    lines += [f"    {line}" for line in nfa.describe()]
    lines.append(f"    starts at state {nfa.start}")
    return lines


def _keys_and_window(sel: SelectInfo) -> tuple[list[str], ast.WindowSpec | None]:
    """A SELECT's key columns (GROUP BY, else the PARTITION BY all its windows share)
    and its window (the FROM window, else its first OVER window)."""
    keys = [k.name for k in sel.select.group_by if isinstance(k, ast.Column)]
    overs = [u.call.over for u in sel.aggregates if u.call.over is not None]
    spec = sel.window or (overs[0] if overs else None)
    if spec is not None and not keys:
        keys = [p.name for p in spec.partition]
        for other in overs[1:]:
            keys = [c for c in keys if c in {p.name for p in other.partition}]
    return keys, spec


def _upstream_windows(
    catalog: Catalog, sel: SelectInfo
) -> list[tuple[str, list[str], ast.WindowSpec, bool]]:
    """The windows of the derived streams ``sel`` reads, nearest first, up to the source
    stream (or a UNION ALL, whose branches differ): (stream, keys, window, read as a
    relation) per windowed one."""
    found: list[tuple[str, list[str], ast.WindowSpec, bool]] = []
    seen: set[str] = set()
    stream = sel.stream
    while stream is not None and stream.name not in seen:
        seen.add(stream.name)
        info = next((q for q in catalog.queries if q.statement.name.name == stream.name), None)
        if info is None or len(info.selects) > 1:
            break
        up = info.selects[0]
        keys, spec = _keys_and_window(up)
        if spec is not None:
            found.append((stream.name, keys, spec, up.select.r2s is not None))
        stream = up.stream
    return found


def _select_lines(catalog: Catalog, sel: SelectInfo) -> list[str]:
    lines: list[str] = []
    if sel.stream is not None:
        lines.append(f"reads stream: {sel.stream.name}")
        for base in _base_streams(catalog, sel.stream.name):
            lines.append(
                f"  from source {base.name} (topic '{base.topic}', ordered by "
                f"{base.timestamp}, {slack_words(base)})"
            )
    for table in sel.tables:
        lines.append(f"joins table: {table.name}")
    keys, spec = _keys_and_window(sel)
    if sel.match is not None:
        keys = [p.name for p in sel.match.partition]
        lines.append(f"keys: {', '.join(keys) if keys else '(none: one group)'}")
        return lines + pattern_lines(sel.match)
    overs = [u.call.over for u in sel.aggregates if u.call.over is not None]
    distinct = list({window_key(o): o for o in overs}.values())
    upstream = _upstream_windows(catalog, sel)
    # Without a window of its own, a query is keyed by the nearest windowed stream it
    # reads (an alert over `station_speed` is per station).
    if spec is None and upstream and not keys:
        keys = upstream[0][1]
    lines.append(f"keys: {', '.join(keys) if keys else '(none: one group)'}")
    if spec is None and upstream:
        lines.append("window: none here (one output per input tuple)")
    elif sel.window is None and len(distinct) > 1:
        for one in distinct:
            calls = [
                u.call.name
                for u in sel.aggregates
                if u.call.over is not None and window_key(u.call.over) == window_key(one)
            ]
            lines.append(f"window of {', '.join(calls)}: " + "\n".join(window_lines(one, False)))
    elif spec is None:
        lines.append("window: none (one output per input tuple)")
    else:
        relation = sel.select.r2s is not None
        lines.append("window: " + "\n".join(window_lines(spec, relation)))
    for name, _, up_spec, up_relation in upstream:
        lines.append(f"upstream window in {name}: " + "\n".join(window_lines(up_spec, up_relation)))
    r2s = sel.select.r2s
    raw = not sel.aggregates and not sel.select.group_by
    if r2s is not None and sel.window is not None and raw:
        lines.append(f"relation to stream: {r2s} of the window's tuples, {_R2S_WORDS[r2s]}")
    if sel.aggregates:
        lines.append(
            "aggregates: "
            + ", ".join(f"{u.call.name}({'*' if u.call.star else '...'})" for u in sel.aggregates)
        )
    return lines


def _incident_line(stmt: ast.CreateAlert, first: SelectInfo) -> str:
    """How the alert's incidents open and resolve (docs/rules.md, Incidents)."""
    clauses = stmt.incidents
    source = first.stream.name if first.stream else "its input"
    if clauses.resolve_after_ms is not None:
        resolve = f"{duration_words(clauses.resolve_after_ms)} after the key's last report"
    elif clauses.resolve_when is not None:
        resolve = f"at the key's first row of {source} where RESOLVE WHEN holds"
    else:
        resolve = f"at the key's first row of {source} where WHERE does not hold"
    line = "incidents: per key, open "
    line += (
        f"once its condition held for {duration_words(clauses.pending_ms)}"
        if clauses.pending_ms
        else "at its first report"
    )
    line += f", resolved {resolve}"
    if clauses.keep_firing_ms:
        line += f", kept open {duration_words(clauses.keep_firing_ms)} longer"
    return line


def explain(catalog: Catalog, name: str) -> str | None:
    """The explanation of the stream, alert, table or aggregate `name` (None if unknown)."""
    info: QueryInfo | None = next(
        (q for q in catalog.queries if q.statement.name.name == name), None
    )
    if info is not None:
        stmt = info.statement
        kind = "alert" if isinstance(stmt, ast.CreateAlert) else "derived stream"
        lines = [f"{name}: {kind} ({stmt.file}:{stmt.pos.line})"]
        if isinstance(stmt, ast.CreateAlert):
            lines.append(f"severity: {stmt.severity}")
            if stmt.message:
                lines.append(f"message: {stmt.message}")
        for i, sel in enumerate(info.selects):
            if len(info.selects) > 1:
                lines.append(f"UNION ALL branch {i + 1}:")
            lines.extend(_select_lines(catalog, sel))
        first = info.selects[0]
        lines.append("outputs: " + ", ".join(f"{n} {t}" for n, t, _ in first.outputs))
        lines.append(f"event time: {first.timestamp or 'carried by the engine'}")
        if isinstance(stmt, ast.CreateAlert):
            lines.append(_incident_line(stmt, first))
        return "\n".join(lines)
    rel = catalog.relations.get(name)
    if rel is not None:
        cols = ", ".join(f"{n} {t}" for n, t in rel.columns.items())
        if rel.kind == "table":
            stmt_t = rel.statement
            assert isinstance(stmt_t, ast.CreateTable)
            return f"{name}: reference table from {stmt_t.format} '{stmt_t.path}'\ncolumns: {cols}"
        return (
            f"{name}: source stream, topic '{rel.topic}'\ncolumns: {cols}\n"
            f"ordered by {rel.timestamp}, {slack_words(rel)}"
        )
    uda = catalog.aggregates.get(name.lower())
    if uda is not None:
        return (
            f"{uda.name}: Python aggregate {uda.statement.target}"
            f"({', '.join(uda.params)}) -> {uda.returns}"
            f"{', ALGEBRAIC' if uda.algebraic else ''}"
            f"{', blocking' if uda.blocking else ', non-blocking'}"
        )
    return None
