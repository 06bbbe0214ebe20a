"""The planner: every decision about which code serves a stage, taken where the stage
is first run, and nowhere else.

* :mod:`engine.core.planner.runners`: which runner runs a stage, per column or row by
  row (:func:`~engine.core.planner.runners.runner_for`);
* :mod:`engine.core.planner.operators`: which window operator, composed of which pieces,
  serves the row runner's keyed evaluators, and which window specs are refused
  (:func:`~engine.core.planner.operators.evaluator_pieces`).
"""
