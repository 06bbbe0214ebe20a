"""Evicting idle keys changes no output.

Hypothesis draws a rule of one window form (every form either runner computes: OVER
frames of every kind with and without slides, lags, resets and bounds, active
expiration over Python aggregates, extents, CQL relations read through ISTREAM /
DSTREAM / RSTREAM, MATCH_RECOGNIZE, several OVER windows) with an alert on its rows,
and a stream of readings over six keys with exact ties, disorder within the slack,
heartbeats and quiet spells longer than every window (keys go idle and come back). The
pipeline runs it twice on the same batches, rebuilt from its state store between
batches or not: evicting idle keys, and keeping every key. Both must give the same
rows to the last bit, with the same tie order (``_source``, ``_seq``: alert ids hash
them), the same alert ids and the same incidents; the evicting one never holds more
keys, and its store holds exactly its live keys' state and its evicted keys' residues.

Key states a runner drops from memory between batches (kept as their saved state, and
loaded again when needed) change no output either: the same rules and batches give the
same rows spilling every key's state after every save as never spilling.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest.mock import patch

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.core.columnar.over as over
import engine.core.planner.runners as planner
import engine.core.runners as runners_module
from engine.alerts import alert_id
from engine.core import key_index
from engine.core.key_index import KEY_INDEX, KEY_STATE, KeyIndex
from engine.core.pipeline import HEARTBEAT, Pipeline
from engine.core.plan import Plan
from engine.core.replay import arrival_table
from engine.core.runners import REST, SLICE_PAGE, emitted_outputs
from engine.core.state import MemoryStore
from lookout.replay import output_key
from rules.language.loader import load_rules
from tests.engine.test_columnar import STREAM, extent_rule, over_rule, silence_rule
from tests.examples import examples
from tests.rules.helpers import FIXTURES

UDAS = (
    # The library's missed_door runs per column; this one keeps to the per-row runner.
    "CREATE AGGREGATE missed_door(door STRING, next_door STRING) RETURNS STRING "
    "LANGUAGE PYTHON AS 'tests.rules.uda_fixtures:PerRowMissedDoor';\n"
    "CREATE AGGREGATE item_alarm(tagid STRING, tagtype STRING, tagtime TIMESTAMP) "
    "RETURNS STRING LANGUAGE PYTHON AS 'rules.udas:ItemAlarm';\n"
    "CREATE AGGREGATE packing_group(tagtime TIMESTAMP) RETURNS BIGINT "
    "LANGUAGE PYTHON AS 'rules.udas:PackingGroup';\n"
    "CREATE AGGREGATE silence(ts TIMESTAMP) RETURNS TIMESTAMP "
    "LANGUAGE PYTHON AS 'rules.udas:Silence';\n"
)
P = "PARTITION BY station"
OVER_FORMS = [
    f"missed_door(name, 'c') OVER ({P} RANGE {{r}} PRECEDING ACTIVE EXPIRATION)",
    f"item_alarm(name, CASE WHEN lane = 1 THEN 'ap' ELSE 'item' END, ts) "
    f"OVER ({P} RANGE {{r}} PRECEDING ACTIVE EXPIRATION)",
    f"silence(ts) OVER ({P} RANGE {{r}} PRECEDING ACTIVE EXPIRATION)",
    f"packing_group(ts) OVER ({P} ROWS UNBOUNDED PRECEDING)",
    f"stddev(speed) OVER ({P} RANGE {{r}} PRECEDING)",
    f"last(name) OVER ({P} RANGE {{r}} PRECEDING)",
    f"sum(speed) OVER ({P} RANGE {{r}} PRECEDING LAG 500 MILLISECONDS)",
    f"count(*) OVER ({P} RANGE UNBOUNDED PRECEDING RESET EVERY {{r}})",
    f"sum(speed) OVER ({P} RANGE UNBOUNDED PRECEDING RESET EVERY {{r}} SLIDE 2)",
    f"count(*) OVER ({P} RANGE SINCE TIMESTAMP '1970-01-01T00:16:45.000Z')",
    f"sum(speed) OVER ({P} ROWS 3 PRECEDING SLIDE 2)",
    f"stddev(speed) OVER ({P} RANGE {{r}} PRECEDING SLIDE 2)",
    f"var(speed) OVER ({P} RANGE {{r}} PRECEDING SLIDE 1 SECONDS)",
    f"max(speed) OVER ({P} RANGE {{r}} PRECEDING)",
]
FROM_FORMS = [
    "SELECT ISTREAM(station, speed) FROM traffic [PARTITION BY station ROWS 1]",
    "SELECT ISTREAM(station, lane, count(*) AS v) FROM traffic [PARTITION BY station ROWS 2] "
    "GROUP BY station, lane",
    "SELECT RSTREAM(station, count(*) AS v) FROM traffic [PARTITION BY station ROWS 2] "
    "GROUP BY station",
    "SELECT DSTREAM(station, count(*) AS v) FROM traffic [RANGE {r} SLIDE 1 SECONDS] "
    "GROUP BY station",
    "SELECT ISTREAM(station, first(speed) AS v) FROM traffic [RANGE {r} SLIDE 1 SECONDS] "
    "GROUP BY station",
    "SELECT station, window_end, first(speed) AS v FROM traffic [RANGE {r} SLIDE 1 SECONDS] "
    "GROUP BY station",
    "SELECT ISTREAM(station, count(*) AS v) FROM traffic [RANGE {r}] GROUP BY station",
    "SELECT DSTREAM(station, max(speed) AS v) FROM traffic [RANGE {r}] GROUP BY station",
    "SELECT RSTREAM(station, count(*) AS v) FROM traffic [RANGE UNBOUNDED] GROUP BY station",
    "SELECT station, ts, k, n FROM traffic MATCH_RECOGNIZE (PARTITION BY station ORDER BY ts "
    "MEASURES MATCH_NUMBER() AS k, count(*) AS n ONE ROW PER MATCH AFTER MATCH SKIP PAST "
    "LAST ROW PATTERN (A B+) WITHIN {r} DEFINE A AS speed >= 2, B AS speed < 2)",
    "SELECT station, lane, ts, count(*) OVER (PARTITION BY station RANGE {r} PRECEDING) AS v, "
    "sum(speed) OVER (PARTITION BY station, lane RANGE 2 SECONDS PRECEDING) AS w FROM traffic",
]
ALERTS = [
    "RESOLVE AFTER 1 SECONDS ",
    "RESOLVE WHEN lane = 2 ",
    "FOR 500 MILLISECONDS RESOLVE AFTER 2 SECONDS ",
    "RESOLVE WHEN speed < 1 KEEP FIRING FOR 750 MILLISECONDS ",
]
SPANS = ["250 MILLISECONDS", "1 SECONDS", "3 SECONDS"]


@st.composite
def per_row_rule(draw: st.DrawFn) -> str:
    """An alert of a window form only the per-row runner computes."""
    span = draw(st.sampled_from(SPANS))
    alert = draw(st.sampled_from(ALERTS))
    if draw(st.booleans()):
        window = draw(st.sampled_from(OVER_FORMS)).format(r=span)
        query = f"SELECT station, lane, ts, {window} AS v FROM traffic"
    else:
        query = draw(st.sampled_from(FROM_FORMS)).format(r=span)
    return f"{UDAS}CREATE ALERT watch SEVERITY warning {alert}AS {query};\n"


# The columnar suite's rules, keyed (an unkeyed stage keeps its one key).
keyed_over_rule = over_rule().map(
    lambda rule: rule if "PARTITION BY" in rule else rule.replace("OVER (", f"OVER ({P} ")
)
keyed_extent_rule = extent_rule().filter(lambda rule: "GROUP BY station" in rule)
# RANGE frames, the columnar runner's one evicting OVER frame, more often.
range_over_rule = keyed_over_rule.filter(lambda rule: "UNBOUNDED" not in rule and " RANGE " in rule)

# Six keys over 40 s in steps of 250 ms: ties, and quiet spells longer than any window.
reading = st.tuples(
    st.integers(0, 160).map(lambda n: n * 250),
    st.integers(1, 6),
    st.integers(1, 3),
    st.one_of(st.none(), st.sampled_from([0.1, 3.0, 7.3, 11.0, 2.0, 1.0 / 3])),
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["p", "q"]),
    st.booleans(),
)
# In arrival order: each reading up to 1.5 s late (within the 2 s slack).
stream_strategy = st.lists(st.tuples(reading, st.integers(0, 1_500)), min_size=8, max_size=120).map(
    lambda drawn: [r for r, _ in sorted(drawn, key=lambda d: d[0][0] + d[1])]
)


def test_every_form_compiles() -> None:
    for form in OVER_FORMS:
        for span in SPANS:
            compiled(f"{UDAS}CREATE STREAM out AS SELECT station, lane, ts, "
                     f"{form.format(r=span)} AS v FROM traffic;")  # fmt: skip
    for form in FROM_FORMS:
        for alert in ALERTS:
            compiled(
                f"{UDAS}CREATE ALERT watch SEVERITY warning {alert}AS {form.format(r='1 SECONDS')};"
            )


def test_the_deleting_aggregate_runs_per_row() -> None:
    # missed_door's form is the per-row runner's window of an aggregate that deletes
    # tuples and keeps repeats (silence's runs per column).
    rule = f"SELECT station, lane, ts, {OVER_FORMS[0].format(r='1 SECONDS')} AS v FROM traffic"
    (stage,) = compiled(f"{UDAS}CREATE STREAM out AS {rule};").stages()
    assert "missed_door" in rule and not planner.columnar(stage)


def arrivals(items: list[tuple]) -> list[dict[str, Any]]:
    """The readings (heartbeats one in three) in arrival order, those more than the
    slack behind the latest left out."""
    rows: list[dict[str, Any]] = []
    latest = None
    for seq, (ts, station, lane, speed, name, source, beat) in enumerate(items):
        ts += 1_000_000
        if latest is not None and ts < latest - 2_000:
            continue
        latest = ts if latest is None else max(latest, ts)
        rows.append(
            {
                "station": station,
                "lane": lane,
                "speed": speed,
                "name": name,
                "ts": ts,
                "source": source,
                "seq": seq,
                HEARTBEAT: beat and seq % 3 == 0,
            }
        )
    return rows


def compiled(rule: str) -> Plan:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rule.sql"
        path.write_text(STREAM + rule)
        return load_rules([path], FIXTURES).plan


def run(
    plan: Plan, rows: list[dict], cuts: list[int], restart: bool, evict: bool
) -> tuple[list[tuple], list[tuple], list[int]]:
    """Outputs (sink, key, ts, source, seq, row, alert id), incident updates, and the
    live keys after each batch."""
    schema = plan.streams["traffic"]
    keys = {stage.name: stage.key for stage in plan.stages()}
    store = MemoryStore()
    pipeline = Pipeline(plan, store=store, evict=evict)
    outputs, incidents, live = [], [], []
    results = []
    for start, end in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        if restart:
            pipeline = Pipeline(plan, store=store, evict=evict)
        table = arrival_table(schema, rows[start:end])
        beats = pa.array([r[HEARTBEAT] for r in rows[start:end]], pa.bool_())
        table = table.set_column(table.column_names.index(HEARTBEAT), HEARTBEAT, beats)
        results.append(pipeline.process({"traffic": table}))
        pipeline.save()
        live.append(sum(pipeline.live_keys().values()))
        if evict:
            assert_store_holds_live_keys(pipeline, store)
    results.append(pipeline.finish())
    pipeline.save()
    live.append(sum(pipeline.live_keys().values()))
    if evict:
        assert_store_holds_live_keys(pipeline, store)
    for result in results:
        for emitted in result.outputs:
            for key, o in emitted_outputs(emitted):
                ident = alert_id(o.sink, output_key(keys, o), o.ts, o.row, o.source, o.seq)
                outputs.append((o.sink, key, o.ts, o.source, o.seq, o.row, ident))
        incidents += [tuple(vars(u).values()) for u in result.incidents]
    return outputs, incidents, live


def assert_store_holds_live_keys(pipeline: Pipeline, store: MemoryStore) -> None:
    """Every keyed runner's state entries are its live keys', no evicted key's."""
    for i, stage in pipeline.stages:
        if not stage.key:
            continue
        runner = pipeline.runners[i]
        stored = {
            key[2]
            for key in store.entries
            if key[1] == stage.name
            and key[0] in ("head", "cstate", KEY_STATE, "chunk", "slice", SLICE_PAGE)
            and key[2]  # the columnar runner's pending rows have no key
        }
        live = {k for k in stored if runner.is_live(tuple(orjson.loads(k)))}
        assert stored == live, (stage.name, stored - live)
        rests = {key[2] for key in store.entries if key[0] == REST and key[1] == stage.name}
        assert not rests & stored, (stage.name, rests & stored)
        # A columnar stage's key index names exactly the keys whose states are stored.
        index = [(k, v) for k, v in store.entries.items() if k[:2] == (KEY_INDEX, stage.name)]
        if index:
            named = KeyIndex(stage.name, stage.query.definition, runner.kind, str, str)
            indexed = named.restore(index)
            assert indexed is not None
            states = {k[2] for k in store.entries if k[:2] == (KEY_STATE, stage.name)}
            assert {text for _, text, _ in indexed.keys} == states, stage.name


