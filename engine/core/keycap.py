"""A source stream's cap on live keys: how many keys each rule reading it may hold
state for at once, and which readings of new keys go to quarantine instead.

**Which readings.** Readings are judged in arrival order (after the sequencer's verdict:
only on-time readings count). For a reading that arrives while the stream's watermark is
``w``, let ``g`` be ``w`` rounded down to a multiple of :data:`STEP_MS` (10 s). For each
keyed stage reading the stream, the reading's key (the stage's PARTITION BY / GROUP BY values
of it) is *known* if the stage holds it once evaluated up to ``g``, or an admitted
reading since has it. If for some stage the key is not known and that stage already
knows ``cap`` keys, the reading is quarantined; otherwise it is admitted and its keys
become known. No rule sees a quarantined reading.

Everything in that rule depends on the readings and their arrival order only: the keys
a stage holds at ``g`` follow from the readings before ``g`` (eviction is a function of
a key's state, and an evaluator is woken no later than the watermark at which time makes
it idle), so live and replay, however their batches are cut, quarantine the same
readings. To know the keys held at ``g`` the pipeline is advanced to exactly ``g``
whenever a stream's watermark passes a multiple of :data:`STEP_MS`; after that the keys
evicted since are remembered until the next one, and the keys of the readings held
(admitted, not yet evaluated) are read from the held rows. A stage at its cap holds at
most ``cap`` keys: every key it holds is known.

A bound decides most batches: when even counting every reading as a new key no stage
could reach its cap, every reading is admitted without looking at each; past that, the
same with each stage's distinct keys among the readings counted instead (a backlog's
batch holds far more readings than keys).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from engine.core.plan import Stage
from engine.core.runners import StageRunner, key_json, key_of
from engine.core.state import StateKey, StateStore

Key = tuple[Any, ...]
Row = dict[str, Any]

STEP_MS = 10_000
"""The pipeline is evaluated up to each multiple of this of a capped stream's watermark:
the keys held then decide the readings arriving before the next one. Each step is one
more advance of the stream's rules (with 1 s steps, 0.5 s batches of 20k readings/s of
the traffic rules took 45 % longer; with 10 s, one batch in twenty pays it), and a key
evicted between two steps makes room from the next one on."""
KIND = "keycap"
"""The kind of a capped stream's entry in the store: where it was last evaluated up to
and the keys its stages evicted since."""
_PICKLE = pickle.HIGHEST_PROTOCOL


def step_of(watermark: int) -> int:
    """``watermark`` rounded down to a multiple of :data:`STEP_MS`."""
    return watermark // STEP_MS * STEP_MS


@dataclass(frozen=True)
class CappedReading:
    """An on-time reading quarantined because a rule reading its stream holds as many
    keys as the stream's cap allows and the reading's key is not among them."""

    stream: str
    row: Row
    ts: int
    reason: str


@dataclass
class CappedStage:
    """A keyed stage reading the capped stream: its plan index, the stage, its runner,
    and the keys it evicted since the stream's last step."""

    index: int
    stage: Stage
    runner: StageRunner
    evicted: set[Key]

    def known_bound(self) -> int:
        """No fewer keys than the stage knows before a batch's readings: those it holds
        and those it evicted since the step."""
        return self.runner.live_keys() + len(self.evicted)


