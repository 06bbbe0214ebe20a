"""The landing sequencer against the DESIGN §4 slack pin, computed by brute force.

Oracle: walk the landed lines in arrival order (file name, line); a reading is a
duplicate if its (source, seq) came before, late if its timestamp is below the highest
timestamp of every reading and heartbeat that arrived before it minus the slack, else on
time. The sequencer must agree line for line, however the lines are cut into batches
and in whatever order a batch hands them over.
"""

from __future__ import annotations

import random

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.plan import Column, ColumnType, StreamSchema
from engine.landing import LandingSequencer

SLACK = 2_000
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

# One landed line: (timestamp offset, source, seq, is heartbeat).
lines_strategy = st.lists(
    st.tuples(
        st.integers(0, 20_000),
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 15),
        st.sampled_from([False, False, False, False, True]),  # one line in five a heartbeat
    ),
    max_size=80,
)


def landed(
    entries: list[tuple[int, str, int, bool]], per_file: int
) -> list[tuple[str, str, bytes]]:
    """The entries as landing lines, `per_file` to a file, file names in arrival order."""
    out = []
    for i, (ts, source, seq, beat) in enumerate(entries):
        record = {"ts": 1_000_000 + ts, "source": source, "_line": i % per_file}
        if beat:
            record["_kind"] = "heartbeat"
        else:
            record.update(station=1, speed=10.0, seq=seq)
        out.append(("traffic", f"part-{i // per_file:08d}.jsonl", orjson.dumps(record)))
    return out


def oracle(entries: list[tuple[int, str, int, bool]]) -> list[tuple[str, str, int]]:
    """(verdict, source, seq) of every reading in arrival order, by brute force."""
    verdicts, seen, highest = [], set(), None
    for ts, source, seq, beat in entries:
        ts += 1_000_000
        if not beat:
            if (source, seq) in seen:
                verdicts.append(("duplicate", source, seq))
            elif highest is not None and ts < highest - SLACK:
                verdicts.append(("late", source, seq))
            else:
                verdicts.append(("on_time", source, seq))
            seen.add((source, seq))
        highest = ts if highest is None else max(highest, ts)
    return verdicts


def judged(entries, per_file: int, batches: int, seed: int) -> list[tuple[str, str, int]]:
    """Run the sequencer over the lines cut into batches, each batch shuffled."""
    lines = landed(entries, per_file)
    sequencer = LandingSequencer([TRAFFIC])
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(lines)), min(batches, len(lines) - 1))) if lines else []
    verdicts = []
    for start, end in zip([0, *cuts], [*cuts, len(lines)], strict=True):
        # Cuts may split a file: its lines still come in (file, line) order across batches.
        batch = lines[start:end]
        rng.shuffle(batch)
        out = sequencer.split(batch)
        on_time = {(r["source"], r["seq"]) for r in out.readings.get("traffic", [])}
        late = {(r["source"], r["seq"]) for r in out.late}
        ordered = sorted(lines[start:end], key=lambda ln: (ln[1], orjson.loads(ln[2])["_line"]))
        for _, _, text in ordered:
            record = orjson.loads(text)
            if record.get("_kind") == "heartbeat":
                continue
            ident = (record["source"], record["seq"])
            verdict = "on_time" if ident in on_time else "late" if ident in late else "duplicate"
            verdicts.append((verdict, *ident))
            on_time.discard(ident)
            late.discard(ident)
    return verdicts


@settings(max_examples=150, deadline=None)
@given(lines_strategy, st.integers(1, 7), st.integers(0, 6), st.integers(0, 10**6))
def test_verdicts_match_the_slack_pin(entries, per_file, batches, seed):
    assert judged(entries, per_file, batches, seed) == oracle(entries)


@settings(max_examples=150, deadline=None)
@given(lines_strategy, st.integers(1, 7), st.integers(0, 6), st.integers(0, 10**6))
def test_each_reading_carries_the_watermark_no_later_reading_is_below(
    entries, per_file, batches, seed
):
    """The stamp the rules runtime advances to: the highest event time arrived so far,
    this reading included, minus the slack; no on-time reading arriving later is older."""
    lines = landed(entries, per_file)
    sequencer = LandingSequencer([TRAFFIC])
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(lines)), min(batches, len(lines) - 1))) if lines else []
    stored = []  # (ts, stamp) of the on-time readings, in the order they were stored
    for start, end in zip([0, *cuts], [*cuts, len(lines)], strict=True):
        batch = lines[start:end]
        rng.shuffle(batch)
        for row in sequencer.split(batch).readings.get("traffic", []):
            stored.append((row["ts"], row["arrival_watermark"]))
    expected, highest = [], None
    verdicts = _with_beats(oracle(entries), entries)
    for (ts, _, _, beat), verdict in zip(entries, verdicts, strict=True):
        ts += 1_000_000
        highest = ts if highest is None else max(highest, ts)
        if not beat and verdict == "on_time":
            expected.append((ts, highest - SLACK))
    assert stored == expected
    for i, (_, stamp) in enumerate(stored):
        assert all(ts >= stamp for ts, _ in stored[i + 1 :])


def _with_beats(verdicts: list[tuple[str, str, int]], entries) -> list[str | None]:
    """The oracle's verdicts aligned with `entries` (None for a heartbeat)."""
    readings = iter(verdicts)
    return [None if beat else next(readings)[0] for *_, beat in entries]


def test_exactly_slack_behind_is_on_time_and_one_more_is_late():
    entries = [(10_000, "a", 1, False), (8_000, "a", 2, False), (7_999, "a", 3, False)]
    assert [v for v, _, _ in judged(entries, 5, 0, 0)] == ["on_time", "on_time", "late"]


def test_a_heartbeat_moves_the_watermark():
    entries = [(1_000, "a", 1, False), (10_000, "hb", 0, True), (5_000, "a", 2, False)]
    assert [v for v, _, _ in judged(entries, 5, 0, 0)] == ["on_time", "late"]


def test_late_rows_say_how_late_and_keep_the_reading():
    sequencer = LandingSequencer([TRAFFIC])
    out = sequencer.split(landed([(10_000, "a", 1, False), (3_000, "b", 7, False)], 10))
    (late,) = out.late
    assert late["late_by_ms"] == (1_010_000 - SLACK) - 1_003_000
    assert orjson.loads(late["reading"]) == {
        "station": 1,
        "speed": 10.0,
        "ts": 1_003_000,
        "source": "b",
        "seq": 7,
    }
    assert out.max_event_ms == {"traffic": 1_010_000}


def test_quarantine_lines_pass_through_with_their_reason():
    sequencer = LandingSequencer([TRAFFIC])
    line = orjson.dumps(
        {
            "topic": "t",
            "reason": "payload is not JSON",
            "payload": "{",
            "payload_b64": "ew==",
            "received_ms": 5,
            "_line": 0,
        }
    )
    out = sequencer.split([("_quarantine", "part-1.jsonl", line)])
    assert [q["reason"] for q in out.quarantine] == ["payload is not JSON"]