@contextmanager
def per_row_runners(on: bool) -> Iterator[None]:
    """Every stage on the per-row runner while ``on``."""
    original = planner.columnar
    if on:
        planner.columnar = lambda stage: False  # type: ignore[assignment]
    try:
        yield
    finally:
        planner.columnar = original  # type: ignore[assignment]


def check(rule: str, items: list[tuple], seed: int, restart: bool) -> None:
    """The same rows, alert ids and incidents evicting as keeping every key, on the same
    batches; never more keys held."""
    rows = arrivals(items)
    rng = random.Random(seed)
    count = min(rng.randint(0, 12), max(len(rows) - 1, 0))
    cuts = sorted(rng.sample(range(1, len(rows)), count))
    plan = compiled(rule)
    # Pages of one slice description: an evicted key's pages must go too. Key indexes of
    # two entries: their records are carried forward at almost every save.
    with patch.object(over, "PAGE_SLICES", 1), patch.object(key_index, "MAX_ENTRIES", 2):
        kept_out, kept_incidents, kept_live = run(plan, rows, cuts, restart, evict=False)
        out, incidents, live = run(plan, rows, cuts, restart, evict=True)
    assert out == kept_out, rule
    assert incidents == kept_incidents, rule
    assert all(a <= b for a, b in zip(live, kept_live, strict=True)), (live, kept_live)


