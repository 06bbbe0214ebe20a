"""Incidents: an alert's reports as (alert, key) episodes that open and resolve in event
time, composed after the stage that emits the alert.

An alert's condition is a relation, the keys whose condition holds (CQL): its ISTREAM
opens incidents, its DSTREAM resolves them. An :class:`IncidentTracker` computes it per
key of the alert (the key its ``alerts`` rows carry) from two feeds, as
:class:`~engine.core.plan.Incidents` says:

* **reports**: the alert's own rows. The condition holds at every instant with one.
* **observations**: rows of the alert's input stream (every row of the key by default;
  with ``RESOLVE WHEN c``, those where ``c`` holds). At an instant with observations and
  no report the condition stops. With ``RESOLVE AFTER d`` there are none: the
  condition stops ``d`` after the key's latest report, unless a report comes by then.

Per key the tracker runs Prometheus' alert states, in event time: inactive → pending
(``FOR``: the condition must hold that long) → firing (the incident is open) →
recovering (``KEEP FIRING FOR``: still open, waiting for the condition to return) →
resolved. All that is known of an instant is taken at once, observations before
timers (the rule the windows follow for tuples and expirations): so an instant's rows
decide the condition there whatever their order, and a report exactly at a deadline
keeps the incident. An instant is final once the watermark has passed it, so the
incidents depend on the readings only, never on how they were cut into batches: the
live engine and replay give the same ones.

Every incident an advance changed (opened, reported, resolved) comes out as an
:class:`IncidentUpdate` holding its whole state, so the last update of an incident is
the incident. State per key is one record in the store (kind ``head``, under
:attr:`~engine.core.plan.Incidents.name`); a key with no incident, pending episode or
unprocessed row keeps none.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.core.columnar import ops
from engine.core.plan import Incidents, compile_ops
from engine.core.runners import KEY, SEQ, SOURCE, TS, Saved, key_json
from engine.core.state import StateKey, StateStore
from engine.core.wakeups import WakeupSchedule

IDLE, PENDING, FIRING, RECOVERING = 0, 1, 2, 3
"""A key's phase: no incident; the condition holds, FOR not yet over; an incident is
open; it is open but its condition stopped, KEEP FIRING FOR not yet over."""
OPEN = (FIRING, RECOVERING)
"""The phases of a key whose incident is open."""

_PICKLE = pickle.HIGHEST_PROTOCOL
_NO_INSTANTS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class IncidentUpdate:
    """An incident's whole state after an advance (times in epoch ms)."""

    alert: str
    key: str
    """The alert's key values as JSON (the ``_key`` of its emitted rows)."""
    opened_at: int
    last_report_at: int
    resolved_at: int | None
    reports: int
    """The alert's rows for the key from the start of the episode (FOR included) on."""
    row: dict[str, Any]
    """The latest report's row (its message)."""


@dataclass
class KeyState:
    """One key of one alert: plain data, pickled as is."""

    phase: int = IDLE
    since: int = 0
    """PENDING: when the condition began to hold; RECOVERING: when it stopped."""
    opened: int = 0
    holds: bool = False
    last_report: int = 0
    reports: int = 0
    row: dict[str, Any] = field(default_factory=dict)
    waiting: list[tuple[int, str, int, dict[str, Any]]] = field(default_factory=list)
    """Reports not processed yet: (ts, source, seq, row)."""
    observed: np.ndarray = field(default_factory=lambda: _NO_INSTANTS)
    """Instants with observations not processed yet: sorted, each once (int64). A
    key's observations arrive ahead of the watermark by about the stream's slack, so
    each advance splits them at the watermark rather than scanning them all."""

    def idle(self) -> bool:
        """Nothing to keep: no episode and nothing waiting."""
        return self.phase == IDLE and not self.waiting and not len(self.observed)


