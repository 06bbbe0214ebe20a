"""The engine query's stateful step (`engine.spark.processor`) under PySpark's
`TwsTester`: no Spark, the processor's own code over in-memory state variables.

Batches of real landing files (written by ingest's `LandingWriter`, read by the
engine's source) go through the processor twice: once with its pipeline kept in memory
between batches, and once with the memo emptied before some batches, as when another
Python worker ran the last batch: the pipeline is then rebuilt from the state
variables. Both runs must write the same rows to every table.
"""

from __future__ import annotations

import gc
import random
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import orjson
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle
from pyspark.sql import Row
from pyspark.sql.streaming.tws_tester import TwsTester

from engine import tables
from engine.core.key_index import KEY_INDEX, KEY_STATE
from engine.core.state import MemoryStore
from engine.spark import step as step_module
from engine.spark.commit import table_schemas
from engine.spark.landing_source import (
    FilesPartition,
    LandingReader,
    landing_files,
    source_options,
)
from engine.spark.processor import ENTRIES, PIECES, EngineProcessor
from engine.spark.query import engine_components
from engine.spark.step import SparkStore
from ingest.landing import LandingWriter
from lookout.config import Config, EngineConfig, IngestConfig, S3Config
from lookout.services import alert_specs
from rules.language.loader import RuleSet, load_rules
from tests.e2e.helpers import arrival_order, make_readings
from tests.examples import examples

pytestmark = pytest.mark.usefixtures("unfrozen")  # the processor freezes its batches
RULES = Path(__file__).resolve().parents[2] / "rules" / "traffic.sql"
_LIBRARY = load_rules([RULES])
PARTS = engine_components(_LIBRARY.plan, alert_specs(_LIBRARY))
WALL_CLOCK = {"detected_at"}
DEFAULT_ENGINE = EngineConfig()  # when the batch ran: differs between any two runs


@dataclass(frozen=True)
class Landed:
    """Each batch's rows as the stateful step gets them (one per file), and the landing
    folder it reads their files from."""

    root: str
    batches: list[list[Row]]


def landing_batches(
    root: Path, readings: list[dict], files_per_batch: int, library: RuleSet = _LIBRARY
) -> Landed:
    """`readings` landed as files of 10 readings, read back by the engine's source in
    batches of `files_per_batch` files: each batch's rows as the stateful step gets them."""
    plan = library.plan
    writer = LandingWriter(str(root / "landing"), "t")
    for i in range(0, len(readings), 10):
        chunk = [dict(r) for r in readings[i : i + 10]]
        writer.add_readings("traffic", chunk, "lookout/traffic/1/readings", chunk[-1]["ts"])
        writer.flush()
    options = source_options(
        str(root / "landing"), "", S3Config(), {"traffic": [plan.streams["traffic"]]}, ""
    )
    reader = LandingReader(options)
    files = sorted(landing_files(pafs.LocalFileSystem(), str(root / "landing"), ["traffic"]))
    batches = []
    for i in range(0, len(files), files_per_batch):
        table = next(iter(reader.read(FilesPartition(tuple(files[i : i + files_per_batch])))))
        batches.append([Row(**row) for row in table.to_pylist()])
    return Landed(str(root / "landing"), batches)


def run(
    lakehouse: Path,
    landed: Landed,
    forget: set[int],
    engine: EngineConfig = DEFAULT_ENGINE,
    figures: list[dict] | None = None,
    library: RuleSet = _LIBRARY,
) -> dict[str, Counter]:
    """Every batch through one processor; the worker's memo emptied before the batches
    in `forget`. Each table's rows written, as a multiset; the health rows' figures
    appended to `figures`."""
    config = Config(
        lakehouse=str(lakehouse), engine=engine, ingest=IngestConfig(landing_url=landed.root)
    )
    for name, schema in table_schemas(library.plan, ("traffic", "positions")).items():
        tables.ensure_table(config.table(name), schema)
    parts = PARTS if library is _LIBRARY else engine_components(library.plan, alert_specs(library))
    processor = EngineProcessor(parts, config, memo_id=str(lakehouse))
    tester = TwsTester(processor)
    written: dict[str, Counter] = {}
    restores = 0
    for number, rows in enumerate(landed.batches):
        if number in forget:
            step_module._PIPELINES.clear()
        for out in tester.test("traffic", rows):
            if out["kind"] == "health":
                stats = orjson.loads(out["stats"])
                restores += not stats["reused"]
                if figures is not None:
                    figures.append(stats)
                continue
            found = pq.read_table(f"{config.table(out['table'])}/{out['path']}").to_pylist()
            written.setdefault(out["table"], Counter()).update(
                tuple(sorted((k, repr(v)) for k, v in row.items() if k not in WALL_CLOCK))
                for row in found
            )
    assert restores == len(forget | {0}), "a forgotten pipeline is rebuilt, a kept one reused"
    return written


