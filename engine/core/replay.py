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

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.core.evaluator import KeyedEvaluator, Output
from engine.core.plan import END_OF_TIME, Plan
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
    bounds memory and, by snapshot-equivalence, does not change the result). A derived
    stream's rows feed the stages reading it as soon as its producer emits them, with
    the producer's watermark and the tie order of :class:`Output` (``source``, ``seq``),
    exactly as the live job feeds them from the derived stream's table.

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

    def drain(watermarks: dict[str, int]) -> None:
        """Advance every stage to its input's watermark, in plan order (producers before
        consumers), feeding each derived row to the stages that read it at once."""
        for i, stage in enumerate(stages):
            watermark = watermarks[stage.input]
            outputs = []
            for key, ev in evaluators[i].items():
                for o in ev.advance(watermark):
                    outputs.append((o.ts, i, _sort_key(key), o.seq, o))
            produced.extend(outputs)
            # Everything the stage emits from now on has ts >= watermark (outputs keep
            # their input's time, or fire at timers >= it): its sinks' watermark, the
            # lowest of their producers' for a UNION ALL.
            for q in (stage.query, *stage.downstream):
                watermarks[q.sink.name] = min(watermarks.get(q.sink.name, watermark), watermark)
            for *_, o in outputs:
                for j in by_input.get(o.sink, ()):
                    ts = stages[j].timestamp
                    feed(j, {**o.row, ts: o.ts, "source": o.source, "seq": o.seq})

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
            for seqr in sequencers.values():
                seqr.forget_old()
            drain({name: seqr.clock.watermark for name, seqr in sequencers.items()})

    drain(dict.fromkeys(sequencers, END_OF_TIME))  # end of input: the final heartbeat
    produced.sort(key=lambda p: p[:4])
    result.outputs = [p[4] for p in produced]
    return result


def _timestamp(plan: Plan, stream: str) -> str:
    schema = plan.streams[stream]
    if schema.timestamp is None:
        raise ValueError(f"source stream {stream!r} has no timestamp column")
    return schema.timestamp