class IncidentTracker:
    """The incidents of one alert, every key (see the module docstring).

    ``key_columns``: the columns of an observed row that make its key, or None when the
    observed rows come from the alert's own stage and carry its key (``_key``).
    ``timestamp`` is the observed stream's timestamp column.
    """

    kind = "incidents"

    def __init__(
        self, spec: Incidents, key_columns: tuple[str, ...] | None, timestamp: str
    ) -> None:
        self.spec = spec
        self.key_columns = key_columns
        self.timestamp = timestamp
        self.keys: dict[str, KeyState] = {}
        self._clear = compile_ops(spec.clear) if spec.clear else None
        self._vector = bool(spec.clear) and ops.vectorised(spec.clear)
        self._wakeups: WakeupSchedule[str] = WakeupSchedule()
        self._fed: set[str] = set()
        self._touched: set[str] = set()
        # Kept as keys change phase, not counted over every key each batch.
        self._open = 0

    @property
    def name(self) -> str:
        """The name its state is filed under."""
        return self.spec.name

    # -- feeds -----------------------------------------------------------------------------
    def observe(
        self, rows: pa.Table, keys: Sequence[str] | pa.ChunkedArray | pa.Array | None = None
    ) -> None:
        """Rows of the observed stream (its columns with the timestamp, ``source`` and
        ``seq``); ``keys``: each row's key as JSON (strings, or an Arrow string column)
        when the rows carry the alert's key (``key_columns`` None)."""
        column = keys if isinstance(keys, pa.ChunkedArray | pa.Array | None) else pa.array(keys)
        if not rows.num_rows:
            return
        if self._clear is not None:
            kept = self._cleared(rows)
            if len(kept) < rows.num_rows:  # else every row, each once, in order
                rows = rows.take(pa.array(kept, pa.int64()))
                column = None if column is None else column.take(pa.array(kept, pa.int64()))
            if not rows.num_rows:
                return
        # Per key, not per row: a stream observed row by row (a reading each) has
        # few keys a batch.
        ts = np.asarray(pc.cast(rows.column(self.timestamp), pa.int64()).to_numpy(), np.int64)
        if column is not None:
            keyed = pa.table({"k": column.cast(pa.string())})
        else:
            keyed = rows.select(list(self.key_columns or ()))
        names = keyed.column_names
        if not names:
            self._observe(key_json(()), np.unique(ts))
            return
        found, instants, bounds = _observed_by_key(keyed, ts)
        for key, start, end in zip(found, bounds[:-1], bounds[1:], strict=True):
            self._observe(key[0] if column is not None else key_json(key), instants[start:end])

    def _observe(self, key: str, new: np.ndarray) -> None:
        """Take a key's new observed instants ``new`` (sorted, each once)."""
        state = self._state(key)
        held = state.observed
        whole = np.concatenate([held, new])
        if len(held) and held[-1] >= new[0]:
            # Two sorted runs: a stable sort (timsort) merges them in one pass.
            whole.sort(kind="stable")
            whole = whole[np.concatenate([[True], whole[1:] != whole[:-1]])]
        state.observed = whole
        self._fed.add(key)

    def _cleared(self, rows: pa.Table) -> np.ndarray:
        """The indexes of the rows that come out of the clear steps (each once)."""
        if self._vector:
            _, parents = ops.apply(self.spec.clear, rows)
            # Parents come in input order (a join repeats a row's): each once.
            return parents[np.concatenate([[True], parents[1:] != parents[:-1]])[: len(parents)]]
        assert self._clear is not None
        clear = self._clear
        return np.array([i for i, row in enumerate(rows.to_pylist()) if clear(row)], np.int64)

    def report(self, emitted: pa.Table) -> None:
        """The alert's emitted rows (:class:`~engine.core.runners.SinkRows` columns)."""
        names = [n for n in emitted.column_names if n not in (TS, SOURCE, SEQ, KEY)]
        for row, key, ts, source, seq in zip(
            emitted.select(names).to_pylist(),
            emitted.column(KEY).to_pylist(),
            emitted.column(TS).to_pylist(),
            emitted.column(SOURCE).to_pylist(),
            emitted.column(SEQ).to_pylist(),
            strict=True,
        ):
            self._state(key).waiting.append((ts, source, seq, row))
            self._fed.add(key)

    def _state(self, key: str) -> KeyState:
        found = self.keys.get(key)
        if found is None:
            found = self.keys[key] = KeyState()
        return found

    # -- time ------------------------------------------------------------------------------
    def advance(self, watermark: int) -> list[IncidentUpdate]:
        """Process every instant below ``watermark`` of the keys with new rows or a due
        timer; the incidents that changed, in their final state."""
        due = self._fed
        self._fed = set()
        due.update(self._wakeups.due(watermark))
        changed: dict[tuple[str, int], IncidentUpdate] = {}
        for key in sorted(due):
            state = self.keys[key]
            was_open = state.phase in OPEN
            self._run(key, state, watermark, changed)
            self._open += (state.phase in OPEN) - was_open
            self._touched.add(key)
            if state.idle():
                del self.keys[key]
                self._wakeups.discard(key)
            else:
                self._wakeups.set(key, self._wakeup(state))
        return list(changed.values())

    def _timer(self, state: KeyState) -> int | None:
        """The next instant at which time alone changes the key (FOR, KEEP FIRING FOR,
        RESOLVE AFTER), or None."""
        spec, found = self.spec, []
        if state.phase == PENDING:
            found.append(state.since + spec.pending_ms)
        if state.phase == RECOVERING:
            found.append(state.since + spec.keep_firing_ms)
        if spec.quiet_ms is not None and state.holds:
            found.append(state.last_report + spec.quiet_ms)
        return min(found, default=None)

    def _wakeup(self, state: KeyState) -> int | None:
        """The lowest watermark at which an advance can change the key."""
        found = [t + 1 for t in (self._timer(state),) if t is not None]
        found += [int(state.observed[0]) + 1] if len(state.observed) else []
        found += [min(w[0] for w in state.waiting) + 1] if state.waiting else []
        return min(found, default=None)

    def _run(
        self,
        key: str,
        state: KeyState,
        watermark: int,
        changed: dict[tuple[str, int], IncidentUpdate],
    ) -> None:
        """The key's instants below ``watermark``, one after the other."""
        spec = self.spec
        reports: dict[int, list[tuple[int, str, int, dict[str, Any]]]] = {}
        later = []
        for item in state.waiting:
            if item[0] < watermark:
                reports.setdefault(item[0], []).append(item)
            else:
                later.append(item)
        state.waiting = later
        cut = int(np.searchsorted(state.observed, watermark))
        below, rest = state.observed[:cut], state.observed[cut:]
        state.observed = rest if len(rest) else _NO_INSTANTS  # not a view of the old
        if state.phase == IDLE and not reports:
            return  # rows that stop a condition that does not hold change nothing
        observed = set(below.tolist())
        instants = sorted(reports.keys() | observed)
        i = 0
        while True:
            candidates = [self._timer(state), instants[i] if i < len(instants) else None]
            now = min((t for t in candidates if t is not None), default=None)
            if now is None or now >= watermark:
                return
            if i < len(instants) and instants[i] == now:
                i += 1
            here = reports.get(now)
            opened_before = state.phase in OPEN
            # What the instant's rows say, then what its timers say.
            if here:
                if state.phase == IDLE:
                    state.reports = 0  # a new episode
                state.reports += len(here)
                state.last_report = now
                state.row = max(here, key=lambda r: (r[1], r[2]))[3]
                state.holds = True
            elif now in observed:
                state.holds = False
            elif spec.quiet_ms is not None and state.holds:
                state.holds = now < state.last_report + spec.quiet_ms
            resolved = self._step(state, now)
            open_now = state.phase in OPEN
            if resolved is not None or (open_now and (here or not opened_before)):
                changed[(key, state.opened)] = IncidentUpdate(
                    spec.alert,
                    key,
                    state.opened,
                    state.last_report,
                    resolved,
                    state.reports,
                    state.row,
                )
            if resolved is not None:
                state.phase = IDLE

    def _step(self, state: KeyState, now: int) -> int | None:
        """Move the key's phase at instant ``now`` (the condition already taken); the
        resolution instant if its incident resolves here."""
        spec = self.spec
        if state.holds:
            if state.phase == IDLE:
                state.phase, state.since = PENDING, now
            elif state.phase == RECOVERING:
                state.phase = FIRING
        elif state.phase == PENDING:
            state.phase = IDLE
        elif state.phase == FIRING:
            state.phase, state.since = RECOVERING, now
        if state.phase == PENDING and now >= state.since + spec.pending_ms:
            state.phase, state.opened = FIRING, state.since + spec.pending_ms
        if state.phase == RECOVERING and now >= state.since + spec.keep_firing_ms:
            return state.since + spec.keep_firing_ms
        return None

    # -- state -----------------------------------------------------------------------------
    def save(self, store: StateStore) -> None:
        """Write the keys changed since the last save; forget the ones gone idle."""
        for key in sorted(self._touched):
            entry: StateKey = ("head", self.name, key, 0)
            state = self.keys.get(key)
            if state is None:
                store.delete(entry)
                continue
            record = (self.spec.definition, self.kind, self._wakeups.get(key), state)
            store.put(entry, pickle.dumps(record, _PICKLE))
        self._touched.clear()

    def restore(self, saved: Saved) -> list[StateKey]:
        """Take up the saved keys; returns the entries of another definition or kind."""
        stale, scheduled = [], []
        for entry, data in saved.get("head", []):
            definition, kind, wakeup, state = pickle.loads(data)
            if definition != self.spec.definition or kind != self.kind:
                stale.append(entry)
                continue
            if isinstance(state.observed, set):  # saved before instants were an array
                state.observed = np.array(sorted(state.observed), dtype=np.int64)
            self.keys[entry[2]] = state
            self._open += state.phase in OPEN
            scheduled.append((entry[2], wakeup))
        self._wakeups.load(scheduled)
        others = [e for kind, entries in saved.items() if kind != "head" for e, _ in entries]
        return stale + others

    def live_keys(self) -> int:
        """How many keys hold state."""
        return len(self.keys)

    def firing(self) -> int:
        """How many incidents are open now (firing, or within KEEP FIRING FOR)."""
        return self._open