class KeyCap:
    """One source stream's cap (module docstring): ``cap`` keys per keyed stage reading it."""

    def __init__(self, stream: str, cap: int, stages: Iterable[CappedStage]) -> None:
        self.stream = stream
        self.cap = cap
        self.stages = list(stages)
        self.step: int | None = None  # the watermark the stream was last evaluated up to
        self._changed = False

    def due(self, watermark: int) -> int | None:
        """The step before ``watermark`` if the stream has not been evaluated up to it."""
        step = step_of(watermark)
        return step if self.step is None or step > self.step else None

    def stepped(self, step: int) -> None:
        """The stream was evaluated up to ``step``: evictions count from here."""
        self.step = step
        for stage in self.stages:
            stage.evicted.clear()
        self._changed = True

    def note_evicted(self, index: int, keys: list[Key]) -> None:
        """``keys`` left stage ``index``."""
        if not keys:
            return
        for stage in self.stages:
            if stage.index == index:
                stage.evicted.update(keys)
                self._changed = True

    def may_fill(self, held: Sequence[pa.Table], arriving: pa.Table, admitted: np.ndarray) -> bool:
        """Whether the ``admitted`` rows of ``arriving`` could take some stage to its cap,
        with the ``held`` readings waiting: if not, they are all admitted (what the exact
        rule would do). Each reading counted as a new key bounds it first; past that
        bound, each stage's distinct keys among them (a backlog's batch holds far more
        readings than keys)."""
        rows = sum(t.num_rows for t in held) + int(admitted.sum())
        full = [s for s in self.stages if s.known_bound() + rows >= self.cap]
        if not full:
            return False
        tables = [t for t in (*held, arriving.filter(pa.array(admitted))) if t.num_rows]
        return any(s.known_bound() + _distinct(tables, list(s.stage.key)) >= self.cap for s in full)

    def decider(self, held: Iterable[pa.Table]) -> Callable[[Row], str | None]:
        """What decides readings, in arrival order, from the stream's last step on:
        given a reading's columns, None (admitted, its keys now known) or the reason it
        is quarantined. ``held``: the held readings' tables, whose keys are known. A new
        one is needed after each step."""
        known = self._known(held)
        counts = [self._count(s, k) for s, k in zip(self.stages, known, strict=True)]
        columns = [s.stage.key for s in self.stages]  # a property, computed each time

        def decide(row: Row) -> str | None:
            new = []
            for j, stage in enumerate(self.stages):
                key = tuple(row.get(c) for c in columns[j])
                if key in known[j] or key in stage.evicted or stage.runner.is_live(key):
                    continue
                if counts[j] >= self.cap:
                    return self.reason(stage, key)
                new.append((j, key))
            for j, key in new:
                known[j].add(key)
                counts[j] += 1
            return None

        return decide

    def _known(self, held: Iterable[pa.Table]) -> list[set[Key]]:
        """Per stage, the keys of the held readings."""
        tables = list(held)
        known: list[set[Key]] = []
        for stage in self.stages:
            keys: set[Key] = set()
            for table in tables:
                columns = [table.column(c).to_pylist() for c in stage.stage.key]
                keys.update(zip(*columns, strict=True))
            known.append(keys)
        return known

    @staticmethod
    def _count(stage: CappedStage, known: set[Key]) -> int:
        """How many keys ``stage`` knows: held, evicted since the step, or held rows'."""
        runner = stage.runner
        extra = {k for k in stage.evicted | known if not runner.is_live(k)}
        return runner.live_keys() + len(extra)

    def reason(self, stage: CappedStage, key: Key) -> str:
        """Why a reading of ``key`` was quarantined."""
        shown = ", ".join(f"{c}={v}" for c, v in zip(stage.stage.key, key, strict=True))
        return (
            f"stream {self.stream}: max_live_keys = {self.cap} reached by rule "
            f"{stage.stage.name} (it holds state for {self.cap} keys); new key {shown}"
        )

    # -- state -----------------------------------------------------------------------------
    def save(self, store: StateStore) -> None:
        """Write the step and the keys evicted since, if they changed."""
        if not self._changed:
            return
        evicted = {s.stage.name: sorted(map(key_json, s.evicted)) for s in self.stages}
        store.put((KIND, self.stream, "", 0), pickle.dumps((self.step, evicted), _PICKLE))
        self._changed = False

    def restore(self, saved: Iterable[tuple[StateKey, bytes]]) -> None:
        """Take up what :meth:`save` wrote (stages since removed are left out)."""
        for _, data in saved:
            self.step, evicted = pickle.loads(data)
            for stage in self.stages:
                texts = evicted.get(stage.stage.name, ())
                stage.evicted = {key_of(t) for t in texts}


def _distinct(tables: Sequence[pa.Table], columns: list[str]) -> int:
    """How many distinct values of ``columns`` the tables' rows hold together."""
    if not tables:
        return 0
    keys = pa.concat_tables([t.select(columns) for t in tables], promote_options="permissive")
    return keys.group_by(columns).aggregate([]).num_rows
