"""Per-source clocks (`SLACK d PER SOURCE IDLE i`, `engine.core.sequencer.SourceClocks`).

The brute force below is written from the definition in docs/engine.md (*Per-source
clocks*), arrival after arrival, with no state beyond the arrivals themselves: per
arrival, what it is judged against, whether it is heard, what it credits, and the
stream's watermark after it. Hypothesis draws multi-source streams with disorder around
the slack, sources that go silent past the idle timeout and come back, clock jumps, a
source years ahead, per-source and sourceless heartbeats; the sequencer and the pipeline
must agree with the brute force arrival by arrival, however the arrivals are cut into
batches, with the state saved and rebuilt between batches and idle sources forgotten.
"""

from __future__ import annotations

import pickle
import random

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.clocks import SourceClocks
from engine.core.pipeline import HEARTBEAT, Pipeline
from engine.core.plan import (
    END_OF_TIME,
    Column,
    ColumnType,
    Plan,
    Query,
    Sink,
    SinkKind,
    StreamSchema,
)
from engine.core.sequencer import Judgement, StreamSequencer, Verdict
from engine.core.state import MemoryStore
from tests.engine.helpers import select
from tests.examples import examples

SLACK = 2_000
IDLE = 5_000
BASE = 1_000_000_000
YEAR = 365 * 86_400_000
NONE = -END_OF_TIME

# One arrival: (source, event time, is a heartbeat). Source "" with a heartbeat: the
# stream's own heartbeat.
Arrival = tuple[str, int, bool]


def brute_force(arrivals: list[Arrival], slack: int, idle: int) -> list[tuple[int, int, int]]:
    """Per arrival: (what it is judged against, the watermark before it, after it)."""
    watermark = NONE
    top: dict[str, int] = {}  # each source's max event time
    last_heard: dict[str, int] = {}
    # Per arrival: its source, what it credited, and since which arrival (its source's
    # previous hearing) the credited rise took place.
    credits: list[tuple[str, int, int]] = []
    out = []

    def holding(source: str, k: int) -> bool:
        """Heard, and no other source's credits of rises since its last hearing add up
        to the idle timeout, after arrival k."""
        if source not in last_heard:
            return False
        heard = last_heard[source]
        totals: dict[str, int] = {}
        for other, credit, since in credits[: k + 1]:
            if other != source and since > heard:
                totals[other] = totals.get(other, 0) + credit
        return all(total < idle for total in totals.values())

    for k, (source, ts, beat) in enumerate(arrivals):
        before = watermark
        if beat and not source:
            credits.append(("", 0, -1))
            judged = watermark
            watermark = max(watermark, ts - slack)
        else:
            clock = top[source] - slack if source in top else NONE
            judged = max(clock, watermark)
            heard = ts >= judged
            rise = ts - top[source] if source in top else 0
            credit = rise if heard and holding(source, k - 1) and 0 < rise <= idle else 0
            credits.append((source, credit, last_heard.get(source, -1)))
            top[source] = max(top.get(source, ts), ts)
            if heard:
                last_heard[source] = k
            clocks = [top[s] - slack for s in last_heard if holding(s, k)]
            if clocks:
                watermark = max(watermark, min(clocks))
        out.append((judged, before, watermark))
    return out


@st.composite
def streams(draw: st.DrawFn) -> list[Arrival]:
    """Sources a..d, each with its own event clock that moves on by small steps and
    now and then jumps past the idle timeout; readings lag their clock by up to beyond
    the slack; a source may be silent for a long stretch, or start years ahead."""
    names = ["a", "b", "c", "d"]
    clocks = {n: BASE + draw(st.sampled_from([0, 0, 0, 1_500, 9 * YEAR])) for n in names}
    weights = draw(st.lists(st.integers(0, 4), min_size=4, max_size=4))  # 0: never heard
    arrivals: list[Arrival] = []
    total = sum(weights)
    for _ in range(draw(st.integers(0, 70))):
        pick = draw(st.integers(0, total))
        if pick == total:
            # A sourceless heartbeat a little behind the slowest source.
            low = min(clocks.values())
            arrivals.append(("", low - draw(st.sampled_from([0, 2_000, 8_000])), True))
            continue
        name = next(n for n, w in zip(names, np.cumsum(weights), strict=True) if pick < w)
        clocks[name] += draw(st.sampled_from([0, 500, 500, 1_000, 2_000, 6_000]))
        lag = draw(st.sampled_from([0, 0, 500, 1_500, 2_000, 2_500, 7_000]))
        arrivals.append((name, clocks[name] - lag, draw(st.booleans()) and draw(st.booleans())))
    return arrivals


