"""Arrival order: disorder models, faults (late, duplicate, malformed), clock skew, heartbeats.

A generator yields readings in true event-time order, in blocks
(:class:`simulators.rows.Block`). :func:`arrange` gives each one an *arrival time*
(event-time ms at which the source sends it) and yields them in arrival order, in
chunks (:class:`simulators.rows.Chunk`) interleaved with heartbeats and malformed
payloads. Models (``--disorder``):

- ``none``: arrival = event time (in order);
- ``bounded:D``: arrival = event time + U(0, D) seconds, so no reading arrives more
  than D seconds behind the newest one sent before it;
- ``blocks:SIZE``: block-sorted disorder (WID section 7, Figure 7): the time axis is cut
  into SIZE-second blocks aligned to the epoch; each block is sent at its end, in random
  order, like a router flushing its cache once a minute.

Faults, exclusive per reading: a ``late`` reading is delayed by ``slack + 2 x bound +
U(1, 10) s``, and further until a reading of its stream more than the slack newer has
been sent (or a heartbeat, when they are on), so it is behind the newest by more than
the slack even in a sparse stream; a ``duplicate`` is sent again U(0, 1) s
after the original (as a QoS 1 redelivery would); a ``malformed`` one is replaced by a
broken payload (its ``seq`` is then lost). Each source may have a constant clock skew
added to the ``ts`` it reports. All of it is recorded in the ground truth.

Heartbeats (every ``heartbeat_ms`` of arrival time, per source) carry the lower bound the
model guarantees for the ``ts`` of every on-time reading the source still has to send;
late readings break that promise by construction, and duplicates repeat old readings.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import orjson

from simulators.common import format_ts
from simulators.rows import Block, Chunk, Writer
from simulators.truth import Truth

#: One outgoing message: (arrival ms, "reading" | "heartbeat" | "malformed", topic, payload).
#: ``payload`` is a dict for readings and heartbeats and raw bytes for malformed ones.
Message = tuple[int, str, str, dict | bytes]
#: What :func:`arrange` yields: readings sent in a row, or one message.
Item = Chunk | Message


@dataclass(frozen=True, slots=True)
class DisorderModel:
    """A disorder model: ``kind`` in none/bounded/blocks with its parameter in ms."""

    kind: str
    param_ms: int = 0

    @classmethod
    def parse(cls, text: str) -> DisorderModel:
        """Parse ``none``, ``bounded:SECONDS`` or ``blocks:SECONDS``."""
        kind, _, arg = text.partition(":")
        if kind == "none" and not arg:
            return cls("none")
        if kind in ("bounded", "blocks") and arg:
            ms = round(float(arg) * 1000)
            if ms > 0:
                return cls(kind, ms)
        raise ValueError(f"bad disorder model {text!r}: want none, bounded:D or blocks:SIZE")

    @property
    def bound_ms(self) -> int:
        """The largest delay the model gives an on-time reading."""
        return self.param_ms

    def arrivals(self, t: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Arrival times of readings with event times ``t`` and their tie-break keys."""
        if self.kind == "bounded":
            return t + rng.integers(0, self.param_ms + 1, len(t)), np.zeros(len(t))
        if self.kind == "blocks":
            # Sent at the block's end; a random key shuffles the block.
            return (t // self.param_ms + 1) * self.param_ms, rng.random(len(t))
        return t.copy(), np.zeros(len(t))

    def floor(self, h: int) -> int:
        """Lower bound on the event time of any on-time reading arriving after ``h``."""
        if self.kind == "bounded":
            return h - self.param_ms
        if self.kind == "blocks":
            return h // self.param_ms * self.param_ms
        return h


@dataclass(frozen=True, slots=True)
class Faults:
    """Fault fractions (of all readings), the slack to be late against, and max clock skew."""

    late: float = 0.0
    duplicate: float = 0.0
    malformed: float = 0.0
    slack_ms: int = 2000
    skew_ms: int = 0


MALFORMED_KINDS = ("truncated", "missing_field", "bad_timestamp", "not_utf8")


def _malform(payload: dict, how: str) -> bytes | dict:
    """A broken version of ``payload`` (bytes when it is not valid JSON any more)."""
    if how == "truncated":
        raw = orjson.dumps(payload)
        return raw[: len(raw) // 2]
    if how == "missing_field":
        first = next(iter(payload))
        return {k: v for k, v in payload.items() if k != first}
    if how == "bad_timestamp":
        return {**payload, "ts": "not a time"}
    return b"\xff\xfe" + orjson.dumps(payload)


def _sorted(rows: np.ndarray, keyed: bool = True) -> np.ndarray:
    """Rows in sending order: by arrival, then tie-break key, then order of generation.

    Not ``keyed`` (every key 0, the rows in order of generation where they arrive
    together): a stable sort by arrival is the same and quicker.
    """
    if not keyed:
        return rows[np.argsort(rows["arrival"], kind="stable")]
    return rows[np.lexsort((rows["order"], rows["key"], rows["arrival"]))]


class _Arrangement:
    """The state of :func:`arrange` between blocks."""

    def __init__(
        self,
        model: DisorderModel,
        faults: Faults,
        sources: dict[str, str],
        rng: random.Random,
        truth: Truth,
        ts_format: str,
        heartbeat_ms: int | None,
        start_ms: int,
        end_ms: int | None,
        epoch: str | None,
    ) -> None:
        self.model, self.faults, self.sources, self.truth = model, faults, sources, truth
        self.ts_format, self.epoch, self.end_ms = ts_format, epoch, end_ms
        self.skew: dict[str, int] = {}
        for src in sorted(sources):
            self.skew[src] = rng.randint(-faults.skew_ms, faults.skew_ms) if faults.skew_ms else 0
            if self.skew[src]:
                truth.record({"type": "skew", "source": src, "skew_ms": self.skew[src]})
        self.rng = np.random.default_rng(rng.getrandbits(128))
        self.keyed = model.kind == "blocks"  # other models' keys are all 0
        self.late_extra = faults.slack_ms + 2 * model.bound_ms
        self.last_late = end_ms - self.late_extra - 1000 if end_ms is not None else None
        self.kinds = sorted(set(sources.values()))
        # The newest ts sent per stream kind (index into `kinds`): a late reading is
        # held back until one more than the slack newer has been sent.
        self.newest: dict[int, int] = {}
        kind_skews: dict[int, int] = {}
        for src, kind in sources.items():
            k = self.kinds.index(kind)
            kind_skews[k] = max(kind_skews.get(k, self.skew[src]), self.skew[src])
        self.kind_skew = kind_skews
        self.hb_ms = heartbeat_ms or 0  # 0: no heartbeats
        self.next_hb = start_ms + self.hb_ms if self.hb_ms else None
        self.last_t = start_ms
        self.counter = 0
        self.writer: Writer | None = None
        self.topic_skew = np.zeros(0, dtype=np.int64)
        self.topic_kind = np.zeros(0, dtype=np.int64)
        # Rows waiting for their arrival (any order), and late rows held back (their
        # "arrival" the planned one).
        self.pending: np.ndarray | None = None
        self.held: np.ndarray | None = None

    def _setup(self, block: Block) -> None:
        layout = block.layout
        self.writer = Writer(layout, self.ts_format, self.epoch)
        self.topic_skew = np.array([self.skew[s] for s in layout.sources], dtype=np.int64)
        self.topic_kind = np.array(
            [self.kinds.index(self.sources[s]) for s in layout.sources], dtype=np.int64
        )
        self.pending = block.rows[:0].copy()
        self.held = block.rows[:0].copy()

    def add(self, block: Block) -> Iterator[Item]:
        """Take a block's readings in; yield everything due before its ``until``."""
        if self.writer is None:
            self._setup(block)
        assert self.pending is not None and self.held is not None
        n = len(block.rows)
        if n:
            self.last_t = max(self.last_t, int(block.rows["t"][-1]))
            f = self.faults
            arrival, key = self.model.arrivals(block.rows["t"], self.rng)
            u = self.rng.random(n)
            p_mal = f.malformed
            p_late = p_mal + f.late
            p_dup = p_late + f.duplicate
            late = (u >= p_mal) & (u < p_late)
            if self.last_late is not None:
                # Too near the end, nothing would overtake it: such a reading goes on time.
                late &= block.rows["t"] < self.last_late
            rows = block.rows.copy()
            rows["ts"] = rows["t"] + self.topic_skew[rows["topic"]]
            rows["order"] = self.counter + np.arange(n)
            rows["arrival"], rows["key"] = arrival, key
            mal = u < p_mal
            if mal.any():
                how = np.minimum((u[mal] / p_mal * len(MALFORMED_KINDS)).astype(np.int64), 3)
                rows["fault"][mal] = how + 1
                self._record(rows[mal], "malformed", how)
            copies = rows[(u >= p_late) & (u < p_dup)]
            if late.any():
                held = rows[late]
                extra = self.rng.integers(1000, 10_001, len(held))
                held["arrival"] = held["t"] + self.late_extra + extra
                self.held = np.concatenate([self.held, held])
                rows = rows[~late]
            if len(copies):
                # Sent again U(0, 1) s after the original, as a QoS 1 redelivery would.
                copies["arrival"] += self.rng.integers(0, 1001, len(copies))
                copies["order"] = self.counter + n + np.arange(len(copies))
                self._record(copies, "duplicate")
            self.counter += n + len(copies)
            self.pending = _sorted(np.concatenate([self.pending, rows, copies]), self.keyed)
        yield from self._ready(block.until, block.until)

    def _record(self, rows: np.ndarray, kind: str, how: np.ndarray | None = None) -> None:
        assert self.writer is not None
        sources = self.writer.layout.sources
        topics, seqs = rows["topic"].tolist(), rows["seq"].tolist()
        for i, (topic, seq) in enumerate(zip(topics, seqs, strict=True)):
            rec = {"type": kind, "source": sources[topic], "seq": seq}
            if how is not None:
                rec["reason"] = MALFORMED_KINDS[int(how[i])]
            self.truth.record(rec)

    def _heartbeat_times(self, until: int) -> list[int]:
        times = []
        while self.next_hb is not None and self.next_hb < until:
            times.append(self.next_hb)
            self.next_hb += self.hb_ms
        return times

    def _ready(self, until: int, hb_until: int) -> Iterator[Item]:
        """Send the rows arriving before ``until`` and the heartbeats before ``hb_until``,
        releasing the held late rows they overtake."""
        assert self.pending is not None and self.held is not None
        hbs = self._heartbeat_times(hb_until)
        # Pending rows are in sending order.
        cut = int(np.searchsorted(self.pending["arrival"], until))
        out, self.pending = self.pending[:cut], self.pending[cut:]
        released = self._advance(out, hbs)
        if len(released):
            now = released["arrival"] < until
            if now.any():
                out = _sorted(np.concatenate([out, released[now]]))
            if not now.all():
                self.pending = _sorted(np.concatenate([self.pending, released[~now]]))
        yield from self._emit(out, hbs)

    def _advance(self, out: np.ndarray, hbs: list[int]) -> np.ndarray:
        """Follow the newest ts sent per stream kind through ``out`` (in sending order)
        and the heartbeats ``hbs``; return the held rows released, their arrival set."""
        assert self.held is not None
        hb_arr = np.array(hbs, dtype=np.int64)
        floors = np.array([self.model.floor(h) for h in hbs], dtype=np.int64)
        ok = out["fault"] == 0
        kinds = self.topic_kind[out["topic"]]
        held_kinds = self.topic_kind[self.held["topic"]]
        released = []
        keep = np.ones(len(self.held), dtype=bool)
        for k in range(len(self.kinds)):
            mine = ok & (kinds == k)
            ts = out["ts"][mine]
            hb_ts = floors + self.kind_skew.get(k, 0)
            waiting = np.flatnonzero(held_kinds == k)
            if not len(waiting):
                top = max(ts.max(initial=-(2**62)), hb_ts.max(initial=-(2**62)))
                if top > self.newest.get(k, -(2**62)):
                    self.newest[k] = int(top)
                continue
            # Events in sending order: the rows, each heartbeat after the rows of its time.
            ev_arr = out["arrival"][mine]
            at = np.searchsorted(ev_arr, hb_arr, side="right")
            ev_arr = np.insert(ev_arr, at, hb_arr)
            ev_ts = np.insert(ts, at, hb_ts)
            if not len(ev_ts):
                continue
            newest = np.maximum.accumulate(ev_ts)
            if k in self.newest:
                newest = np.maximum(newest, self.newest[k])
            self.newest[k] = int(newest[-1])
            rows = self.held[waiting]
            # The first event (sent after the row was held) that leaves it more than the
            # slack behind releases it.
            first = np.searchsorted(newest, rows["ts"] + self.faults.slack_ms, side="right")
            first = np.maximum(first, np.searchsorted(ev_arr, rows["t"], side="left"))
            go = first < len(ev_arr)
            if not go.any():
                continue
            rows = rows[go]
            rows["arrival"] = np.maximum(rows["arrival"], ev_arr[first[go]] + 1)
            keep[waiting[go]] = False
            released.append(rows)
            self._record_late(rows)
        if not released:
            return self.held[:0]
        self.held = self.held[keep]
        return np.concatenate(released)

    def _record_late(self, rows: np.ndarray) -> None:
        assert self.writer is not None
        sources = self.writer.layout.sources
        for topic, seq, ts, t, arrival in zip(
            rows["topic"].tolist(),
            rows["seq"].tolist(),
            rows["ts"].tolist(),
            rows["t"].tolist(),
            rows["arrival"].tolist(),
            strict=True,
        ):
            self.truth.record(
                {
                    "type": "late",
                    "source": sources[topic],
                    "seq": seq,
                    "ts": format_ts(ts, self.ts_format),
                    "delay_ms": arrival - t,
                }
            )

    def _heartbeats(self, h: int) -> Iterator[Message]:
        floor = self.model.floor(h)
        for src in sorted(self.sources):
            topic = f"lookout/{self.sources[src]}/{src}/heartbeat"
            ts = format_ts(floor + self.skew[src], self.ts_format)
            yield h, "heartbeat", topic, {"source": src, "ts": ts}

    def _emit(self, out: np.ndarray, hbs: list[int]) -> Iterator[Item]:
        """``out`` in chunks, with the heartbeats after the rows of their time and the
        malformed rows as messages of their own."""
        assert self.writer is not None
        arrival = out["arrival"]
        events = [(int(np.searchsorted(arrival, h, side="right")), 0, h) for h in hbs]
        if self.faults.malformed:
            events += [(m, 1, m) for m in np.flatnonzero(out["fault"]).tolist()]
            events.sort()
        cursor = 0
        for pos, what, x in events:
            if pos > cursor:
                yield Chunk(out[cursor:pos], self.writer)
            if what == 0:
                cursor = pos
                yield from self._heartbeats(x)
            else:
                row = out[x]
                payload = self.writer.payload(row)
                how = MALFORMED_KINDS[int(row["fault"]) - 1]
                topic = self.writer.names[int(row["topic"])]
                yield int(row["arrival"]), "malformed", topic, _malform(payload, how)
                cursor = x + 1
        if cursor < len(out):
            yield Chunk(out[cursor:], self.writer)

    def finish(self) -> Iterator[Item]:
        """End of input: send the stragglers, keeping heartbeats going while they arrive
        (a late reading released meanwhile may arrive after the rest: go round again)."""
        if self.writer is None:
            return
        assert self.pending is not None and self.held is not None
        last_arrival = self.last_t
        while len(self.pending):
            last_arrival = max(last_arrival, int(self.pending["arrival"].max()))
            yield from self._ready(last_arrival + 1, last_arrival)
        # A held reading nothing newer overtook by the slack is not late: it goes last, on
        # time (the readings too near the end are not made late, so this is rare).
        if len(self.held):
            rows = self.held[np.argsort(self.held["order"], kind="stable")]
            rows["arrival"] = last_arrival
            yield Chunk(rows, self.writer)
        if self.next_hb is not None:
            # Nothing more will come: promise the run's end (never less than before).
            final = max(self.last_t, self.end_ms or 0, self.model.floor(self.next_hb - self.hb_ms))
            for src in sorted(self.sources):
                topic = f"lookout/{self.sources[src]}/{src}/heartbeat"
                ts = format_ts(final + self.skew[src], self.ts_format)
                yield max(self.last_t, last_arrival), "heartbeat", topic, {"source": src, "ts": ts}


def arrange(
    blocks: Iterable[Block],
    model: DisorderModel,
    faults: Faults,
    sources: dict[str, str],
    rng: random.Random,
    truth: Truth,
    ts_format: str,
    heartbeat_ms: int | None,
    start_ms: int,
    end_ms: int | None = None,
    epoch: str | None = None,
) -> Iterator[Item]:
    """Yield the readings of ``blocks`` in arrival order, in chunks, with heartbeats and
    malformed payloads as messages of their own.

    ``sources`` maps every source id to its kind (``traffic``, ``rfid``, ``positions``),
    which names its heartbeat topic. ``heartbeat_ms`` None turns heartbeats off.
    ``end_ms`` is the run's end (None: endless): readings too close to it to be
    overtaken by a newer one by more than the slack are not made late. ``epoch``, when
    given, is set on every reading: the run's id, which tells its ``seq`` numbers from
    those of another run of the same sources.
    """
    state = _Arrangement(
        model, faults, sources, rng, truth, ts_format, heartbeat_ms, start_ms, end_ms, epoch
    )
    for block in blocks:
        yield from state.add(block)
    yield from state.finish()


def messages(items: Iterable[Item]) -> Iterator[Message]:
    """The messages of :func:`arrange`'s output one by one, each reading's payload a dict
    (slow: for tests and tools)."""
    for item in items:
        if isinstance(item, Chunk):
            yield from item.messages()
        else:
            yield item