def _observed_by_key(
    keyed: pa.Table, ts: np.ndarray
) -> tuple[list[tuple[Any, ...]], np.ndarray, np.ndarray]:
    """The keys of rows (``keyed``: their key columns) in key order, each key's
    instants of ``ts`` sorted and each once, end to end, and where each key's begin (and
    the last ends): one sort of (key rank, instant) for every row, as one integer where
    it fits."""
    names = keyed.column_names
    ranks = ops.key_ranks(keyed, names)
    if ranks is None:  # a key column not ranked: each key's place in Arrow's sort
        order = np.asarray(ops.sort_order(keyed, names), dtype=np.int64)
        keyed, ts = keyed.take(order), ts[order]
        sizes = [end - start for start, end in ops.segments(keyed, names)]
        ranks = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    least = int(ts.min())
    span = int(ts.max()) - least + 1
    if (int(ranks.max()) + 1) * span < 1 << 62:
        code = np.sort(ranks * span + (ts - least))
        rank, instants = code // span, code % span + least
    else:
        order = np.lexsort((ts, ranks))
        rank, instants = ranks[order], ts[order]
    first = np.concatenate([[True], (instants[1:] != instants[:-1]) | (rank[1:] != rank[:-1])])
    rank, instants = rank[first], instants[first]
    starts = np.flatnonzero(np.concatenate([[True], rank[1:] != rank[:-1]]))
    # A row of each key, to read its values from.
    distinct, inverse = ops.distinct_codes(ranks)
    row_of = np.empty(len(distinct), dtype=np.int64)
    row_of[inverse] = np.arange(len(ranks), dtype=np.int64)
    rows = pa.array(row_of[np.searchsorted(distinct, rank[starts])], pa.int64())
    values = [column.take(rows).to_pylist() for column in keyed.columns]
    return list(zip(*values, strict=True)), instants, np.append(starts, len(rank))
