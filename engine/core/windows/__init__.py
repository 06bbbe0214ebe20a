"""Window operators, the stateful middle of a query, and the pieces they are made of.

The keyed evaluator drives one operator per partition through the protocol of
:mod:`~engine.core.windows.base`. An operator composes pieces; which pieces serve a
window form is the planner's decision (:mod:`engine.core.planner.operators`), never
the operator's: a new window form or emit policy is a new piece. After the ESL paper
§4-5 and the scopes of Patroumpas & Sellis, "Window Specification over Data Streams":

* :mod:`~engine.core.windows.contents`: a window's tuples and its aggregates
  (incremental, ESL-shaped with their ``inwindow``, or pruned to what those hold);
* :mod:`~engine.core.windows.frames`: which tuples enter and leave a data-driven
  window and when (ROWS n, RANGE r, UNBOUNDED, a lag, fixed bounds, a periodic reset,
  active expiration);
* :mod:`~engine.core.windows.emits`: which outputs are kept (every tuple, every n-th
  row, the last tuple of each time slot, an expiry's outputs);
* :mod:`~engine.core.windows.over`: the data-driven operator, a frame and an emit
  policy;
* :mod:`~engine.core.windows.panes`: row slides over algebraic aggregates on pane
  partials;
* :mod:`~engine.core.windows.extents`: domain-driven extents, on tuples or on panes;
* :mod:`~engine.core.windows.relations`: CQL windows of raw tuples read through a
  relation-to-stream operator, and :mod:`~engine.core.windows.streams`, the ISTREAM /
  DSTREAM / RSTREAM pieces.
"""