SETTINGS = settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.slow
@SETTINGS
@given(
    rule=st.one_of(keyed_over_rule, range_over_rule, keyed_extent_rule, silence_rule),
    items=stream_strategy,
    seed=st.integers(0, 10**6),
    restart=st.booleans(),
    rows_only=st.booleans(),
)
def test_eviction_changes_no_output(rule, items, seed, restart, rows_only) -> None:
    """The columnar suite's forms, on the columnar runners or all on the per-row one."""
    with per_row_runners(rows_only):
        check(rule, items, seed, restart)


@SETTINGS
@given(
    rule=per_row_rule(), items=stream_strategy, seed=st.integers(0, 10**6), restart=st.booleans()
)
def test_eviction_changes_no_output_per_row(rule, items, seed, restart) -> None:
    """The forms only the per-row runner computes."""
    check(rule, items, seed, restart)


@contextmanager
def spilling_after(saves: int) -> Iterator[None]:
    """Runners drop from memory the evaluators no save of the last ``saves`` wrote."""
    original = runners_module.SPILL_AFTER
    runners_module.SPILL_AFTER = saves
    try:
        yield
    finally:
        runners_module.SPILL_AFTER = original


@SETTINGS
@given(
    rule=st.one_of(
        per_row_rule(), keyed_over_rule, range_over_rule, keyed_extent_rule, silence_rule
    ),
    items=stream_strategy,
    seed=st.integers(0, 10**6),
    after=st.sampled_from([0, 1, 3]),
    rows_only=st.booleans(),
)
def test_states_spilled_from_memory_change_no_output(rule, items, seed, after, rows_only) -> None:
    """Per-row evaluators and columnar runners' key states alike."""
    rows = arrivals(items)
    rng = random.Random(seed)
    count = min(rng.randint(0, 12), max(len(rows) - 1, 0))
    cuts = sorted(rng.sample(range(1, len(rows)), count))
    with per_row_runners(rows_only):
        plan = compiled(rule)
        with spilling_after(10**9):
            kept = run(plan, rows, cuts, restart=False, evict=True)
        with spilling_after(after):
            spilled = run(plan, rows, cuts, restart=False, evict=True)
    assert spilled == kept, rule


