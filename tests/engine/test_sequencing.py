"""Arrivals judged by the pipeline against the slack and identity pins, by brute force.

Oracle, over the landed lines in arrival order (file name, line): a reading's id is
(source, epoch, seq). The first reading with an id is late if its timestamp is below the
highest timestamp of every reading and heartbeat that arrived before it minus the slack,
else on time. A later reading with the same id is a duplicate if it carries the same
values as the first one, else a conflict. Files are landed by ingest's writer and read
back by the engine's reader, and the pipeline must agree line for line however the files
are cut into batches, with its state saved and rebuilt from the store between batches
(an engine restart).
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import duckdb
import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine import landed_files
from engine.core.pipeline import Pipeline
from engine.core.plan import Column, ColumnType, Plan, Query, Sink, SinkKind, StreamSchema
from engine.core.replay import run
from engine.core.sequencer import StreamSequencer, Verdict, content_hashes
from engine.core.state import MemoryStore
from engine.landed_files import RECEIVED_MS, TOPIC, read_quarantine_file, read_stream_file
from ingest.landing import LandingWriter
from tests.engine.helpers import select
from tests.examples import examples

SLACK = 2_000
BASE = 1_000_000
TRAFFIC = StreamSchema(
    "traffic",
    (
        Column("station", ColumnType.INT),
        Column("speed", ColumnType.DOUBLE),
        Column("ts", ColumnType.TIMESTAMP),
    ),
    "ts",
    SLACK,
    "lookout/traffic/+/readings",
)
PLAN = Plan(
    {"traffic": TRAFFIC},
    (Query(Sink("copy", SinkKind.STREAM), "traffic", post=(select("source", "seq", "ts"),)),),
)

# One landed line: (timestamp offset, source, epoch, seq, speed, is heartbeat).
Entry = tuple[int, str, str, int, float, bool]
entries_strategy = st.lists(
    st.tuples(
        st.integers(0, 40).map(lambda n: n * 500),  # on a grid: readings exactly at the slack
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["", "", "e1"]),
        st.integers(0, 12),
        st.sampled_from([1.0, 1.0, 1.0, 2.0]),  # a repeated id mostly repeats its values
        st.sampled_from([False, False, False, False, True]),  # one line in five a heartbeat
    ),
    max_size=80,
)


def land(root: Path, entries: list[Entry], per_file: int) -> list[Path]:
    """The entries as ingest lands them, `per_file` lines to a file, in arrival order."""
    writer = LandingWriter(root, "test")
    files: list[Path] = []
    for start in range(0, len(entries), per_file):
        for ts, source, epoch, seq, speed, beat in entries[start : start + per_file]:
            if beat:
                writer.add_heartbeat("traffic", {"source": source, "ts": BASE + ts}, 0)
                continue
            reading = {"station": 1, "speed": speed, "ts": BASE + ts, "source": source, "seq": seq}
            if epoch:
                reading["epoch"] = epoch
            writer.add_readings("traffic", [reading], "lookout/traffic/1/readings", 0)
        files += writer.flush()
    return sorted(files)


def oracle(entries: list[Entry]) -> list[str | None]:
    """Each entry's verdict in arrival order, by brute force (None for a heartbeat)."""
    verdicts: list[str | None] = []
    first: dict[tuple[str, str, int], float] = {}
    highest = None
    for ts, source, epoch, seq, speed, beat in entries:
        ts += BASE
        if beat:
            verdicts.append(None)
        elif (source, epoch, seq) in first:
            same = first[(source, epoch, seq)] == (ts, speed)
            verdicts.append("duplicate" if same else "conflict")
        else:
            late = highest is not None and ts < highest - SLACK
            verdicts.append("late" if late else "on_time")
            first[(source, epoch, seq)] = (ts, speed)
        highest = ts if highest is None else max(highest, ts)
    return verdicts