def feed(sequencer: StreamSequencer, arrivals: list[Arrival], first: int = 0) -> Judgement:
    """Judge ``arrivals`` (readings numbered from ``first``, each a new id)."""
    n = len(arrivals)
    return sequencer.judge(
        np.array([a[1] for a in arrivals], dtype=np.int64),
        np.array([a[2] for a in arrivals], dtype=bool),
        [a[0] for a in arrivals],
        [""] * n,
        np.arange(first, first + n, dtype=np.int64),
        np.zeros(n, dtype=np.uint64),
    )


def judged_by_sequencer(
    arrivals: list[Arrival],
    cuts: list[int],
    slack: int = SLACK,
    idle: int = IDLE,
    forget: int = 0,
) -> tuple[list[tuple[int, int, int]], list[int]]:
    """(what each arrival was judged against, the watermark before and after it) and the
    verdicts, from a sequencer fed the arrivals cut at ``cuts``, rebuilt from its state
    (pickled) between batches, after forgetting what idle sources no longer need (after
    every batch, or with ``forget`` a seed: after some)."""
    sequencer = StreamSequencer(slack, source_idle_ms=idle)
    found: list[tuple[int, int, int]] = []
    verdicts: list[int] = []
    rng = random.Random(forget)
    for start, end in zip([0, *cuts], [*cuts, len(arrivals)], strict=True):
        judgement = feed(sequencer, arrivals[start:end], start)
        found += zip(
            judgement.threshold.tolist(),
            judgement.before.tolist(),
            judgement.after.tolist(),
            strict=True,
        )
        verdicts += judgement.verdicts.tolist()
        if not forget or rng.random() < 0.5:
            sequencer.forget_old()
        sequencer = StreamSequencer.from_state(
            slack, pickle.loads(pickle.dumps(sequencer.state())), source_idle_ms=idle
        )
    return found, verdicts


def cuts_of(n: int, batches: int, seed: int) -> list[int]:
    return sorted(random.Random(seed).sample(range(1, n), min(batches, max(n - 1, 0))))


@settings(max_examples=examples(300), deadline=None)
@given(streams(), st.integers(0, 8), st.integers(0, 10**6))
def test_the_sequencer_agrees_with_the_brute_force_however_batches_are_cut(arrivals, batches, seed):
    expected = brute_force(arrivals, SLACK, IDLE)
    found, verdicts = judged_by_sequencer(arrivals, cuts_of(len(arrivals), batches, seed))
    assert found == expected
    for (_, ts, beat), (judged, _, _), verdict in zip(arrivals, expected, verdicts, strict=True):
        if beat:
            assert verdict == Verdict.HEARTBEAT
        else:
            assert verdict == (Verdict.ON_TIME if ts >= judged else Verdict.LATE)


@st.composite
def close_streams(draw: st.DrawFn) -> list[Arrival]:
    """Sources a..c on one event clock, each reading lagging it by up to past the slack,
    who sends changing in spells: sources go idle, come back and are forgotten with
    clocks near the watermark, and heartbeats of a source or of the stream."""
    now = BASE
    arrivals: list[Arrival] = []
    for _ in range(draw(st.integers(1, 6))):
        senders = draw(st.sets(st.sampled_from(["a", "b", "c"]), min_size=1))
        for _ in range(draw(st.integers(1, 15))):
            now += draw(st.sampled_from([0, 250, 500, 1_000]))
            lag = draw(st.sampled_from([0, 250, 500, 1_000, 1_750, 2_000, 2_250, 3_000]))
            name = draw(st.sampled_from(sorted(senders)))
            beat = draw(st.sampled_from([False] * 6 + [True]))
            if beat and draw(st.booleans()):
                name = ""
            arrivals.append((name, now - lag, beat))
    return arrivals