def fed(pipeline: Pipeline, rows: list[dict[str, Any]], beat_at: int) -> list[tuple]:
    """Traffic ``rows`` and a heartbeat at ``beat_at`` through ``pipeline``, saved: each
    output as (key, output)."""
    beat = {"station": 0, "lane": 0, "speed": None, "name": "", "ts": beat_at}
    table = arrival_table(pipeline.plan.streams["traffic"], [*rows, beat])
    flags = pa.array([False] * len(rows) + [True], pa.bool_())
    table = table.set_column(table.column_names.index(HEARTBEAT), HEARTBEAT, flags)
    result = pipeline.process({"traffic": table})
    pipeline.save()
    return [(key, o) for e in result.outputs for key, o in emitted_outputs(e)]


def test_idle_keys_leave_memory_and_store_and_come_back_numbered_on() -> None:
    """Fifty keys seen once, then a heartbeat past every window: the RANGE frame's keys
    and the extents' keys are gone from memory and store, each leaving one residue; the
    ROWS frame's stay. A key back later numbers its rows on from where it stopped."""
    plan = compiled(
        "CREATE STREAM ranged AS SELECT station, ts, count(*) OVER (PARTITION BY station "
        "RANGE 1 SECONDS PRECEDING) AS n FROM traffic;\n"
        "CREATE STREAM rowed AS SELECT station, ts, count(*) OVER (PARTITION BY station "
        "ROWS 2 PRECEDING) AS n FROM traffic;\n"
        "CREATE STREAM extents AS SELECT station, window_end, count(*) AS n FROM traffic "
        "[RANGE 2 SECONDS SLIDE 1 SECONDS] GROUP BY station;\n"
    )
    store = MemoryStore()
    pipeline = Pipeline(plan, store=store)

    def feed(rows: list[dict[str, Any]], beat_at: int) -> list[tuple]:
        return [(o.sink, key, o.ts, o.seq) for key, o in fed(pipeline, rows, beat_at)]

    row = {"lane": 1, "speed": 1.0, "name": "a", "source": "s"}
    feed([{**row, "station": k, "ts": 10_000 + k, "seq": k} for k in range(50)], 20_000)
    live = pipeline.live_keys()
    assert (live["ranged"], live["rowed"], live["extents"]) == (0, 50, 0)
    kinds = [k[0] for k in store.entries if k[1] == "ranged" and k[2]]
    assert kinds.count(KEY_STATE) == 0 and kinds.count(REST) == 50
    assert not [k for k in store.entries if k[1] == "extents" and k[0] == KEY_STATE]
    again = feed([{**row, "station": 7, "ts": 30_000, "seq": 99}], 40_000)
    assert ("ranged", (7,), 30_000, 1) in again  # its second row: seq 1, as if never gone
    assert ("rowed", (7,), 30_000, 1) in again
    assert pipeline.live_keys()["ranged"] == 0
    rebuilt = Pipeline(plan, store=store)
    assert rebuilt.live_keys()["rowed"] == 50 and rebuilt.live_keys()["ranged"] == 0


