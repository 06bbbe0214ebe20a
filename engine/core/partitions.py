"""The rules over recorded readings split across workers by key (pure; no processes).

One pipeline judges every arrival (:meth:`~engine.core.pipeline.Pipeline.judge`): the
sequencers need each stream's whole arrival order. What it admits goes to the workers,
each running pipelines fed only their share (:meth:`~engine.core.pipeline.Pipeline.feed`)
and advanced to the judge's watermarks, so every worker evaluates the same instants as
one pipeline would, over fewer keys.

**Which split keeps the rows.** The stages are cut into groups that share nothing:

- A stage reading a derived stream is in the group of the stages producing it, and the
  stages producing one stream (a UNION ALL) are in one group.
- A stateless stage reading a source stream runs beside the judge, fed every admitted
  reading (:attr:`Partitioning.central`). It has no key: the rows it emits at one
  instant are numbered in the order of all its input rows there.
- The other stages read a source stream and are keyed (PARTITION BY / GROUP BY).
  Stages whose keys share columns form a group split by the shared columns: each key's
  readings meet in one worker, and so do its derived rows and its incidents, which that
  worker's stages and trackers produce (the traffic library: all by ``station``; the
  RFID library: by ``door``, and by ``tagid``).
- A group with a stage reading a derived stream, with a stage without a key, or whose
  stages' keys share no column (a UNION ALL of a window by station and one by lane)
  runs whole in one worker.

Every group of a worker is its own pipeline, so a reading of two groups goes to each.

**Caps on live keys** decide a reading with the keys every stage of its stream holds,
which no worker sees alone. A cap cannot quarantine anything while a stage has seen
fewer distinct keys than the cap, so the split is exact until one has:
:class:`DistinctKeys` says when, and the caller then evaluates in one pipeline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from engine.core.batch import BatchResult
from engine.core.incidents import IncidentUpdate
from engine.core.pipeline import Pipeline, fed_stages, stage_sinks
from engine.core.plan import Plan, Stage
from engine.core.runners import SinkRows
from engine.core.sequencer import content_hashes

IncidentKey = tuple[str, str, int]
"""An incident's identity: (alert, key, opening time)."""

Shares = dict[int, dict[str, pa.Table]]
"""A worker's share of a batch: per group (its index), each stream's readings."""


@dataclass(frozen=True)
class StageGroup:
    """Stages (plan indexes) evaluated together on the readings of ``sources``: split
    among the workers by the hash of ``columns``, or all in ``worker`` (None columns)."""

    stages: frozenset[int]
    sources: frozenset[str]
    columns: tuple[str, ...] | None
    worker: int = 0


@dataclass(frozen=True)
class Partitioning:
    """Where each admitted reading is evaluated, among ``workers`` workers, and which
    stages run beside the judge on every admitted reading (``central``)."""

    workers: int
    groups: tuple[StageGroup, ...]
    central: frozenset[int] = frozenset()

    def split(self, admitted: Mapping[str, pa.Table]) -> list[Shares]:
        """Each worker's share of a batch's admitted readings, per group (rows in arrival
        order; no table where a worker has no row of a group's stream)."""
        shares: list[Shares] = [{} for _ in range(self.workers)]
        for number, group in enumerate(self.groups):
            for stream in group.sources & admitted.keys():
                table = admitted[stream]
                if not table.num_rows:
                    continue
                if group.columns is None or self.workers == 1:
                    shares[group.worker].setdefault(number, {})[stream] = table
                    continue
                hashes = content_hashes(table.select(list(group.columns)))
                worker = hashes % np.uint64(self.workers)
                for i in range(self.workers):
                    mine = worker == i
                    if mine.any():
                        shares[i].setdefault(number, {})[stream] = table.filter(pa.array(mine))
        return shares

    def groups_of(self, worker: int) -> dict[int, frozenset[int]]:
        """The groups (index: stages) worker ``worker`` runs: every split group, and the
        whole groups given to it."""
        return {
            number: group.stages
            for number, group in enumerate(self.groups)
            if group.columns is not None or group.worker == worker
        }


