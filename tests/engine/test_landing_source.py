"""The landing source's reader on real files, without Spark: Spark asks it for the
latest offset while planning a batch, for that batch's partition, whose task names the
batch's files; the stateful step reads and parses them (`read_landed`); `commit` runs
once the batch is done (the offsets' own protocol is `test_landing_offsets.py`'s). Files
are landed by ingest's `LandingWriter`, as in production, and every reading read back is
compared with what was landed.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import fs as pafs

from engine.core.pipeline import HEARTBEAT
from engine.core.plan import Column, ColumnType, StreamSchema
from engine.landed_files import read_landed, read_stream_file
from engine.spark.landing_source import LandingReader, source_options
from ingest.landing import LandingWriter
from lookout.config import S3Config
from tests.examples import examples

TRAFFIC = StreamSchema(
    "traffic",
    (Column("station", ColumnType.INT), Column("speed", ColumnType.DOUBLE),
     Column("ts", ColumnType.TIMESTAMP)),
    "ts",
    2_000,
)  # fmt: skip
RFID = StreamSchema(
    "rfid",
    (Column("station", ColumnType.INT), Column("speed", ColumnType.DOUBLE),
     Column("ts", ColumnType.TIMESTAMP)),
    "ts",
    2_000,
)  # fmt: skip


def land(writer: LandingWriter, stream: str, speeds: list[float]) -> list[Path]:
    readings = [
        {"station": 1, "speed": s, "ts": 1_000 + i, "source": "s", "seq": i}
        for i, s in enumerate(speeds)
    ]
    writer.add_readings(stream, readings, f"lookout/{stream}/1/readings", 0)
    return writer.flush()


def reader(root: Path, archive: Path | None = None) -> LandingReader:
    options = source_options(str(root), str(archive or ""), S3Config(), {"c": [TRAFFIC, RFID]}, "c")
    return LandingReader(options)


def read_batch(source: LandingReader, start: dict, end: dict) -> list[tuple[str, str, list]]:
    """(stream, file, speeds) of every file a batch reads: the files its partition names
    (read from a pickled copy of the reader, as an executor task would), read and parsed
    as the stateful step reads them."""
    out = []
    for partition in pickle.loads(pickle.dumps(source.partitions(start, end))):
        for batch in pickle.loads(pickle.dumps(source)).read(partition):
            for row in pa.Table.from_batches([batch]).to_pylist():
                assert row["component"] == "c"
                arrivals, quarantine = read_landed(
                    pafs.LocalFileSystem(), source.landing, [(row["file"], row["stream"])],
                    {"traffic": TRAFFIC, "rfid": RFID},
                )  # fmt: skip
                (table,) = arrivals.values()
                assert not quarantine and not any(table.column(HEARTBEAT).to_pylist())
                out.append((row["stream"], row["file"], table.column("speed").to_pylist()))
    return sorted(out)


def on_disk(files: list[Path], speeds: list[list[float]]) -> list[tuple[str, str, list]]:
    return sorted(
        (f.parent.name.removeprefix("stream="), f.name, s)
        for f, s in zip(files, speeds, strict=True)
    )


def test_a_batch_reads_the_new_files_once_and_a_rerun_reads_the_same(tmp_path):
    root = tmp_path / "landing"
    writer = LandingWriter(root, "test")
    first = land(writer, "traffic", [1.0, 2.0]) + land(writer, "rfid", [3.0])
    (root / "stream=traffic" / ".part-0-test-x-1.jsonl.tmp").write_bytes(b'{"half": ')
    source = reader(root)
    start = source.initialOffset()

    end = source.latestOffset(start, None)
    assert read_batch(source, start, end) == on_disk(first, [[1.0, 2.0], [3.0]])
    # Offsets are JSON in Spark's log: they must survive the round trip.
    assert json.loads(json.dumps(end)) == end

    # Nothing new: the same offset and no partitions (Spark then plans no batch).
    assert source.latestOffset(end, None) == end and source.partitions(end, end) == []

    # Files landed before the batch commits belong to the next batch only.
    second = land(writer, "traffic", [4.0, 5.0, 6.0])
    end2 = source.latestOffset(end, None)
    assert read_batch(source, end, end2) == on_disk(second, [[4.0, 5.0, 6.0]])

    # A restart re-runs a logged batch from its offsets: the same readings.
    assert read_batch(reader(root), start, end) == on_disk(first, [[1.0, 2.0], [3.0]])


@pytest.mark.parametrize("archived", [False, True], ids=["delete", "archive"])
def test_commit_removes_only_the_committed_files(tmp_path, archived):
    root, archive = tmp_path / "landing", tmp_path / "archive"
    writer = LandingWriter(root, "test")
    first = land(writer, "traffic", [1.0])
    contents = {f.name: f.read_bytes() for f in first}
    source = reader(root, archive if archived else None)
    end = source.latestOffset(source.initialOffset(), None)
    later = land(writer, "traffic", [2.0])

    source.commit(end)
    source.commit(end)  # Spark may commit an offset again after a restart

    assert not any(f.exists() for f in first)
    assert all(f.exists() for f in later)
    moved = {p.name: p.read_bytes() for p in archive.rglob("*.jsonl")}
    assert moved == (contents if archived else {})
    assert read_batch(source, end, source.latestOffset(end, None)) == on_disk(later, [[2.0]])


def test_quarantined_payloads_come_as_their_own_rows(tmp_path):
    root = tmp_path / "landing"
    writer = LandingWriter(root, "test")
    writer.add_rejection("lookout/x", "payload is not JSON", b"{", 5)
    writer.flush()
    source = reader(root)
    start = source.initialOffset()
    (partition,) = source.partitions(start, source.latestOffset(start, None))
    (batch,) = list(source.read(partition))
    (row,) = pa.Table.from_batches([batch]).to_pylist()
    assert row["stream"] == "_quarantine"
    files = [(row["file"], row["stream"])]
    arrivals, quarantine = read_landed(pafs.LocalFileSystem(), str(root), files, {})
    assert arrivals == {} and [q["reason"] for q in quarantine] == ["payload is not JSON"]


def test_a_batch_is_one_partition_naming_its_files_in_landing_order(tmp_path):
    root = tmp_path / "landing"
    writer = LandingWriter(root, "test")
    landed = [f for i in range(30) for f in land(writer, "traffic" if i % 3 else "rfid", [i])]
    source = reader(root)
    start = source.initialOffset()
    (partition,) = source.partitions(start, source.latestOffset(start, None))
    (batch,) = list(source.read(partition))
    rows = pa.Table.from_batches([batch]).to_pylist()
    assert [(r["stream"], r["file"]) for r in rows] == sorted(
        (f.parent.name.removeprefix("stream="), f.name) for f in landed
    )


def test_a_batchs_files_read_side_by_side_give_each_file_in_landing_order(tmp_path):
    """Files of different sizes, some with damaged lines, read by a thread per core: each
    stream's arrivals are its files' in landing order, and the quarantine rows come in
    the files' order, as reading them one after another gives them."""
    root = tmp_path / "landing"
    writer = LandingWriter(root, "test")
    for i in range(40):
        land(writer, "traffic" if i % 4 else "rfid", [float(i)] * (1 + (i * 7919) % 400))
    files = sorted(
        (path.name, path.parent.name.removeprefix("stream=")) for path in root.rglob("part-*.jsonl")
    )
    for k, (name, stream) in enumerate(files[::5]):  # a damaged line in every fifth file
        path = root / f"stream={stream}" / name
        path.write_bytes(path.read_bytes() + f'{{"damaged": {k}\n'.encode())
    schemas = {"traffic": TRAFFIC, "rfid": RFID}

    arrivals, quarantine = read_landed(pafs.LocalFileSystem(), str(root), files, schemas)

    expected: dict[str, list[pa.Table]] = {}
    lines = []
    for name, stream in files:
        data = (root / f"stream={stream}" / name).read_bytes()
        table, bad = read_stream_file(schemas[stream], name, data)
        expected.setdefault(stream, []).append(table)
        lines += bad
    assert {s: t.to_pylist() for s, t in arrivals.items()} == {
        s: pa.concat_tables(t).to_pylist() for s, t in expected.items()
    }
    assert all(t.column(0).num_chunks == 1 for t in arrivals.values())
    assert quarantine == lines and len(lines) == len(files[::5])


