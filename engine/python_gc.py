"""Python's cyclic garbage collector in a process that evaluates batch after batch:
Spark's Python workers, and `lookout replay`.

PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker. A
full pass walks every object the collector tracks: pandas, pyarrow and the loaded rules
included, though they live as long as the worker, and the pipeline the worker keeps
between batches, whose evaluators grow with the live keys (a pass took about 1 s per
170,000 RFID tags). Under load (pipeline_faults at 4.6k readings/s, py-spy) those passes
took ≈ 21 % of a core, 4 % once the worker's first heap was frozen; with a new key every
few milliseconds they grew without bound, and the engine fell behind. So what is alive
at a worker's first task is frozen, and then what each batch leaves alive: a pass walks
only what the last batch made. Replay's pipeline grows the same way (the collector's own
passes took 15 % of replaying 1.2 million RFID readings), and replay does the same.
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


def freeze_batch_survivors() -> None:
    """At the end of a batch: collect the young generation (what the batch made and
    dropped), then freeze what it leaves alive, so that the collector's later passes,
    PySpark's after the task included, do not walk it again."""
    gc.collect(0)
    gc.freeze()


def collect_frozen() -> None:
    """A full pass over everything, the frozen heap included, which is then frozen
    again: when a kept pipeline is dropped (the rules changed, or the state moved on
    without it), so that no reference cycle of it outlives it."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