def test_an_evicted_keys_slice_pages_leave_the_store() -> None:
    """A RANGE frame's key with rows in many batches has pages of slice descriptions in
    the store; once its rows have all left, the key is evicted and its pages go too."""
    plan = compiled(
        "CREATE STREAM out AS SELECT station, ts, count(*) OVER (PARTITION BY station "
        "RANGE 3 SECONDS PRECEDING) AS n FROM traffic;\n"
    )
    rows = arrivals([(t * 250, 1 + t % 2, 2, 1.0, "a", "p", False) for t in range(60)])
    store = MemoryStore()
    pages_seen = 0
    with patch.object(over, "PAGE_SLICES", 1):
        pipeline = Pipeline(plan, store=store)
        for start in range(0, len(rows), 10):
            table = arrival_table(plan.streams["traffic"], rows[start : start + 10])
            pipeline.process({"traffic": table})
            pipeline.save()
            pages_seen = max(pages_seen, sum(e[0] == SLICE_PAGE for e in store.entries))
            assert_store_holds_live_keys(pipeline, store)
        pipeline.finish()
        pipeline.save()
    assert pages_seen >= 2
    assert pipeline.live_keys()["out"] == 0
    assert not [e for e in store.entries if e[0] in (SLICE_PAGE, "slice")]


