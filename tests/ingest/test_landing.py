"""The landing writer: atomic files, arrival order inside a file, names that never collide."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ingest.landing import QUARANTINE, LandingWriter, json_lines, quarantine_record
from tests.ingest.helpers import kept_payload


def lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_one_file_per_stream_per_flush_in_arrival_order(tmp_path: Path) -> None:
    writer = LandingWriter(tmp_path, "a")
    writer.add_readings("traffic", [{"seq": 1, "ts": 5}, {"seq": 2, "ts": 6}], "t/1", 100)
    writer.add_heartbeat("traffic", {"source": "s", "ts": 6}, 101)
    writer.add_readings("traffic", [{"seq": 3, "ts": 7}], "t/2", 102)
    writer.add_rejection("t/9", "bad", b"\xff{", 103)
    assert len(writer) == 5
    traffic, quarantine = writer.flush()
    assert len(writer) == 0 and writer.flush() == []

    assert traffic.parent.name == "stream=traffic"
    # A message's topic and time of receipt are on its first line only.
    assert lines(traffic) == [
        {"seq": 1, "ts": 5, "_topic": "t/1", "_received_ms": 100},
        {"seq": 2, "ts": 6},
        {"source": "s", "ts": 6, "_kind": "heartbeat", "_received_ms": 101},
        {"seq": 3, "ts": 7, "_topic": "t/2", "_received_ms": 102},
    ]
    (rejected,) = lines(quarantine)
    assert quarantine.parent.name == f"stream={QUARANTINE}"
    assert rejected["payload_b64"] == "/3s=" and rejected["reason"] == "bad"
    assert not list(tmp_path.rglob(".*.tmp"))


def test_two_writers_with_one_id_never_collide_and_sort_by_time(tmp_path: Path) -> None:
    names = []
    for _ in range(3):
        for writer in (LandingWriter(tmp_path, "a"), LandingWriter(tmp_path, "a")):
            writer.add_readings("traffic", [{"seq": 1}], "t", 1)
            names += [p.name for p in writer.flush()]
    assert len(set(names)) == 6
    assert names == sorted(names)  # later files sort later: arrival order is (file, line)


def test_orphans_of_this_ingester_are_removed(tmp_path: Path) -> None:
    folder = tmp_path / "stream=traffic"
    folder.mkdir()
    mine = folder / ".part-00000000000000000001-a-abcdef-00000001.jsonl.tmp"
    theirs = folder / ".part-00000000000000000001-b-abcdef-00000001.jsonl.tmp"
    dashed = folder / ".part-00000000000000000001-x-a-abcdef-00000001.jsonl.tmp"
    for path in (mine, theirs, dashed):
        path.write_text("half")
    assert LandingWriter(tmp_path, "a").remove_orphans() == [mine]
    assert theirs.exists() and dashed.exists() and not mine.exists()
    assert LandingWriter(tmp_path, "x-a").remove_orphans() == [dashed]


TRICKY_TEXT = st.text(alphabet='{},:"\\\n ab', max_size=12)


@example(records=[{"0": "},{"}, {"a": 1}])
@example(records=[{"},{": 1}, {"a": "x},{"}])
@given(
    records=st.lists(
        st.dictionaries(
            TRICKY_TEXT.filter(bool) | st.text(min_size=1, max_size=6),
            st.one_of(
                TRICKY_TEXT,
                st.integers(-(2**63), 2**63 - 1),
                st.floats(allow_nan=False, allow_infinity=False),
                st.booleans(),
                st.none(),
            ),
            min_size=1,
            max_size=5,
        ),
        min_size=1,
        max_size=8,
    )
)
def test_json_lines_splits_only_between_records(records: list[dict]) -> None:
    """Keys and strings full of braces, commas and quotes never split a record."""
    assert [orjson.loads(line) for line in json_lines(records).split(b"\n")] == records


def test_quarantine_keeps_a_bounded_prefix_with_the_size_and_hash(tmp_path: Path) -> None:
    """Before: a 100 KB payload was stored whole, as text and again as base64 (233 KB)."""
    writer = LandingWriter(tmp_path, "a", quarantine_payload_bytes=4096)
    big = b'{"station": "' + b"9" * 100_000 + b'"}'
    writer.add_rejection("t/1", "payload is 100015 bytes; the limit is 1000", big, 1)
    (path,) = writer.flush()
    assert path.stat().st_size < 4096 + 300
    (line,) = lines(path)
    assert line["payload"].encode() == big[:4096] and line["payload_b64"] is None
    assert line["payload_bytes"] == len(big)
    assert line["payload_sha256"] == hashlib.sha256(big).hexdigest()


@pytest.mark.parametrize(
    "payload",
    [b"\x00" * 3000, b"\x01\x02" * 1500, b"\xff" * 3000, b'"' * 3000, b"\\" * 3000],
    ids=["NUL", "control", "not UTF-8", "quotes", "backslashes"],
)
def test_quarantine_never_stores_more_than_twice_the_kept_bytes(
    tmp_path: Path, payload: bytes
) -> None:
    """Before: NUL bytes took 7.3 times their size (six as escaped text, 1.33 as base64)."""
    writer = LandingWriter(tmp_path, "a")
    writer.add_rejection("t/1", "bad", payload, 1)
    (path,) = writer.flush()
    assert path.stat().st_size < 2 * len(payload) + 300
    (line,) = lines(path)
    assert kept_payload(line) == payload
    assert (line["payload"] is None) != (line["payload_b64"] is None)


def test_a_cut_inside_a_character_keeps_the_text_whole(tmp_path: Path) -> None:
    payload = "é".encode() * 3000  # two bytes each: a cut at an odd byte splits one
    record = quarantine_record("t", "bad", payload, keep_bytes=4095)
    assert record["payload"] == "é" * 2047 and record["payload_bytes"] == 6000
