"""Python's cyclic garbage collector in Spark's Python workers (runs in the workers).

PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker. A
full pass walks every object the collector tracks: pandas, pyarrow and the loaded rules
included, though they live as long as the worker. Under load (pipeline_faults at 4.6k
readings/s, py-spy) those passes took ≈ 21 % of a core, 4 % once frozen. Freezing what
is alive at a worker's first task moves it out of the collector's reach; later passes
walk only what the tasks made since.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache


@cache
def freeze_worker_heap() -> None:
    """Once per process: collect, then freeze every object still alive (``gc.freeze``).
    Frozen objects are still freed when no longer referenced; only a cycle among them
    would outlive its last reference, and they are the worker's modules and caches."""
    gc.collect()
    gc.freeze()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a group runs: the engine allocates a
    dict or tuple per row and per output, none in a cycle, and the collector's passes
    over them took a quarter of its time at a 1 s slide."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
