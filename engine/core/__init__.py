"""engine/core: Lookout's pure-Python semantic core (no Spark imports; unit-testable alone).

* :mod:`engine.core.plan` — the IR the rule compiler produces (streams, ops, windows,
  aggregate calls, sinks, stages) and :data:`END_OF_TIME`.
* :mod:`engine.core.aggregates` — :class:`WindowAggregate` (ESL UDA protocol),
  :class:`IncrementalAggregate`, :data:`BUILTINS`.
* :mod:`engine.core.evaluator` — :class:`KeyedEvaluator` (one per stage and key) and
  :class:`Output`.
* :mod:`engine.core.windows` — the window operators the evaluator drives.
* :mod:`engine.core.sequencer` — :class:`SlackClock` (the slack/lateness rule) and
  :class:`StreamSequencer` (dedupe, then slack: what happens to an arriving reading).
* :mod:`engine.core.replay` — :func:`run` (batch evaluation of a plan over recorded
  readings, judged by the same sequencer as the live landing).
"""

from engine.core.aggregates import BUILTINS, IncrementalAggregate, InWindow, WindowAggregate
from engine.core.evaluator import KeyedEvaluator, Output
from engine.core.plan import END_OF_TIME, Plan, Stage
from engine.core.replay import LateReading, ReplayResult, run
from engine.core.sequencer import SlackClock, StreamSequencer, Verdict

__all__ = [
    "BUILTINS",
    "END_OF_TIME",
    "InWindow",
    "IncrementalAggregate",
    "KeyedEvaluator",
    "LateReading",
    "Output",
    "Plan",
    "ReplayResult",
    "SlackClock",
    "Stage",
    "StreamSequencer",
    "Verdict",
    "WindowAggregate",
    "run",
]
