"""Incidents against a brute force over the alert's input rows.

Each rule reads readings (k, v, ts): a row with v > 0 is a report of the alert; the
other rows are what resolves it, per form:

* default — an alert without a window over a keyed derived stream: every input row of
  the key is observed, so the first instant with rows and no report resolves;
* RESOLVE WHEN v < 0 — an alert with a window: rows with v = 0 neither report nor
  resolve (hysteresis);
* RESOLVE AFTER q — reports only; the condition stops q after the latest one.

The brute force never steps a state machine: it cuts time into the intervals where the
condition holds (from the definitions in docs/rules.md), drops those not longer than
FOR, joins those less than KEEP FIRING FOR apart, and counts the reports inside.
Readings arrive with disorder within the slack, in random batches, with restarts from
the saved state, and end either at the end of input or at a heartbeat (then only what
lies below its watermark is decided).
"""

from __future__ import annotations

import itertools
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.core.incidents import KeyState, _observed_by_key
from engine.core.pipeline import HEARTBEAT, Pipeline
from engine.core.plan import END_OF_TIME
from engine.core.replay import arrival_table
from engine.core.state import MemoryStore
from rules.language.loader import load_rules
from tests.examples import examples

SLACK = 10
STREAM = (
    "CREATE STREAM s (k INT, v INT, ts TIMESTAMP) "
    f"ORDER BY ts SLACK {SLACK} MILLISECONDS SOURCE 'lookout/s/+/readings';\n"
)
WINDOWED = "SELECT k, ts, v, count(*) OVER (PARTITION BY k ROWS UNBOUNDED PRECEDING) AS n FROM s"


def rule(form: str, pending: int, keep: int, quiet: int) -> str:
    """The rule text of `form` with FOR / KEEP FIRING FOR (0: left out)."""
    before = f"FOR {pending} MILLISECONDS " if pending else ""
    after = f" KEEP FIRING FOR {keep} MILLISECONDS" if keep else ""
    if form == "default":
        return (
            "CREATE STREAM p AS SELECT k, v, ts, count(*) OVER (PARTITION BY k ROWS "
            "UNBOUNDED PRECEDING) AS n FROM s;\n"
            f"CREATE ALERT a SEVERITY info {before}{after} AS SELECT k, ts, v FROM p WHERE v > 0;"
        )
    resolve = "RESOLVE WHEN v < 0" if form == "when" else f"RESOLVE AFTER {quiet} MILLISECONDS"
    return f"CREATE ALERT a SEVERITY info {before}{resolve}{after} AS {WINDOWED} WHERE v > 0;"


def expected(
    readings: list[dict[str, Any]], form: str, pending: int, keep: int, quiet: int, until: int
) -> set[tuple]:
    """(key, opened_at, resolved_at, reports, last_report_at) of every incident, as far as
    the instants below `until` decide it."""
    out = set()
    for key in sorted({r["k"] for r in readings}):
        mine = [r for r in readings if r["k"] == key]
        reports = sorted(r["ts"] for r in mine if r["v"] > 0)
        if form == "default":
            clears = {r["ts"] for r in mine} - set(reports)
        elif form == "when":
            clears = {r["ts"] for r in mine if r["v"] < 0} - set(reports)
        else:
            clears = set()
        holding: list[tuple[int, int]] = []  # [start, end) where the condition holds
        if form == "after":
            for t in reports:
                if holding and t <= holding[-1][1]:
                    holding[-1] = (holding[-1][0], t + quiet)
                else:
                    holding.append((t, t + quiet))
        else:
            start = None
            for t in sorted(set(reports) | clears):
                if t in clears and start is not None:
                    holding.append((start, t))
                    start = None
                elif t not in clears and start is None:
                    start = t
            if start is not None:
                holding.append((start, END_OF_TIME))
        i = 0
        while i < len(holding):
            begin, end = holding[i]
            if end - begin <= pending:
                i += 1
                continue
            while end < END_OF_TIME and i + 1 < len(holding) and holding[i + 1][0] <= end + keep:
                i += 1
                end = holding[i][1]
            i += 1
            opened = begin + pending
            if opened >= until:
                continue
            resolved = end + keep if end < END_OF_TIME and end + keep < until else None
            inside = [t for t in reports if begin <= t < min(resolved or until, until)]
            out.add((key, opened, resolved, len(inside), max(inside)))
    return out