@pytest.fixture(scope="module")
def batches(tmp_path_factory: pytest.TempPathFactory) -> Landed:
    readings = arrival_order(make_readings(seed=5), seed=6, max_delay_ms=1_500)
    return landing_batches(tmp_path_factory.mktemp("landing"), readings, files_per_batch=2)


def test_the_pipeline_a_worker_keeps_is_out_of_the_collectors_reach(
    tmp_path: Path, batches: Landed
) -> None:
    # PySpark runs a full collection after every task: it must not walk the kept
    # pipeline, whose state grows with the live keys.
    step_module._PIPELINES.clear()
    run(tmp_path, replace(batches, batches=batches.batches[:3]), forget=set())
    ((_, pipeline),) = step_module._PIPELINES.values()
    kept = [pipeline, *pipeline.runners.values(), *pipeline.sequencers.values()]
    walked = {id(o) for o in gc.get_objects()}
    assert not [o for o in kept if id(o) in walked]


def test_the_processor_keeps_its_state_in_two_variables(tmp_path: Path) -> None:
    # Each state variable costs every task a round trip to the JVM that creates it.
    tester = TwsTester(EngineProcessor(PARTS, Config(lakehouse=str(tmp_path)), "memo"))
    assert set(tester.handle.map_states) == {ENTRIES, PIECES}
    assert not tester.handle.value_states and not tester.handle.list_states


def test_unpickling_the_processor_imports_none_of_the_engine_s_evaluation(
    tmp_path: Path,
) -> None:
    # Spark unpickles it on the driver at every start of the query, only to run `init`.
    pickled = tmp_path / "processor.pickle"
    pickled.write_bytes(cloudpickle.dumps(EngineProcessor(PARTS, Config(), "memo")))
    code = (
        "import pickle, sys; processor = pickle.load(open(sys.argv[1], 'rb')); "
        "print(type(processor).__name__, *sorted(m for m in sys.modules "
        "if m.startswith(('engine.core', 'engine.spark.step', 'rules', 'lookout'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(pickled)], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["EngineProcessor"]


KINDS = (
    "sequencer", "head", "cstate", "journal", "chunk", "slice", "rest", "rests", "keycap",
    KEY_INDEX, KEY_STATE,
)  # fmt: skip
state_keys = st.tuples(
    st.sampled_from(KINDS), st.sampled_from(["a", "b"]), st.sampled_from(["", "[1]"]),
    st.integers(0, 2),
)  # fmt: skip
operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), state_keys, st.binary(max_size=3)),
        st.tuples(st.just("delete"), state_keys),
        st.tuples(st.just("get"), state_keys),
        st.tuples(
            st.just("write"),
            st.lists(st.tuples(state_keys, st.one_of(st.none(), st.binary(max_size=3)))),
        ),
        st.tuples(st.sampled_from(["scan", "keys"]), st.sampled_from(KINDS)),
    ),
    max_size=40,
)