@pytest.mark.parametrize("blank", [b"", b"\n  \n"], ids=["", "after blank lines"])
def test_a_file_whose_first_line_names_no_topic_takes_none_from_the_file_before(tmp_path, blank):
    """A message's topic, on its first line, holds for the lines after it in its own
    file only: a file parsed with others gives what it gives alone (a foreign file, or a
    damaged first line, may start without one), blank lines in the file before or not."""
    root = tmp_path / "landing"
    writer = LandingWriter(root, "test")
    (first,) = land(writer, "traffic", [1.0, 2.0])
    first.write_bytes(first.read_bytes() + blank)
    (second,) = land(writer, "traffic", [3.0, 4.0])
    head, rest = second.read_bytes().split(b"\n", 1)
    line = json.loads(head)
    del line["_topic"], line["_received_ms"]
    second.write_bytes(json.dumps(line).encode() + b"\n" + rest)
    files = [(first.name, "traffic"), (second.name, "traffic")]

    arrivals, quarantine = read_landed(
        pafs.LocalFileSystem(), str(root), files, {"traffic": TRAFFIC}
    )

    alone = [read_stream_file(TRAFFIC, path.name, path.read_bytes())[0] for path in (first, second)]
    assert arrivals["traffic"].to_pylist() == pa.concat_tables(alone).to_pylist()
    assert (
        arrivals["traffic"].column("topic").to_pylist()
        == ["lookout/traffic/1/readings"] * 2 + [None] * 2
    )
    assert not quarantine


