"""A pure batch runner over recorded readings, judged exactly like the live landing.

Every reading goes through the same :class:`~engine.core.sequencer.StreamSequencer` as
the live landing job: a repeated (source, seq) is a duplicate (counted, dropped), a
reading below its stream's slack watermark is late (set aside, never processed).

:func:`run` evaluates a plan over readings in arrival order with the same
:class:`~engine.core.evaluator.KeyedEvaluator` the live job uses, and returns the
outputs and the late readings. End of input is a final heartbeat at
:data:`~engine.core.plan.END_OF_TIME`: every window closes and every expiration fires.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.core.evaluator import KeyedEvaluator, Output
from engine.core.plan import END_OF_TIME, Plan, Stage
from engine.core.sequencer import StreamSequencer, Verdict

Row = dict[str, Any]


@dataclass(frozen=True)
class LateReading:
    """A reading below its stream's watermark: the reading, its stream and how late."""

    stream: str
    row: Row
    ts: int
    watermark: int

    @property
    def lateness_ms(self) -> int:
        """How far below the watermark the reading was."""
        return self.watermark - self.ts


@dataclass
class ReplayResult:
    """What :func:`run` produced: output rows, late readings and duplicate counts per
    stream, all deterministic."""

    outputs: list[Output] = field(default_factory=list)
    late: list[LateReading] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)


def _sort_key(value: Hashable) -> str:
    # Keys may mix types and NULLs; their repr gives a total, deterministic order.
    return repr(value)


def run(plan: Plan, readings: Iterable[tuple[str, Row]], batch: int = 10_000) -> ReplayResult:
    """Evaluate ``plan`` over ``(stream, row)`` readings in arrival order.

    Rows carry their stream's columns with the timestamp as int ms; ``source`` and
    ``seq`` default to ``""`` and the arrival index (ties then follow arrival order, and
    such readings are never duplicates of each other).
    Every ``batch`` readings the evaluators advance to their stream's watermark (which
    bounds memory and, by snapshot-equivalence, does not change the result).

    Outputs are ordered by event time, then stage, key and the evaluator's own order;
    late readings in arrival order.
    """
    stages = plan.stages()
    sequencers = {s.name: StreamSequencer(s.slack_ms) for s in plan.sources()}
    ts_column = {name: _timestamp(plan, name) for name in sequencers}
    evaluators: list[dict[tuple[Any, ...], KeyedEvaluator]] = [{} for _ in stages]
    by_input: dict[str, list[int]] = {}
    for i, stage in enumerate(stages):
        by_input.setdefault(stage.input, []).append(i)
    produced: list[tuple[int, int, str, int, Output]] = []
    result = ReplayResult()

    def feed(i: int, row: Row) -> None:
        stage = stages[i]
        key = tuple(row.get(c) for c in stage.key)
        ev = evaluators[i].get(key)
        if ev is None:
            ev = evaluators[i][key] = KeyedEvaluator(stage)
        ev.insert(row)

    def drain(i: int, watermark: int) -> None:
        for key, ev in evaluators[i].items():
            for n, o in enumerate(ev.advance(watermark)):
                produced.append((o.ts, i, _sort_key(key), n, o))

    for arrival, (stream, raw) in enumerate(readings):
        sequencer = sequencers.get(stream)
        if sequencer is None:
            raise ValueError(f"unknown source stream {stream!r}")
        row = {"source": "", "seq": arrival, **raw}
        ts = row[ts_column[stream]]
        watermark = sequencer.clock.watermark
        verdict = sequencer.admit(row["source"], row["seq"], ts)
        if verdict is Verdict.DUPLICATE:
            result.duplicates[stream] = result.duplicates.get(stream, 0) + 1
            continue
        if verdict is Verdict.LATE:
            result.late.append(LateReading(stream, row, ts, watermark))
            continue
        for i in by_input.get(stream, ()):
            feed(i, row)
        if (arrival + 1) % batch == 0:
            for name, seqr in sequencers.items():
                seqr.forget_old()
                for i in by_input.get(name, ()):
                    drain(i, seqr.clock.watermark)

    # End of input; stages over derived streams run after their producers (plan order).
    for i, stage in enumerate(stages):
        if stage.input not in sequencers:
            _feed_derived(stage, i, produced, feed)
        drain(i, END_OF_TIME)
    produced.sort(key=lambda p: p[:4])
    result.outputs = [p[4] for p in produced]
    return result


def _feed_derived(
    stage: Stage,
    i: int,
    produced: list[tuple[int, int, str, int, Output]],
    feed: Callable[[int, Row], None],
) -> None:
    """Feed a stage over a derived stream with that stream's rows so far, in event order."""
    rows = sorted((p for p in produced if p[4].sink == stage.input), key=lambda p: p[:4])
    for seq, (_, _, _, _, o) in enumerate(rows):
        feed(i, {**o.row, stage.timestamp: o.ts, "source": stage.input, "seq": seq})


def _timestamp(plan: Plan, stream: str) -> str:
    schema = plan.streams[stream]
    if schema.timestamp is None:
        raise ValueError(f"source stream {stream!r} has no timestamp column")
    return schema.timestamp