def partitioning(plan: Plan, workers: int) -> Partitioning:
    """How ``plan``'s rules split among ``workers`` workers (module docstring); the
    groups that run whole take turns among the workers."""
    stages = fed_stages(plan, [s.name for s in plan.sources()])
    sources = {s.name for s in plan.sources()}
    by_index = dict(stages)
    root = {i: i for i, _ in stages}

    def find(i: int) -> int:
        while root[i] != i:
            i = root[i]
        return i

    # A stream's producers go together (a UNION ALL: one watermark, one tracker of an
    # alert), and so does every stage reading it.
    producers: dict[str, list[int]] = {}
    for i, stage in stages:
        for sink in stage_sinks(stage):
            producers.setdefault(sink, []).append(i)
    for i, stage in stages:
        for j in [
            *producers.get(stage.input, ()),
            *(p for s in stage_sinks(stage) for p in producers[s]),
        ]:
            root[find(j)] = find(i)
    linked: dict[int, list[int]] = {}
    for i, _ in stages:
        linked.setdefault(find(i), []).append(i)
    central: list[int] = []
    keyed: list[tuple[list[int], set[str], tuple[str, ...]]] = []
    whole: list[list[int]] = []
    for members in linked.values():
        stage = by_index[members[0]]
        if len(members) == 1 and stage.query.window is None:
            central.append(members[0])
            continue
        common = set.intersection(*(set(by_index[i].key) for i in members))
        if not common or any(
            by_index[i].input not in sources or by_index[i].query.window is None for i in members
        ):
            whole.append(members)
            continue
        for group in keyed:
            if group[1] & common:
                group[0].extend(members)
                group[1].intersection_update(common)
                break
        else:
            keyed.append((list(members), common, stage.key))
    groups = [
        StageGroup(frozenset(m), _read(m, by_index, sources), tuple(c for c in o if c in k))
        for m, k, o in keyed
    ]
    groups += [
        StageGroup(frozenset(m), _read(m, by_index, sources), None, n % workers)
        for n, m in enumerate(whole)
    ]
    return Partitioning(workers, tuple(groups), frozenset(central))


def _read(members: list[int], stages: Mapping[int, Stage], sources: set[str]) -> frozenset[str]:
    """The source streams the stages ``members`` read."""
    return frozenset(stages[i].input for i in members) & sources


@dataclass
class Produced:
    """What pipelines produced over the whole input: their output rows and incidents."""

    emitted: list[SinkRows] = field(default_factory=list)
    incidents: dict[IncidentKey, IncidentUpdate] = field(default_factory=dict)
    closed: Counter[str] = field(default_factory=Counter)
    """Output rows the final advance produced, per sink."""

    def take(self, step: BatchResult) -> Counter[str]:
        """Take in a step's outputs and incidents; its number of output rows per sink."""
        rows: Counter[str] = Counter()
        for update in step.incidents:
            self.incidents[(update.alert, update.key, update.opened_at)] = update
        for emitted in step.outputs:
            self.emitted.append(emitted)
            rows[emitted.sink] += emitted.table.num_rows
        return rows

    def drain(self) -> list[SinkRows]:
        """The output rows taken in since the last drain (no longer held here)."""
        emitted, self.emitted = self.emitted, []
        return emitted


class PartitionWorker:
    """One worker: a pipeline per group it runs (index: the group's stages), each fed
    its share of the admitted readings."""

    def __init__(self, plan: Plan, groups: Mapping[int, frozenset[int]]) -> None:
        self.pipelines = {number: Pipeline(plan, only=only) for number, only in groups.items()}
        self.result = Produced()

    def feed(self, shares: Shares, watermarks: Mapping[str, int]) -> None:
        """A batch's share, then every pipeline advanced to the judge's watermarks."""
        for number, pipeline in self.pipelines.items():
            self.result.take(pipeline.feed(shares.get(number, {}), watermarks))

    def end(self, ends: Mapping[str, int] | None) -> None:
        """The final advance to ``ends`` (None: none)."""
        if ends is not None:
            closed: Counter[str] = Counter()
            for pipeline in self.pipelines.values():
                closed += self.result.take(pipeline.feed({}, ends))
            self.result.closed = closed

    def drain(self) -> list[SinkRows]:
        """The rows emitted since the last drain."""
        return self.result.drain()

    def produced(self) -> Produced:
        """Everything the worker produced (but the rows drained)."""
        return self.result


class CapReachable(Exception):
    """A stage has seen as many distinct keys as its stream's cap on live keys: the cap
    may quarantine readings, which a split evaluation cannot decide."""


class DistinctKeys:
    """The distinct keys each capped stage has been admitted readings of, to tell when a
    cap on live keys could first matter (:meth:`add` raises :class:`CapReachable`)."""

    def __init__(self, plan: Plan, caps: Mapping[str, int]) -> None:
        self.caps = {name: cap for name, cap in caps.items() if cap > 0}
        self._stages: dict[str, list[Stage]] = {}
        for stage in plan.stages():
            if stage.input in self.caps and stage.key:
                self._stages.setdefault(stage.input, []).append(stage)
        self._seen: dict[str, set[tuple[object, ...]]] = {}

    def add(self, admitted: Mapping[str, pa.Table]) -> None:
        """Count a batch's admitted readings' keys."""
        for stream, table in admitted.items():
            for stage in self._stages.get(stream, ()):
                seen = self._seen.setdefault(stage.name, set())
                columns = list(stage.key)
                keys = table.select(columns).group_by(columns).aggregate([])
                seen.update(zip(*(keys.column(c).to_pylist() for c in columns), strict=True))
                if len(seen) >= self.caps[stream]:
                    raise CapReachable(
                        f"{stage.name} has seen {len(seen):,} keys of {stream}, its cap on "
                        f"live keys is {self.caps[stream]:,}"
                    )