@st.composite
def recordings(draw: Any) -> tuple[list[dict], list[dict], int | None]:
    """(readings in ts order, the same in an arrival order within the slack, a closing
    heartbeat's timestamp or None for the end of input)."""
    raw = draw(
        st.lists(
            st.tuples(st.integers(0, 80), st.sampled_from([1, 2]), st.sampled_from([-1, 0, 1])),
            max_size=40,
        )
    )
    rows = [
        {"k": k, "v": v, "ts": ts, "source": "g", "seq": i}
        for i, (ts, k, v) in enumerate(sorted(raw))
    ]
    delays = draw(st.lists(st.integers(0, SLACK), min_size=len(rows), max_size=len(rows)))
    arrival = sorted(range(len(rows)), key=lambda i: (rows[i]["ts"] + delays[i], i))
    latest = max((r["ts"] for r in rows), default=0)
    beat = draw(st.one_of(st.none(), st.integers(latest, latest + 60)))
    return rows, [rows[i] for i in arrival], beat


def saved_as_before(store: MemoryStore) -> None:
    """Rewrite every saved incident key as code before the instants became an array
    saved it: its observed instants a set (a key not saved since an earlier rewrite
    holds one already)."""
    for entry, data in list(store.scan("head")):
        definition, kind, wakeup, state = pickle.loads(data)
        if isinstance(state, KeyState) and not isinstance(state.observed, set):
            state.observed = set(state.observed.tolist())
            store.put(entry, pickle.dumps((definition, kind, wakeup, state)))


def incidents(
    text: str,
    arrivals: list[dict],
    beat: int | None,
    cuts: list[int],
    restart: bool,
    old_saves: bool = False,
) -> tuple[set[tuple], int, list[tuple[int, int]]]:
    """The incidents the pipeline gives (their last updates), the final watermark, and
    after each batch its watermark and the pipeline's count of open incidents;
    ``old_saves``: every restart reads the state as the earlier code saved it."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rule.sql"
        path.write_text(STREAM + text)
        plan = load_rules([path]).plan
    schema = plan.streams["s"]
    store = MemoryStore()
    pipeline = Pipeline(plan, store=store)
    last: dict[tuple, Any] = {}
    rows = [*arrivals, {"k": None, "v": None, "ts": beat, HEARTBEAT: True}] if beat else arrivals
    cuts = sorted({c for c in cuts if 0 < c < len(rows)})
    watermark = END_OF_TIME
    firing = []
    for start, end in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        if restart:
            if old_saves:
                saved_as_before(store)
            pipeline = Pipeline(plan, store=store)
        table = arrival_table(schema, rows[start:end])
        beats = pa.array([bool(r.get(HEARTBEAT)) for r in rows[start:end]], pa.bool_())
        table = table.set_column(table.column_names.index(HEARTBEAT), HEARTBEAT, beats)
        step = pipeline.process({"s": table})
        watermark = step.watermarks["s"]
        for update in step.incidents:
            last[(update.key, update.opened_at)] = update
        firing.append((watermark, pipeline.firing()["a"]))
        pipeline.save()
    if beat is None:
        for update in pipeline.finish().incidents:
            last[(update.key, update.opened_at)] = update
        watermark = END_OF_TIME
        firing.append((watermark, pipeline.firing()["a"]))
    got = {
        (int(u.key[1:-1]), u.opened_at, u.resolved_at, u.reports, u.last_report_at)
        for u in last.values()
    }
    for update in last.values():
        assert update.row["ts" if "ts" in update.row else "k"] is not None
    return got, watermark, firing


_REPEATED = [
    {"k": 1, "v": -1 if seq < 5 else 0, "ts": 0, "source": "g", "seq": seq} for seq in range(6)
]
# The second batch's advance observes key 1 last and key 2 first at one instant (15):
# key 2's observation there resolves its incident.
_SHARED_INSTANT = [
    {"k": k, "v": v, "ts": ts, "source": "g", "seq": seq}
    for seq, (k, v, ts) in enumerate([(2, 1, 1), (1, 0, 15), (2, 0, 15), (1, 0, 40)])
]


@settings(max_examples=examples(300), deadline=None)
@given(
    data=recordings(),
    form=st.sampled_from(["default", "when", "after"]),
    pending=st.sampled_from([0, 3, 7]),
    keep=st.sampled_from([0, 4]),
    quiet=st.sampled_from([1, 5]),
    cuts=st.lists(st.integers(0, 45), max_size=4),
    restart=st.booleans(),
    old_saves=st.booleans(),
)
# Two restarts from old saves, a key not saved between them (its entry still a set).
@example(
    data=(_REPEATED, [*_REPEATED[:4], _REPEATED[5], _REPEATED[4]], None),
    form="when", pending=0, keep=0, quiet=1, cuts=[4, 5], restart=True, old_saves=True,
)  # fmt: skip
@example(
    data=(_SHARED_INSTANT, _SHARED_INSTANT, None),
    form="default", pending=0, keep=0, quiet=1, cuts=[2], restart=False, old_saves=False,
)  # fmt: skip
def test_incidents_equal_the_brute_force(
    data: tuple,
    form: str,
    pending: int,
    keep: int,
    quiet: int,
    cuts: list[int],
    restart: bool,
    old_saves: bool,
) -> None:
    in_order, arrivals, beat = data
    text = rule(form, pending, keep, quiet)
    got, watermark, _ = incidents(text, arrivals, beat, cuts, restart, old_saves)
    assert got == expected(in_order, form, pending, keep, quiet, watermark)


@settings(max_examples=examples(200), deadline=None)
@given(
    data=recordings(),
    form=st.sampled_from(["default", "when", "after"]),
    pending=st.sampled_from([0, 3]),
    keep=st.sampled_from([0, 4]),
    cuts=st.lists(st.integers(0, 45), max_size=4),
    restart=st.booleans(),
)
def test_the_count_of_open_incidents_equals_the_brute_force(
    data: tuple, form: str, pending: int, keep: int, cuts: list[int], restart: bool
) -> None:
    """After every batch (and from the saved state, on restarts), the incidents the
    brute force has open as far as the batch's watermark decides them."""
    in_order, arrivals, beat = data
    _, _, firing = incidents(rule(form, pending, keep, 5), arrivals, beat, cuts, restart)
    for watermark, count in firing:
        brute = expected(in_order, form, pending, keep, 5, watermark)
        assert count == sum(1 for _, _, resolved, _, _ in brute if resolved is None)