def judged(files: list[Path], batches: int, seed: int) -> tuple[list[tuple], list[int]]:
    """(verdict, source, epoch, seq) of every reading, from a pipeline run over the files
    cut into batches and rebuilt from its store between them; and the arrival stamps of
    the on-time readings in the order they were stored."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(files)), min(batches, max(len(files) - 1, 0))))
    store = MemoryStore()
    verdicts: list[tuple] = []
    stamps: list[tuple[int, int]] = []
    for start, end in zip([0, *cuts], [*cuts, len(files)], strict=True):
        pipeline = Pipeline(PLAN, store=store)  # a restart before every batch
        tables = [read_stream_file(TRAFFIC, f.name, f.read_bytes())[0] for f in files[start:end]]
        result = pipeline.process({"traffic": pa.concat_tables(tables)} if tables else {})
        pipeline.save()
        kept = result.readings.get("traffic")
        if kept is not None:
            stamps += zip(
                kept.column("ts").to_pylist(),
                kept.column("arrival_watermark").to_pylist(),
                strict=True,
            )
            verdicts += [
                ("on_time", r["source"], r["epoch"], r["seq"], r["ts"]) for r in kept.to_pylist()
            ]
        verdicts += [("late", x.row["source"], x.row.get("epoch", ""), x.row["seq"], x.ts)
                     for x in result.late]  # fmt: skip
        verdicts += [("conflict", x.row["source"], x.row.get("epoch", ""), x.row["seq"], x.ts)
                     for x in result.conflicts]  # fmt: skip
        verdicts += [("duplicate",)] * result.duplicates.get("traffic", 0)
    return verdicts, stamps


@settings(max_examples=examples(150), deadline=None)
@given(entries_strategy, st.integers(1, 7), st.integers(0, 6), st.integers(0, 10**6))
def test_verdicts_match_the_pins(tmp_path_factory, entries, per_file, batches, seed):
    files = land(tmp_path_factory.mktemp("landing"), entries, per_file)
    verdicts, _ = judged(files, batches, seed)
    expected = oracle(entries)
    want = sorted(
        (v, e[1], e[2], e[3], BASE + e[0]) if v != "duplicate" else (v,)
        for v, e in zip(expected, entries, strict=True)
        if v is not None
    )
    assert sorted(verdicts) == want


@settings(max_examples=examples(100), deadline=None)
@given(entries_strategy, st.integers(1, 7), st.integers(0, 6), st.integers(0, 10**6))
def test_each_reading_carries_the_watermark_no_later_reading_is_below(
    tmp_path_factory, entries, per_file, batches, seed
):
    """The stamp: the highest event time arrived so far, this reading included, minus
    the slack; no on-time reading arriving later is older."""
    files = land(tmp_path_factory.mktemp("landing"), entries, per_file)
    _, stamps = judged(files, batches, seed)
    expected, highest = [], None
    for (ts, *_, beat), verdict in zip(entries, oracle(entries), strict=True):
        ts += BASE
        highest = ts if highest is None else max(highest, ts)
        if not beat and verdict == "on_time":
            expected.append((ts, highest - SLACK))
    assert stamps == expected
    for i, (_, stamp) in enumerate(stamps):
        assert all(ts >= stamp for ts, _ in stamps[i + 1 :])


def verdicts_of(tmp_path: Path, entries: list[Entry]) -> list[str]:
    files = land(tmp_path, entries, 5)
    found, _ = judged(files, 0, 0)
    return [v[0] for v in found]


def test_exactly_slack_behind_is_on_time_and_one_more_is_late(tmp_path):
    entries = [(10_000, "a", "", 1, 1.0, False), (8_000, "a", "", 2, 1.0, False),
               (7_999, "a", "", 3, 1.0, False)]  # fmt: skip
    assert verdicts_of(tmp_path, entries) == ["on_time", "on_time", "late"]


def test_a_heartbeat_moves_the_watermark(tmp_path):
    entries = [(1_000, "a", "", 1, 1.0, False), (10_000, "hb", "", 0, 1.0, True),
               (5_000, "a", "", 2, 1.0, False)]  # fmt: skip
    assert verdicts_of(tmp_path, entries) == ["on_time", "late"]


def test_a_restarted_source_under_a_new_epoch_sends_new_readings(tmp_path):
    # A gateway restarts its seq: under a new epoch its readings are new data.
    entries = [
        (t * 1_000, "a", boot, seq, 1.0, False)
        for t, (boot, seq) in enumerate([("boot1", 1), ("boot1", 2), ("boot2", 1), ("boot2", 2)])
    ]
    assert verdicts_of(tmp_path, entries) == ["on_time"] * 4


def test_a_repeated_id_with_other_values_is_a_conflict_never_a_copy(tmp_path):
    entries = [(1_000, "a", "", 1, 1.0, False), (1_000, "a", "", 1, 1.0, False),
               (5_000, "a", "", 1, 9.0, False)]  # fmt: skip
    files = land(tmp_path, entries, 5)
    pipeline = Pipeline(PLAN)
    arrivals = pa.concat_tables(
        [read_stream_file(TRAFFIC, f.name, f.read_bytes())[0] for f in files]
    )
    result = pipeline.process({"traffic": arrivals})
    assert result.duplicates == {"traffic": 1}
    (conflict,) = result.conflicts
    assert (conflict.ts, conflict.original_ts) == (BASE + 5_000, BASE + 1_000)
    assert conflict.row["speed"] == 9.0 and "other values" in conflict.reason


@given(
    arrivals=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 30)),
                      min_size=1, max_size=40, unique=True),
    keep=st.integers(0, 12),
    batches=st.integers(1, 4),
    rebuilt=st.booleans(),
)  # fmt: skip
def test_a_sequencer_keeps_the_values_of_its_latest_readings_only(arrivals, keep, batches, rebuilt):
    """Readings judged in one to four batches (a seal after each, and with ``rebuilt``
    the sequencer then rebuilt from its state and kept segments, as after a restart),
    then each sent again with its values: a repeat is a duplicate exactly while its
    first reading's values are kept (else a conflict, too far back to compare). At most
    ``recent_ids`` values are kept, in whole segments, the newest segment always: the
    latest arrivals of the last batch, as many as ``recent_ids`` allows."""
    sequencer = StreamSequencer(SLACK, recent_ids=keep)
    n = len(arrivals)

    def judge(at: list[int]) -> np.ndarray:
        ts = np.full(len(at), BASE, dtype=np.int64)
        judged = sequencer.judge(
            ts,
            np.zeros(len(at), dtype=bool),
            pa.array([arrivals[i][0] for i in at]),
            pa.array([""] * len(at)),
            np.array([arrivals[i][1] for i in at], dtype=np.int64),
            np.array([7 * arrivals[i][1] + 1 for i in at], dtype=np.uint64),
        )
        return judged.verdicts

    cuts = sorted({0, n, *(n * k // batches for k in range(1, batches))})
    for start, end in itertools.pairwise(cuts):
        assert (judge(list(range(start, end))) == Verdict.ON_TIME).all()
        sequencer.seal()
        if rebuilt:
            segments = [(g.number, (g.ids, g.contents, g.ts)) for g in sequencer._segments]
            sequencer = StreamSequencer.from_state(SLACK, sequencer.state(), segments)
            sequencer.recent_ids = keep
    kept = sum(len(segment.ids) for segment in sequencer._segments)
    last = min(keep, cuts[-1] - cuts[-2])
    assert last <= kept <= keep
    again = judge(list(range(n)))
    assert set(again.tolist()) <= {Verdict.DUPLICATE, Verdict.CONFLICT}
    assert (again == Verdict.DUPLICATE).sum() == kept
    assert (again[n - last :] == Verdict.DUPLICATE).all()


def test_late_readings_say_how_late_and_keep_the_reading(tmp_path):
    files = land(tmp_path, [(10_000, "a", "", 1, 1.0, False), (3_000, "b", "", 7, 1.0, False)], 5)
    arrivals = read_stream_file(TRAFFIC, files[0].name, files[0].read_bytes())[0]
    (late,) = Pipeline(PLAN).process({"traffic": arrivals}).late
    assert late.lateness_ms == (BASE + 10_000 - SLACK) - (BASE + 3_000)
    assert {k: late.row[k] for k in ("station", "speed", "ts", "source", "seq")} == {
        "station": 1, "speed": 1.0, "ts": BASE + 3_000, "source": "b", "seq": 7,
    }  # fmt: skip


def test_replay_numbers_readings_without_identity_by_arrival() -> None:
    readings = [("traffic", {"station": 1, "speed": 1.0, "ts": 1_000}) for _ in range(3)]
    result = run(PLAN, readings)
    assert [o.row["seq"] for o in result.outputs] == [0, 1, 2]
    assert result.duplicates == {} and result.conflicts == []


def test_quarantine_lines_pass_through_with_their_reason():
    line = orjson.dumps({"topic": "t", "reason": "payload is not JSON", "payload": "{",
                         "payload_b64": "ew==", "received_ms": 5, "_line": 0})  # fmt: skip
    assert [q["reason"] for q in read_quarantine_file("part-1.jsonl", line)] == [
        "payload is not JSON"
    ]


def test_a_damaged_landed_line_is_quarantined_naming_its_file_and_line(tmp_path):
    good = orjson.dumps({"station": 1, "speed": 1.0, "ts": BASE, "source": "a", "seq": 1})
    data = good + b"\n{not json\n" + good.replace(b'"seq":1', b'"seq":2')
    arrivals, damaged = read_stream_file(TRAFFIC, "part-9.jsonl", data)
    assert arrivals.column("seq").to_pylist() == [1, 2]
    (bad,) = damaged
    assert "part-9.jsonl line 2" in bad["reason"] and bad["payload"] == "{not json"


# Messages as ingest lands them: (topic number, readings in it, a heartbeat after it).
messages_strategy = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 4), st.booleans()), min_size=1, max_size=12
)


@settings(max_examples=examples(100), deadline=None)
@given(messages_strategy)
def test_each_reading_has_its_message_s_topic_and_time_of_receipt(tmp_path_factory, messages):
    """Ingest writes a message's topic and time of receipt on its first line only; read
    back, every reading has its own message's."""
    writer = LandingWriter(tmp_path_factory.mktemp("landing"), "t")
    expected, seq = [], 0
    for number, (topic, size, beat) in enumerate(messages):
        received = BASE + number
        readings = []
        for _ in range(size):
            reading = {"station": 1, "speed": 1.0, "ts": BASE + seq, "source": "a", "seq": seq}
            readings.append(reading)
            expected.append((seq, f"t/{topic}", received))
            seq += 1
        writer.add_readings("traffic", readings, f"t/{topic}", received)
        if beat:
            writer.add_heartbeat("traffic", {"source": "a", "ts": BASE + seq}, received)
    (file,) = writer.flush()
    arrivals, damaged = read_stream_file(TRAFFIC, file.name, file.read_bytes())
    readings = arrivals.filter(pc.invert(arrivals.column("heartbeat")))
    got = zip(*(readings.column(c).to_pylist() for c in ("seq", TOPIC, RECEIVED_MS)), strict=True)
    assert list(got) == expected and not damaged


