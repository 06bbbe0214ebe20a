"""The stateful step of the engine query: the processor Spark's `transformWithState`
is given, keyed by component. It registers the group's state variables and hands each
batch to `engine.spark.step`, which does the work.

**It stays light.** At every start of the query Spark unpickles the processor on the
driver, in a Python process of its own, only to run `init` and learn the state
variables' schemas. Unpickling the rules there imported the whole engine (81 modules,
0.5-0.7 s of each start here). So the processor carries its components and
configuration pickled (`packed`), this module imports none of the engine's evaluation,
and a Python worker unpickles them, and imports the engine, at its first batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import cloudpickle
from pyspark.sql import Row
from pyspark.sql import types as T
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from engine.python_gc import freeze_worker_heap

if TYPE_CHECKING:
    from engine.alerts import AlertSpec
    from engine.core.plan import Plan
    from engine.tables import DataFile
    from lookout.config import Config

QUERY_NAME = "engine"
"""The streaming query's name (its checkpoint folder's, and its tasks' writer ids)."""

OUTPUT_SCHEMA = (
    "kind STRING, table STRING, path STRING, size LONG, records LONG, modified LONG, stats STRING"
)
"""One row per file written and committed (kind "file"), and one of health figures
(kind "health", `stats` its JSON)."""

STATE_KEY = T.StructType(
    [
        T.StructField("kind", T.StringType()),
        T.StructField("name", T.StringType()),
        T.StructField("key", T.StringType()),
        T.StructField("number", T.LongType()),
    ]
)
"""A state variable's key: an entry's (kind, name, key, number), `engine.core.state`."""
STATE_VALUE = T.StructType([T.StructField("data", T.BinaryType())])
"""A state variable's value: the entry's bytes, packed (`engine.spark.step.pack_value`)."""
ENTRIES, PIECES = "entries", "pieces"
"""The group's two state variables. Each one a task registers costs a round trip to
the JVM that creates it, every batch (~25 ms here), so kinds share them: ``pieces``
holds the entries read one at a time (a window's chunks and slices, kinds
:data:`~engine.core.runners.STAGE_PIECE_KINDS`), ``entries`` every other kind, read
whole when a pipeline is rebuilt, and the token."""


@dataclass(frozen=True)
class Component:
    """A connected part of the plan's stream graph: a group of the engine query."""

    name: str
    sources: tuple[str, ...]
    plan: Plan
    alerts: Mapping[str, AlertSpec]


class EngineProcessor(StatefulProcessor):
    """`transformWithState` processor of the engine query, keyed by component (see the
    module docstring)."""

    def __init__(self, components: Sequence[Component], config: Config, memo_id: str) -> None:
        self.packed = cloudpickle.dumps(({c.name: c for c in components}, config))
        # Which pipeline, in a worker's memo: the query's checkpoint, and the rules and
        # configuration it runs (a worker outlives an engine restarted with other rules
        # in-process).
        self.memo_id = f"{memo_id}#{hashlib.sha256(self.packed).hexdigest()[:16]}"

    def init(self, handle: StatefulProcessorHandle) -> None:
        freeze_worker_heap()
        # The files this task's components wrote, per table: committed at its end.
        self.pending: dict[str, list[DataFile]] = {}
        self.entries = handle.getMapState(ENTRIES, STATE_KEY, STATE_VALUE)
        self.pieces = handle.getMapState(PIECES, STATE_KEY, STATE_VALUE)

    def handleInputRows(
        self, key: Any, rows: Iterator[Row], timerValues: TimerValues
    ) -> Iterator[Row]:
        from engine.spark import step  # the engine, in workers only (module docstring)

        yield from step.run(self, key[0], rows)

    def close(self) -> None:
        """The task ran every component it holds: commit their files (`step.commit`)."""
        if self.pending:  # none on the driver, which only runs `init`
            from engine.spark import step

            step.commit(self)