@pytest.mark.parametrize(
    ("pending", "keep", "want"),
    [
        (0, 0, {(3, 2, 5, 3, 4), (3, 6, 7, 1, 6)}),
        (2, 0, {(3, 4, 5, 3, 4)}),
        (2, 2, {(3, 4, 9, 4, 6)}),
    ],
)
def test_the_timeline_of_the_docs(pending: int, keep: int, want: set) -> None:
    """docs/rules.md's picture (minutes there, ms here): x a report, . a row without.

    t           1  2  3  4  5  6  7  8  9
    rows        .  x  x  x  .  x  .  .  .
    condition      [=======)  [=)
    """
    marks = ".xxx.x..."
    rows = [
        {"k": 3, "v": 1 if mark == "x" else -1, "ts": t, "source": "g", "seq": t}
        for t, mark in enumerate(marks, start=1)
    ]
    got, _, _ = incidents(rule("default", pending, keep, 0), rows, None, [], False)
    assert got == want


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([-(10**17), -3, 0, 7, 10**17]),
            st.sampled_from(["a", "b", None]),
            st.one_of(st.integers(0, 50), st.just(10**6)),
        ),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([pa.int64(), pa.float64()]),
)
def test_a_batchs_observed_instants_per_key_equal_the_brute_force(rows, kind) -> None:
    """Each key of a batch's observed rows, in key order (NULLs last), with its instants
    sorted and each once: keys sparse or dense, ranked as integers or sorted by Arrow (a
    floating-point column), as one integer with the instant or not."""
    keyed = pa.table(
        {
            "v": pa.array([float(r[0]) if kind == pa.float64() else r[0] for r in rows], kind),
            "s": pa.array([r[1] for r in rows], pa.string()),
        }
    )
    ts = np.array([r[2] for r in rows], np.int64)
    found, instants, bounds = _observed_by_key(keyed, ts)
    expected: dict[tuple[Any, ...], set[int]] = {}
    for v, text, t in rows:
        expected.setdefault((v, text), set()).add(t)
    keys = sorted(expected, key=lambda k: (k[0], k[1] is None, k[1] or ""))
    assert found == keys
    got = [instants[a:b].tolist() for a, b in itertools.pairwise(bounds.tolist())]
    assert got == [sorted(expected[k]) for k in keys]