def test_a_message_s_topic_never_reaches_past_a_damaged_line(tmp_path):
    """A damaged line may have been the next message's first: the lines after it that
    carry no topic get none, never the message's before it."""
    first = {"station": 1, "speed": 1.0, "ts": BASE, "source": "a"}
    lines = [
        orjson.dumps({**first, "seq": 1, "_topic": "t/1", "_received_ms": 7}),
        orjson.dumps({**first, "seq": 2}),
        b'{"station": 1, "speed": 1.0, "ts": 1, "source": "a", "seq": 3, "_topic": "t/2"',
        orjson.dumps({**first, "seq": 4}),
        orjson.dumps({**first, "seq": 5, "_topic": "t/3", "_received_ms": 9}),
        orjson.dumps({**first, "seq": 6}),
    ]
    arrivals, damaged = read_stream_file(TRAFFIC, "part-1.jsonl", b"\n".join(lines))
    got = zip(*(arrivals.column(c).to_pylist() for c in ("seq", TOPIC, RECEIVED_MS)), strict=True)
    assert list(got) == [
        (1, "t/1", 7),
        (2, "t/1", 7),
        (4, None, None),
        (5, "t/3", 9),
        (6, "t/3", 9),
    ]
    assert len(damaged) == 1 and "part-1.jsonl line 3" in damaged[0]["reason"]


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(st.lists(st.one_of(st.none(), st.text(max_size=4)), max_size=12), max_size=4),
    st.lists(st.one_of(st.none(), st.integers(-5, 5)), max_size=48),
    st.lists(st.one_of(st.none(), st.floats(allow_nan=False)), max_size=48),
)
# pandas' factorizing took "\x00" for "" (C strings): hypothesis found it.
@example(chunks=[[None, "\x00"]], numbers=[], floats=[])
@example(chunks=[[None]], numbers=[], floats=[-0.0])
def test_content_hashes_hash_each_rows_text_as_itself(chunks, numbers, floats) -> None:
    """A column's digests equal those of every row's value hashed alone by pandas'
    ``hash_array`` (NULL as "" or 0, marked apart), mixed column after column: what a
    restarted engine compares a redelivery with must not change with the batch's other
    values, nor with the code that computes it. A text column's distinct values are
    hashed once per chunk; numbers of every width as 64 bits."""
    texts = pa.chunked_array([pa.array(c, pa.string()) for c in chunks], pa.string())
    table = pa.table({"name": texts})
    flat = [v for c in chunks for v in c]
    if len(numbers) >= len(flat):
        table = table.append_column("n", pa.array(numbers[: len(flat)], pa.int64()))
        table = table.append_column("narrow", pa.array(numbers[: len(flat)], pa.int32()))
    if len(floats) >= len(flat):
        table = table.append_column("f", pa.array(floats[: len(flat)], pa.float64()))
    digest = np.full(len(flat), 0x9E3779B97F4A7C15, dtype=np.uint64)
    for column in table.columns:
        values = column.to_pylist()
        nulls = np.array([v is None for v in values], dtype=bool)
        if pa.types.is_integer(column.type):
            hashed = pd.util.hash_array(np.array([v or 0 for v in values], dtype=np.int64))
        elif pa.types.is_floating(column.type):
            # NULL as 0.0, and -0.0 as itself (``v or 0.0`` took it for 0.0).
            filled = [0.0 if v is None else v for v in values]
            hashed = pd.util.hash_array(np.array(filled, dtype=np.float64))
        else:
            hashed = np.array(
                [pd.util.hash_array(np.array(["" if v is None else v], dtype=object))[0]
                 for v in values], dtype=np.uint64,
            )  # fmt: skip
        hashed = hashed ^ (nulls.astype(np.uint64) * np.uint64(0x632BE59BD9B4E019))
        # pandas hashes 64-bit numbers by splitmix64's finaliser, as the digest mixes.
        digest = pd.util.hash_array(digest ^ hashed)
    assert content_hashes(table).tolist() == digest.tolist()


