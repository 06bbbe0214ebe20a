"""Slack, lateness and a pure batch runner over recorded readings.

:class:`SlackClock` is THE implementation of the DESIGN §4 slack rule, shared by the
Spark runtime and ``lookout replay``: per stream, a reading's watermark is the max event
time of the readings that arrived before it minus the slack; a reading at or above it is
on time, one below it is late (set aside, never processed).

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

Row = dict[str, Any]


@dataclass
class SlackClock:
    """One stream's watermark under ``SLACK slack_ms`` (DESIGN §4)."""

    slack_ms: int
    max_ts: int | None = None

    @property
    def watermark(self) -> int:
        """Max event time seen so far minus the slack (-END_OF_TIME before any reading)."""
        return -END_OF_TIME if self.max_ts is None else self.max_ts - self.slack_ms

    def admit(self, ts: int) -> bool:
        """Judge the next arriving reading: True if on time (``ts >= watermark``), False if
        late. Either way it has arrived, so it counts toward later readings' watermark."""
        on_time = ts >= self.watermark
        if self.max_ts is None or ts > self.max_ts:
            self.max_ts = ts
        return on_time


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
    """What :func:`run` produced: output rows and late readings, both deterministic."""

    outputs: list[Output] = field(default_factory=list)
    late: list[LateReading] = field(default_factory=list)


def _sort_key(value: Hashable) -> str:
    # Keys may mix types and NULLs; their repr gives a total, deterministic order.
    return repr(value)


def run(plan: Plan, readings: Iterable[tuple[str, Row]], batch: int = 10_000) -> ReplayResult:
    """Evaluate ``plan`` over ``(stream, row)`` readings in arrival order.

    Rows carry their stream's columns with the timestamp as int ms; ``source`` and
    ``seq`` default to ``""`` and the arrival index (ties then follow arrival order).
    Every ``batch`` readings the evaluators advance to their stream's watermark (which
    bounds memory and, by snapshot-equivalence, does not change the result).

    Outputs are ordered by event time, then stage, key and the evaluator's own order;
    late readings in arrival order.
    """
    stages = plan.stages()
    clocks = {s.name: SlackClock(s.slack_ms) for s in plan.sources()}
    ts_column = {name: _timestamp(plan, name) for name in clocks}
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
        clock = clocks.get(stream)
        if clock is None:
            raise ValueError(f"unknown source stream {stream!r}")
        row = {"source": "", "seq": arrival, **raw}
        ts = row[ts_column[stream]]
        watermark = clock.watermark
        if not clock.admit(ts):
            result.late.append(LateReading(stream, row, ts, watermark))
            continue
        for i in by_input.get(stream, ()):
            feed(i, row)
        if (arrival + 1) % batch == 0:
            for name, c in clocks.items():
                for i in by_input.get(name, ()):
                    drain(i, c.watermark)

    # End of input; stages over derived streams run after their producers (plan order).
    for i, stage in enumerate(stages):
        if stage.input not in clocks:
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