@settings(max_examples=examples(200), deadline=None)
@given(close_streams(), st.integers(0, 6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_sources_near_the_watermark_agree_with_the_brute_force(arrivals, batches, seed, forget):
    expected = brute_force(arrivals, SLACK, IDLE)
    cuts = cuts_of(len(arrivals), batches, seed)
    assert judged_by_sequencer(arrivals, cuts, forget=forget)[0] == expected
    assert judged_by_sequencer(arrivals, list(range(1, len(arrivals))))[0] == expected


@settings(max_examples=examples(100), deadline=None)
@given(streams(), st.integers(1, 8), st.integers(0, 10**6), st.integers(1, 10**6))
def test_batching_and_restarts_change_nothing(arrivals, batches, seed, forget):
    whole = judged_by_sequencer(arrivals, [])
    cuts = cuts_of(len(arrivals), batches, seed)
    assert judged_by_sequencer(arrivals, cuts) == whole
    assert judged_by_sequencer(arrivals, cuts, forget=forget) == whole
    assert judged_by_sequencer(arrivals, list(range(1, len(arrivals)))) == whole


def test_a_forgotten_source_comes_back_as_if_remembered():
    """b goes idle with its max event time above the watermark: it keeps that max, or
    its next readings would credit more than it rose (and make a idle too soon)."""
    s = 1_000
    arrivals: list[Arrival] = [("a", 10 * s, False), ("b", 20 * s, False)]
    arrivals += [("a", t * s, False) for t in range(11, 22)]  # b idle; watermark 19
    arrivals += [("b", 19_500, False)] + [("b", t * s + 500, False) for t in range(20, 25)]
    expected = brute_force(arrivals, SLACK, IDLE)
    assert expected[-1][2] == 19 * s  # a (silent) holds: b rose 4.5 s since a was heard
    assert judged_by_sequencer(arrivals, list(range(1, len(arrivals))))[0] == expected


@settings(max_examples=examples(100), deadline=None)
@given(streams())
def test_one_source_per_source_is_the_one_clock_stream(arrivals):
    """A stream whose readings all come from one source (heartbeats with or without
    it) is judged as if it had one clock."""
    arrivals = [("" if beat and not s else "a", ts, beat) for s, ts, beat in arrivals]
    a = feed(StreamSequencer(SLACK), arrivals)
    b = feed(StreamSequencer(SLACK, source_idle_ms=IDLE), arrivals)
    assert a.verdicts.tolist() == b.verdicts.tolist()
    assert a.after.tolist() == b.after.tolist()
    assert a.threshold.tolist() == b.threshold.tolist()


def run_clocks(arrivals: list[Arrival], idle: int = IDLE) -> tuple[list[int], list[int]]:
    """(what each arrival was judged against, the watermark after it), in one batch."""
    found, _ = judged_by_sequencer(arrivals, [], idle=idle)
    return [f[0] for f in found], [f[2] for f in found]


def test_a_source_nine_years_ahead_makes_no_other_source_late():
    """a and b report every second; f every 5 s (the idle timeout), with a clock that
    is right until it jumps nine years ahead right after a report, and goes on from
    there. Neither the jump nor f's 5 s rises (from a report before a's and b's last
    ones) make a or b idle."""
    arrivals: list[Arrival] = []
    for second in range(120):
        if second <= 10 and second % 5 == 0:
            arrivals.append(("f", BASE + second * 1_000, False))
        if second >= 10 and second % 5 == 0:
            arrivals.append(("f", BASE + 9 * YEAR + (second - 10) * 1_000, False))
        arrivals += [
            ("a", BASE + second * 1_000, False),
            ("b", BASE + second * 1_000 - 1_500, False),
        ]
    judged, after = run_clocks(arrivals)
    late = [a for a, j in zip(arrivals, judged, strict=True) if a[1] < j]
    assert late == []
    # The watermark follows the slowest live source, b.
    assert after[-1] == BASE + 119_000 - 1_500 - SLACK
    # With one clock for the stream, every reading of a and b after f's is late.
    verdicts = feed(StreamSequencer(SLACK), [(n, ts, False) for n, ts, _ in arrivals]).verdicts
    assert sum(v == Verdict.LATE for v in verdicts) > 200


def test_a_jump_of_the_only_other_source_does_not_make_a_source_idle():
    """Two sources: f's jump counts for no time passing, so a (heard every second)
    keeps holding the watermark; a's readings stay on time."""
    arrivals: list[Arrival] = [("a", BASE + s * 1_000, False) for s in range(5)]
    arrivals += [("f", BASE + 4_000, False), ("f", BASE + 9 * YEAR, False)]
    arrivals += [("a", BASE + s * 1_000, False) for s in range(5, 60)]
    judged, after = run_clocks(arrivals)
    assert all(ts >= j for (_, ts, _), j in zip(arrivals, judged, strict=True))
    assert after[-1] == BASE + 59_000 - SLACK


def test_the_timeline_of_the_docs():
    """docs/rules.md, *Per-source clocks*: SLACK 2 SECONDS PER SOURCE IDLE 5 SECONDS."""
    s = 1_000
    arrivals: list[Arrival] = [
        ("a", 10 * s, False),  # a's clock 8: the watermark
        ("b", 9 * s, False),  # b holds too, at 7: the watermark stays 8, never backwards
        ("a", 12 * s, False),  # a 10, b 7: 8
        ("b", 11 * s, False),  # b 9: the watermark 9; b heard, its silence starts again
        ("b", 8 * s, False),  # late: below b's clock
        ("a", 13 * s, False),  # a rose since a hearing before b's: not against b
        ("a", 15 * s, False),  # a rose 2 s since b was heard
        ("a", 18 * s, False),  # 5 s: b is idle, the watermark a's 16
        ("b", 15 * s, False),  # late: below the watermark; b stays idle
        ("b", 17 * s, False),  # heard: b holds again, at 15; the watermark stays 16
        ("a", 19 * s, False),  # a 17, b 15: 16
        ("b", 20 * s, False),  # a 17, b 18: 17
    ]
    judged, after = run_clocks(arrivals)
    assert [w // s for w in after] == [8, 8, 8, 9, 9, 9, 9, 16, 16, 16, 16, 17]
    late = [i for i, ((_, ts, _), j) in enumerate(zip(arrivals, judged, strict=True)) if ts < j]
    assert late == [4, 8]


def test_a_new_source_cannot_move_the_watermark_back():
    arrivals: list[Arrival] = [("a", BASE + 60_000, False), ("n", BASE, False)]
    arrivals += [("n", BASE + 60_000 - SLACK + 1, False), ("a", BASE + 61_000, False)]
    judged, after = run_clocks(arrivals)
    assert after == [BASE + 58_000] * 4  # n holds it where it is until its clock passes
    assert [ts < j for (_, ts, _), j in zip(arrivals, judged, strict=True)] == [
        False, True, False, False,
    ]  # fmt: skip


def test_heartbeats_per_source_and_for_the_stream():
    """A source's heartbeat moves its clock and keeps it from being idle; a heartbeat
    without a source raises the stream's watermark for every source."""
    s = 1_000
    arrivals: list[Arrival] = [("a", 10 * s, False), ("b", 10 * s, False)]
    arrivals += [("a", (11 + i) * s, False) for i in range(7)]  # a rises 1 s a second
    _, after = run_clocks(arrivals)
    assert after[-1] == 15 * s  # b, silent, is idle: a alone holds
    arrivals[5:5] = [("b", 13 * s, True)]  # b's heartbeat: heard, its clock 11
    _, after = run_clocks(arrivals)
    assert after[-1] == 11 * s  # a rose 3 s since: b holds
    arrivals.append(("", 30 * s, True))
    arrivals.append(("b", 27 * s, False))
    judged, after = run_clocks(arrivals)
    assert after[-2] == 28 * s and judged[-1] == 28 * s  # below the stream's heartbeat: late


def test_idle_sources_leave_no_trace():
    """A thousand sources heard once, then one source for longer than the idle timeout:
    the forgotten ones hold nothing, and the state stays small."""
    clocks = SourceClocks(SLACK, IDLE)
    names = [f"s{i}" for i in range(1_000)]
    clocks.judge(np.full(1_000, BASE, np.int64), np.zeros(1_000, bool), names)
    ts = BASE + np.arange(1, 20) * 1_000
    clocks.judge(ts, np.zeros(len(ts), bool), ["live"] * len(ts))
    clocks.forget()
    assert clocks.remembered() == 1 and clocks.holding() == 1
    assert len(pickle.dumps(clocks.state())) < 1_000
    # One of them comes back as a new source would.
    threshold, _, after = clocks.judge(
        np.array([BASE + 1_000, BASE + 17_000]), np.zeros(2, bool), ["s1", "s1"]
    )
    assert threshold.tolist() == [clocks.watermark] * 2 and after[-1] == clocks.watermark


def test_a_source_ahead_of_the_watermark_keeps_only_its_clock_when_idle():
    clocks = SourceClocks(SLACK, IDLE)
    ts = np.array([BASE, BASE + 9 * YEAR] + [BASE + i * 1_000 for i in range(1, 12)])
    clocks.judge(ts, np.zeros(len(ts), bool), ["a", "f"] + ["a"] * 11)
    clocks.forget()
    assert clocks.remembered() == 2 and clocks.holding() == 1
    threshold, _, _ = clocks.judge(
        np.array([BASE + 9 * YEAR - SLACK - 1]), np.zeros(1, bool), ["f"]
    )
    assert threshold[0] == BASE + 9 * YEAR - SLACK  # f's readings still judged by its clock


def test_a_changed_idle_timeout_counts_silence_from_the_restart():
    s = 1_000
    arrivals: list[Arrival] = [("a", 10 * s, False), ("b", 10 * s, False)]
    arrivals += [("a", (11 + i) * s, False) for i in range(6)]  # a rises 5 s since b
    sequencer = StreamSequencer(SLACK, source_idle_ms=10 * s)
    feed(sequencer, arrivals)
    assert sequencer.clock.watermark == 8 * s  # b holds
    shorter = StreamSequencer.from_state(SLACK, sequencer.state(), source_idle_ms=5 * s)
    for i, t in enumerate(range(17, 22)):
        feed(shorter, [("a", t * s, False)], len(arrivals) + i)
        # b still holds until a has credited 5 s since the restart.
        assert shorter.clock.watermark == (8 * s if i < 4 else (t - 2) * s)


def test_a_stream_changing_between_one_clock_and_per_source_keeps_its_watermark():
    one = StreamSequencer(SLACK)
    feed(one, [("a", BASE, False), ("b", BASE + 5_000, False)])
    per = StreamSequencer.from_state(SLACK, one.state(), source_idle_ms=IDLE)
    assert per.clock.watermark == BASE + 3_000
    judged = feed(per, [("a", BASE + 1_000, False), ("a", BASE + 4_000, False)], 2)
    assert judged.verdicts.tolist() == [Verdict.LATE, Verdict.ON_TIME]
    back = StreamSequencer.from_state(SLACK, per.state())
    assert back.clock.watermark == BASE + 3_000


# -- through the pipeline --------------------------------------------------------------

STREAM = StreamSchema(
    "traffic",
    (Column("station", ColumnType.INT), Column("ts", ColumnType.TIMESTAMP)),
    "ts",
    SLACK,
    "lookout/traffic/+/readings",
    source_idle_ms=IDLE,
)
PLAN = Plan(
    {"traffic": STREAM},
    (Query(Sink("copy", SinkKind.STREAM), "traffic", post=(select("station", "ts"),)),),
)


def table(arrivals: list[Arrival], first: int) -> pa.Table:
    return pa.table(
        {
            "station": pa.array([1] * len(arrivals), pa.int32()),
            "ts": pa.array([a[1] for a in arrivals], pa.int64()),
            "source": pa.array([a[0] for a in arrivals], pa.string()),
            "epoch": pa.array([""] * len(arrivals), pa.string()),
            "seq": pa.array(range(first, first + len(arrivals)), pa.int64()),
            HEARTBEAT: pa.array([a[2] for a in arrivals]),
        }
    )


@settings(max_examples=examples(100), deadline=None)
@given(streams(), st.integers(0, 8), st.integers(0, 10**6))
def test_the_pipeline_sets_aside_what_the_brute_force_finds_late(arrivals, batches, seed):
    """Late readings with what they were judged against, on-time readings with the
    watermark after them, each batch's watermark: as the brute force says, the pipeline
    restarted from its store before every batch."""
    expected = brute_force(arrivals, SLACK, IDLE)
    store = MemoryStore()
    late: list[tuple[int, int, int]] = []
    stamped: list[tuple[int, int]] = []
    cuts = cuts_of(len(arrivals), batches, seed)
    for start, end in zip([0, *cuts], [*cuts, len(arrivals)], strict=True):
        pipeline = Pipeline(PLAN, store=store)
        result = pipeline.process(
            {"traffic": table(arrivals[start:end], start)} if end > start else {}
        )
        pipeline.save()
        late += [(x.row["seq"], x.ts, x.watermark) for x in result.late]
        if "traffic" in result.readings:
            kept = result.readings["traffic"]
            stamped += zip(
                kept.column("seq").to_pylist(),
                kept.column("arrival_watermark").to_pylist(),
                strict=True,
            )
        if end > start:
            assert result.watermarks["traffic"] == expected[end - 1][2]
    want_late = [
        (k, ts, judged)
        for k, ((_, ts, beat), (judged, _, _)) in enumerate(zip(arrivals, expected, strict=True))
        if not beat and ts < judged
    ]
    want_stamped = [
        (k, after)
        for k, ((_, ts, beat), (judged, _, after)) in enumerate(
            zip(arrivals, expected, strict=True)
        )
        if not beat and ts >= judged
    ]
    assert late == want_late
    assert stamped == want_stamped