# Lines a landed file must not hold: not JSON, not an object, values that do not convert.
damaged_lines = st.sampled_from(
    [
        b'{"station": 1, "speed": 1.0, "ts": 5, "sou',
        b"[1, 2]",
        b'"a reading"',
        b'{"station": "one", "speed": 1.0, "ts": 5, "source": "a", "seq": 9}',
        b'{"station": 3000000000, "speed": 1.0, "ts": 5, "source": "a", "seq": 9}',
        b'{"station": 1, "speed": {"kmh": 1}, "ts": 5, "source": "a", "seq": 9}',
        b'{"station": 1, "speed": 1.0, "ts": "soon", "source": "a", "seq": 9}',
    ]
)


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(1, 300), st.lists(st.tuples(st.integers(0, 299), damaged_lines), max_size=8))
def test_each_damaged_line_is_quarantined_alone_and_every_other_line_read(good, damaged):
    """A file with damaged lines anywhere, several side by side: exactly those lines are
    quarantined, each naming its own line, and every good line is read, in order."""
    good_lines = [
        orjson.dumps({"station": 1, "speed": 1.0, "ts": BASE + i, "source": "a", "seq": i})
        for i in range(good)
    ]
    lines = list(good_lines)
    for position, line in sorted(damaged, reverse=True):
        lines.insert(min(position, len(lines)), line)
    expected_bad = [n for n, line in enumerate(lines, start=1) if line not in good_lines]

    arrivals, bad = read_stream_file(TRAFFIC, "part-3.jsonl", b"\n".join(lines))

    assert arrivals.column("seq").to_pylist() == list(range(good))
    assert [q["reason"].split(" is not")[0] for q in bad] == [
        f"landed file part-3.jsonl line {n}" for n in expected_bad
    ]


