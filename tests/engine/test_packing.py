"""Packing a stream's rows per stateful group for the stateful step, against brute force.

Whatever a batch holds (keys with nulls and NaN, heartbeats, several stages keyed
differently), unpacking what `pack` made and splitting it per stage key
(`evaluator_keys`) must give each stage every reading exactly once, each evaluator only
rows of its key, under its group's key; a packed row's event time and landing stamp
must be the highest of its rows; the batch's heartbeats make one packed row at their
latest time. A group key's bucket is the same in every batch and every process.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import orjson
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.spark.packing import (
    ARRIVAL_WM,
    BUCKET,
    BUCKETS,
    CLOCK,
    EVENT_TIME,
    GROUP,
    GROUP_KEY,
    HEARTBEAT,
    ROWS,
    Route,
    Router,
    bucket,
    evaluator_keys,
    pack,
    routes,
    unpack,
)

ROUTER = Router(
    routes({"by_station": ("station",), "by_pair": ("station", "lane"), "all": ()}),
    "ts",
    ("station", "lane", "speed", "ts", "source", "seq"),
    clock=False,
)

row_strategy = st.fixed_dictionaries(
    {
        "station": st.one_of(st.none(), st.integers(1, 3)),
        "lane": st.one_of(st.none(), st.sampled_from(["a", "b"])),
        "speed": st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=False)),
        "ts": st.integers(0, 10_000),
        "source": st.sampled_from(["s1", "s2"]),
        "seq": st.integers(0, 100),
        ARRIVAL_WM: st.one_of(st.none(), st.integers(-5_000, 10_000)),
        HEARTBEAT: st.booleans(),
    }
)
SCHEMA = pa.schema(
    [
        ("station", pa.int32()),
        ("lane", pa.string()),
        ("speed", pa.float64()),
        ("ts", pa.int64()),
        ("source", pa.string()),
        ("seq", pa.int64()),
        (ARRIVAL_WM, pa.int64()),
        (HEARTBEAT, pa.bool_()),
    ]
)


def _same(a: object, b: object) -> bool:
    return a == b or (a != a and b != b)  # NaN equals NaN here


@settings(max_examples=200, deadline=None)
@given(st.lists(row_strategy, min_size=1, max_size=60))
def test_every_reading_reaches_every_stage_once_under_its_key(rows):
    packed = pack(pa.RecordBatch.from_pylist(rows, schema=SCHEMA), ROUTER).to_pylist()
    readings = [r for r in rows if not r[HEARTBEAT]]
    columns = ROUTER.columns
    # The stateful groups: a station's, for both stages keyed by station first; the
    # key-less stage's own.
    groups = {"by_station": "by:station", "by_pair": "by:station", "all": "all"}
    for route in ROUTER.routes:
        got = Counter()
        for p in (p for p in packed if p[GROUP] == groups[route.stage]):
            members = unpack(p[ROWS])
            assert members, "a packed row holds at least one reading"
            group_key = orjson.loads(p[GROUP_KEY])
            assert p[BUCKET] == bucket(p[GROUP_KEY]), "a key's bucket depends on it alone"
            assert round(p[EVENT_TIME].timestamp() * 1000) == max(m["ts"] for m in members)
            for key_text, mine in evaluator_keys(route, p[GROUP_KEY], members).items():
                key = orjson.loads(key_text)
                assert key[: len(group_key)] == group_key
                for member in mine:
                    assert all(_same(member[k], v) for k, v in zip(route.key, key, strict=True)), (
                        f"{route.stage}: row {member} split under key {key}"
                    )
                got.update(orjson.dumps(m) for m in mine)
        want = Counter(orjson.dumps({c: r[c] for c in columns}) for r in readings)
        assert got == want, route.stage
    # The key-less stage packs the whole batch in one row: its stamp is the batch's.
    stamps = [r[ARRIVAL_WM] for r in readings if r[ARRIVAL_WM] is not None]
    assert [p[ARRIVAL_WM] for p in packed if p[GROUP] == "all"] == (
        [max(stamps, default=None)] if readings else []
    )
    # A reading is packed once per group, not once per stage.
    assert sum(len(unpack(p[ROWS])) for p in packed if p[ROWS]) == 2 * len(readings)
    beats = [r["ts"] for r in rows if r[HEARTBEAT]]
    beat_rows = [p for p in packed if p[GROUP] == HEARTBEAT]
    assert len(beat_rows) == (1 if beats else 0)
    if beats:
        assert round(beat_rows[0][EVENT_TIME].timestamp() * 1000) == max(beats)


def test_heartbeats_go_to_the_clock_when_the_query_has_one():
    router = Router(ROUTER.routes, "ts", ROUTER.columns, clock=True)
    batch = pa.RecordBatch.from_pylist(
        [
            {"ts": 5, HEARTBEAT: True, "seq": 0, "source": "hb"},
            {"ts": 9, HEARTBEAT: True, "seq": 0, "source": "hb"},
        ],
        schema=SCHEMA,
    )
    (row,) = pack(batch, router).to_pylist()
    assert (row[GROUP], round(row[EVENT_TIME].timestamp() * 1000)) == (CLOCK, 9)


def test_a_stage_shares_the_groups_of_the_shortest_stage_key_starting_its_own():
    got = routes(
        {
            "lanes": ("station", "lane"),
            "speed": ("station",),
            "accident": ("xway", "dir", "seg", "pos"),
            "segments": ("xway", "dir", "seg"),
            "vehicles": ("vid",),
            "speeding": (),
        }
    )
    assert {r.stage: r.group for r in got} == {
        "lanes": "by:station",
        "speed": "by:station",
        # No stage is keyed by expressway alone: grouping by it would make one group of
        # every position.
        "accident": "by:xway,dir,seg",
        "segments": "by:xway,dir,seg",
        "vehicles": "by:vid",
        "speeding": "speeding",
    }
    assert got[0] == Route("lanes", ("station", "lane"), 1)


def test_a_group_keys_bucket_is_the_same_in_every_process():
    # Python's own string hash differs per process: a key's state would be looked up in
    # the wrong bucket after a restart, or by another worker.
    keys = [orjson.dumps([station]).decode() for station in range(200)]
    script = (
        "import sys, orjson; from engine.spark.packing import bucket; "
        "print(orjson.dumps([bucket(k) for k in orjson.loads(sys.argv[1])]).decode())"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", script, orjson.dumps(keys).decode()],
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            capture_output=True,
            check=True,
            text=True,
        ).stdout
        assert orjson.loads(out) == [bucket(k) for k in keys]


def test_many_keys_spread_over_every_bucket():
    counts = Counter(bucket(orjson.dumps([station]).decode()) for station in range(BUCKETS * 20))
    assert sorted(counts) == list(range(BUCKETS))
    assert max(counts.values()) < 3 * 20, "no bucket takes a large share of the keys"
