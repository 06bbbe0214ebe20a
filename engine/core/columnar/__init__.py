"""The columnar runners: stages computed per column of a batch (Arrow, numpy) instead
of per row, for the window forms whose meaning allows it, with the same results as the
per-row runner (:mod:`engine.core.runners`).

* :mod:`.stage` — what they share: input, keys, the steps after the window, numbering;
* :mod:`.ops` — filters, lookup joins and projections over a batch;
* :mod:`.aggregates` — count, sum, avg, min and max over ranges of rows (parts);
* :mod:`.over` — OVER windows: a frame (ROWS n, RANGE t, UNBOUNDED) and an emit policy
  (every row, a row slide, a time slide), composed;
* :mod:`.extents` — extent windows on panes;
* :mod:`.stateless` — a query without a window.

:func:`engine.core.planner.runners.runner_for` chooses between them when a pipeline is built.
"""
