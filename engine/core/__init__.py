"""engine/core: Lookout's pure-Python semantic core (no Spark imports; unit-testable alone).

* :mod:`engine.core.plan` — the IR the rule compiler produces (streams, ops, windows,
  aggregate calls, sinks, stages) and :data:`END_OF_TIME`.
* :mod:`engine.core.aggregates` — :class:`WindowAggregate` (ESL UDA protocol),
  :class:`IncrementalAggregate`, :data:`BUILTINS`.
* :mod:`engine.core.evaluator` — :class:`KeyedEvaluator` (one per stage and key) and
  :class:`Output`.
* :mod:`engine.core.windows` — the window operators the evaluator drives, composed of
  pieces; :mod:`engine.core.planner` — which runner, operator and pieces serve a stage.
* :mod:`engine.core.clocks` — :class:`SlackClock` (the slack/lateness rule) and
  :class:`SourceClocks` (the same with a clock per source);
  :mod:`engine.core.sequencer` — :class:`StreamSequencer` (identity, then slack: what
  happens to an arriving reading).
* :mod:`engine.core.pipeline` — :class:`Pipeline`: the sequencers and every stage fed
  by a set of source streams, batch after batch, with its state in a
  :class:`~engine.core.state.StateStore`; what the live engine and replay both run.
* :mod:`engine.core.replay` — :func:`run` (a plan over recorded readings, through the
  same pipeline).
"""