class ReadCountingStore(MemoryStore):
    """A memory store that records its reads: single ones, and each read of many."""

    def __init__(self) -> None:
        super().__init__()
        self.single: list = []
        self.many: list[list] = []

    def get(self, key):
        self.single.append(key)
        return super().get(key)

    def get_many(self, keys):
        self.many.append(list(keys))
        return super().get_many(keys)


@pytest.mark.parametrize("rows_only", [False, True])
def test_new_keys_read_their_residues_in_one_call(rows_only: bool) -> None:
    """Once residues are stored, a new key may be one coming back, so it is looked up:
    a batch's new keys are read in one call of the store, not one each (a round trip
    each to Spark's state server), and a key coming back still numbers on."""
    with per_row_runners(rows_only):
        plan = compiled(
            "CREATE STREAM ranged AS SELECT station, ts, count(*) OVER (PARTITION BY "
            "station RANGE 1 SECONDS PRECEDING) AS n FROM traffic;\n"
        )
        store = ReadCountingStore()
        pipeline = Pipeline(plan, store=store)
    kinds = {runner.kind for runner in pipeline.runners.values()}
    assert kinds == ({"rows"} if rows_only else {"columnar-over"})
    row = {"lane": 1, "speed": 1.0, "name": "a", "source": "s"}

    def feed(stations: range, at: int, beat_at: int) -> list[tuple]:
        rows = [{**row, "station": k, "ts": at + k, "seq": at + k} for k in stations]
        return [(key, o.seq) for key, o in fed(pipeline, rows, beat_at)]

    feed(range(5), 10_000, 20_000)  # five keys, evicted: five residues stored
    assert sum(k[0] == REST for k in store.entries) == 5
    store.single.clear()
    store.many.clear()
    again = feed(range(3, 40), 30_000, 40_000)  # two coming back, 35 new
    assert not [k for k in store.single if k[0] == REST], "no residue read alone"
    reads = [m for m in store.many if m and m[0][0] == REST]
    assert len(reads) == 1 and len(reads[0]) == 37
    assert ((3,), 1) in again and ((5,), 0) in again  # numbered on; a new key from 0