def test_listing_and_planning_import_no_parsing(tmp_path: Path) -> None:
    # The driver's runner of the source starts at every start of the query, and the
    # query waits for it: it lists files and plans batches, the stateful step parses.
    land(LandingWriter(tmp_path / "landing", "test"), "traffic", [1.0])
    pickled = tmp_path / "source.pickle"
    pickled.write_bytes(pickle.dumps(reader(tmp_path / "landing")))
    code = (
        "import pickle, sys; source = pickle.load(open(sys.argv[1], 'rb')); "
        "start = source.initialOffset(); "
        "assert source.partitions(start, source.latestOffset(start)); "
        "print(*sorted(m for m in sys.modules "
        "if m.startswith(('engine.landed_files', 'pyarrow.json', 'duckdb'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(pickled)], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == []


# A reading's values as ingest lands them: any value of the stream's types.
reading_values = st.tuples(
    st.integers(-(2**31), 2**31 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**62), 2**62),
    st.text(max_size=6),
)
# Messages: (topic, its readings, a heartbeat after it, the writer flushes after it).
landed_messages = st.lists(
    st.tuples(
        st.sampled_from(["traffic", "rfid"]),
        st.integers(0, 2),
        st.lists(reading_values, min_size=1, max_size=4),
        st.booleans(),
        st.booleans(),
    ),
    min_size=1,
    max_size=16,
)


@settings(max_examples=examples(60), deadline=None)
@given(landed_messages)
def test_a_streams_files_parsed_together_give_what_ingest_landed(tmp_path_factory, messages):
    """Each stream's files of a batch are parsed in one go: every reading comes back with
    its values, its message's topic and time of receipt, in landing order, and every
    heartbeat as a heartbeat without a topic (landed by ingest's writer, compared with
    what it was handed, not with another parser)."""
    root = tmp_path_factory.mktemp("landing")
    writer = LandingWriter(root, "test")
    expected: dict[str, list[tuple]] = {"traffic": [], "rfid": []}
    for number, (stream, topic, values, beat, flush) in enumerate(messages):
        readings = []
        for station, speed, ts, source in values:
            seq = sum(len(v) for v in expected.values())
            readings.append({"station": station, "speed": speed, "ts": ts, "source": source,
                             "seq": seq})  # fmt: skip
            expected[stream].append(
                (station, speed, ts, source, seq, False, f"t/{topic}", 1_000 + number)
            )
        writer.add_readings(stream, readings, f"t/{topic}", 1_000 + number)
        if beat:
            writer.add_heartbeat(stream, {"source": "s", "ts": number}, 5_000 + number)
            expected[stream].append((None, None, number, "s", None, True, None, 5_000 + number))
        if flush:
            writer.flush()
    writer.flush()
    files = sorted(
        (path.name, path.parent.name.removeprefix("stream=")) for path in root.rglob("part-*.jsonl")
    )

    arrivals, quarantine = read_landed(
        pafs.LocalFileSystem(), str(root), files, {"traffic": TRAFFIC, "rfid": RFID}
    )

    columns = ("station", "speed", "ts", "source", "seq", HEARTBEAT, "topic", "received_ms")
    got = {
        stream: list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))
        for stream, table in arrivals.items()
    }
    assert got == {stream: rows for stream, rows in expected.items() if rows}
    assert not quarantine