@settings(max_examples=examples(200), deadline=None)
@given(operations)
def test_the_spark_store_answers_as_a_dict_does(ops: list[tuple]) -> None:
    tester = TwsTester(EngineProcessor(PARTS, Config(), "memo"))
    tester.handle.grouping_key = ("traffic",)  # as while Spark hands it a group
    maps = tester.handle.map_states
    store, model = SparkStore(maps[ENTRIES], maps[PIECES]), MemoryStore()
    for op, *args in ops:
        if op in ("put", "delete", "write"):
            getattr(store, op)(*args)
            getattr(model, op)(*args)
        elif op == "get":
            assert store.get(args[0]) == model.get(args[0])
        elif op == "scan":
            assert sorted(store.scan(args[0])) == sorted(model.scan(args[0]))
        else:
            assert sorted(store.keys(args[0])) == sorted(model.keys(args[0]))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_a_worker_without_the_pipeline_rebuilds_it_and_writes_the_same(
    tmp_path: Path, batches: Landed, seed: int
) -> None:
    count = len(batches.batches)
    assert count > 10
    kept = run(tmp_path / "kept", batches, forget=set())
    forget = set(random.Random(seed).sample(range(1, count), count // 3))
    rebuilt = run(tmp_path / "rebuilt", batches, forget=forget)
    assert kept["alerts"], "the readings must raise alerts"
    assert kept == rebuilt


@pytest.mark.slow
def test_readings_beyond_the_cap_on_live_keys_are_quarantined_alike_after_rebuilds(
    tmp_path: Path, batches: Landed
) -> None:
    """With room for 3 stations, the other stations' readings go to `quarantine` with
    the stream, the cap and the key; the health figures say so; a rebuilt pipeline
    quarantines the same ones."""
    engine = EngineConfig(max_live_keys=3)
    figures: list[dict] = []
    kept = run(tmp_path / "kept", batches, forget=set(), engine=engine, figures=figures)
    count = len(batches.batches)
    forget = set(random.Random(3).sample(range(1, count), count // 3))
    assert run(tmp_path / "rebuilt", batches, forget=forget, engine=engine) == kept
    reasons = [dict(row)["reason"] for row in kept["quarantine"].elements()]
    assert reasons and all(
        r.startswith("'stream traffic: max_live_keys = 3 reached by rule ") for r in reasons
    )
    assert all("; new key station=" in r for r in reasons)
    traffic = [f["streams"]["traffic"] for f in figures]
    assert sum(t["capped"] for t in traffic) == len(reasons)
    assert {t["max_live_keys"] for t in traffic} == {3}
    assert max(t["live_keys"] for t in traffic) == 3


ONE_CLOCK = "ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings'"


def traffic_rules(folder: Path, clock: str) -> RuleSet:
    """The library's traffic rules with the traffic stream's clock clause replaced."""
    text = RULES.read_text()
    assert text.count(ONE_CLOCK) == 1
    (folder / "traffic.sql").write_text(text.replace(ONE_CLOCK, clock))
    (folder / "stations.csv").write_bytes((RULES.parent / "stations.csv").read_bytes())
    return load_rules([folder / "traffic.sql"])


@pytest.mark.slow
def test_per_source_clocks_survive_rebuilds_and_a_source_years_ahead(tmp_path: Path) -> None:
    """A fourth station's clock nine years ahead: with a clock per source the other
    stations' readings raise the alerts they raise without it, a rebuilt pipeline
    writes the same, and the health figures show the stream's newest event time; with
    one clock they are set aside."""
    readings = arrival_order(make_readings(seed=5), seed=6, max_delay_ms=1_500)
    ahead = {**readings[200], "station": 4, "source": "station-4", "seq": 0}
    ahead["ts"] += 9 * 365 * 86_400_000
    with_ahead = [*readings[:200], ahead, *readings[200:]]
    (tmp_path / "per").mkdir()
    clock = ONE_CLOCK.replace("SOURCE", "PER SOURCE IDLE 30 SECONDS SOURCE")
    per_source = traffic_rules(tmp_path / "per", clock)
    landed = landing_batches(tmp_path / "a", with_ahead, 2, per_source)
    figures: list[dict] = []
    kept = run(tmp_path / "kept", landed, forget=set(), figures=figures, library=per_source)
    count = len(landed.batches)
    forget = set(random.Random(4).sample(range(1, count), count // 3))
    assert run(tmp_path / "rebuilt", landed, forget=forget, library=per_source) == kept
    assert kept["alerts"] and "late_readings" not in kept
    plain = landing_batches(tmp_path / "b", readings, 2, per_source)
    assert (
        run(tmp_path / "plain", plain, forget=set(), library=per_source)["alerts"] == kept["alerts"]
    )
    assert max(f["streams"]["traffic"]["max_event_ms"] for f in figures) == ahead["ts"]

    (tmp_path / "one").mkdir()
    one_clock = traffic_rules(tmp_path / "one", ONE_CLOCK)
    landed = landing_batches(tmp_path / "c", with_ahead, 2, one_clock)
    late = run(tmp_path / "late", landed, forget=set(), library=one_clock)
    assert sum(late["late_readings"].values()) > 100