def test_a_value_that_does_not_convert_is_quarantined_saying_which():
    good = orjson.dumps({"station": 1, "speed": 1.0, "ts": BASE, "source": "a", "seq": 1})
    data = good + b'\n{"station": "one", "speed": 1.0, "ts": 5, "source": "a", "seq": 2}\n'
    arrivals, damaged = read_stream_file(TRAFFIC, "part-4.jsonl", data)
    assert arrivals.column("seq").to_pylist() == [1]
    (bad,) = damaged
    assert bad["reason"] == (
        'landed file part-4.jsonl line 2 is not a landed record: station "one" does not '
        "convert to INTEGER"
    )


def test_a_file_of_lines_whose_values_do_not_convert_is_quarantined_in_one_pass(monkeypatch):
    """Every line refused for its values: each is quarantined naming its value, found
    by one lenient parse, not by halving the file (a parse or two, not thousands)."""
    parses = []
    strict = landed_files._parse
    monkeypatch.setattr(landed_files, "_parse", lambda *a, **k: parses.append(1) or strict(*a, **k))
    lines = [
        orjson.dumps({"station": "one", "speed": 1.0, "ts": BASE + i, "source": "a", "seq": i})
        for i in range(2_000)
    ]
    arrivals, damaged = read_stream_file(TRAFFIC, "part-6.jsonl", b"\n".join(lines))
    assert arrivals.num_rows == 0
    assert [q["reason"] for q in damaged] == [
        f'landed file part-6.jsonl line {n} is not a landed record: station "one" does not '
        "convert to INTEGER"
        for n in range(1, 2_001)
    ]
    assert len(parses) <= 3


def reading(seq: int, **values: object) -> bytes:
    return orjson.dumps({"station": 1, "speed": 1.0, "ts": BASE + seq, "source": "a", "seq": seq,
                         **values})  # fmt: skip


# Lines a strict parser, a lenient one and orjson judge differently: DuckDB's reader
# takes a trailing comma and NaN (orjson does not), its strict conversion refuses "1.5"
# for an INTEGER (its lenient one takes it), duplicate keys (orjson takes them).
odd_lines = st.sampled_from(
    [
        b'{"station": 1, "speed": 1.0, "ts": 1000005, "source": "a", "seq": 5,}',
        b'{"station": 1, "speed": NaN, "ts": 1000006, "source": "a", "seq": 6}',
        b'{"station": "1.5", "speed": 1.0, "ts": 1000007, "source": "a", "seq": 7}',
        b'{"station": "8", "speed": "8.5", "ts": 1000008, "source": "a", "seq": 8}',
        b'{"station": 1, "speed": 1.0, "ts": 1000009, "source": "a", "seq": 9, "seq": 10}',
        b'{"station": 1, "speed": 1.0, "ts": 1000011, "source": "a\xff", "seq": 11}',
        b'{"station": 1, "speed": 1e400, "ts": 1000012, "source": "a", "seq": 12}',
    ]
)


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.one_of(odd_lines, damaged_lines, st.integers(100, 120).map(reading)),
                min_size=1, max_size=12))  # fmt: skip
def test_a_lines_fate_is_its_own_whatever_its_neighbours(lines):
    """Each line of a file is read, or quarantined, as it is when it is the file's only
    line: whether a neighbour sends the file down the slow path changes nothing."""
    alone = [read_stream_file(TRAFFIC, "one.jsonl", line) for line in lines]
    arrivals, bad = read_stream_file(TRAFFIC, "part-7.jsonl", b"\n".join(lines))
    # Compared as text: a NaN speed equals no value, itself included.
    assert repr(arrivals.to_pylist()) == repr([r for table, _ in alone for r in table.to_pylist()])
    assert [q["reason"].split(" is not")[0] for q in bad] == [
        f"landed file part-7.jsonl line {n}" for n, (_, q) in enumerate(alone, start=1) if q
    ]


def test_an_error_of_duckdb_that_is_not_about_the_lines_stops_the_read(monkeypatch):
    """Running out of memory (or a closed connection, a missing module) says nothing of
    the lines: it propagates, and no line is quarantined for it."""
    starved = duckdb.connect(config={"memory_limit": "256KB", "threads": 1})
    monkeypatch.setattr(landed_files, "_duckdb", lambda: starved)
    lines = [
        orjson.dumps({"station": 1, "speed": 1.0, "ts": BASE + i, "source": "a", "seq": i})
        for i in range(3_000)
    ]
    with pytest.raises(duckdb.OutOfMemoryException):
        read_stream_file(TRAFFIC, "part-5.jsonl", b"\n".join(lines))
