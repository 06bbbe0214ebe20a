"""Arrival order: disorder models, faults (late, duplicate, malformed), clock skew, heartbeats.

A generator yields readings in true event-time order. :func:`arrange` gives each one an
*arrival time* (event-time ms at which the source sends it) and yields the messages in
arrival order, interleaved with heartbeats. Models (``--disorder``):

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

import heapq
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import orjson

from simulators.common import Reading, format_ts, parse_ts
from simulators.truth import Truth

#: One outgoing message: (arrival ms, "reading" | "heartbeat" | "malformed", topic, payload).
#: ``payload`` is a dict for readings and heartbeats and raw bytes for malformed ones.
Message = tuple[int, str, str, dict | bytes]


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

    def arrival(self, t: int, rng: random.Random) -> tuple[int, float]:
        """Arrival time of a reading with event time ``t`` and its tie-break key."""
        if self.kind == "bounded":
            return t + rng.randint(0, self.param_ms), 0.0
        if self.kind == "blocks":
            # Sent at the block's end; a random key shuffles the block.
            return (t // self.param_ms + 1) * self.param_ms, rng.random()
        return t, 0.0

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


_MALFORMED_KINDS = ("truncated", "missing_field", "bad_timestamp", "not_utf8")


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


def arrange(
    readings: Iterable[Reading],
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
) -> Iterator[Message]:
    """Yield the messages of ``readings`` in arrival order, with heartbeats.

    ``sources`` maps every source id to its kind (``traffic``, ``rfid``, ``positions``),
    which names its heartbeat topic. ``heartbeat_ms`` None turns heartbeats off.
    ``end_ms`` is the run's end (None: endless): readings too close to it to be
    overtaken by a newer one by more than the slack are not made late. ``epoch``, when
    given, is set on every reading: the run's id, which tells its ``seq`` numbers from
    those of another run of the same sources.
    """
    skew: dict[str, int] = {}
    for src in sorted(sources):
        skew[src] = rng.randint(-faults.skew_ms, faults.skew_ms) if faults.skew_ms else 0
        if skew[src]:
            truth.record({"type": "skew", "source": src, "skew_ms": skew[src]})
    late_extra = faults.slack_ms + 2 * model.bound_ms
    last_late = end_ms - late_extra - 1000 if end_ms is not None else None
    p_mal = faults.malformed
    p_late = p_mal + faults.late
    p_dup = p_late + faults.duplicate
    heap: list[tuple[int, float, int, str, str, dict | bytes]] = []
    counter = 0
    hb_ms = heartbeat_ms or 0  # 0: no heartbeats
    next_hb = start_ms + hb_ms if hb_ms else None
    # A late reading is held back until a reading (or a heartbeat) of its stream more
    # than the slack newer has been sent: in a sparse stream its planned arrival alone may
    # not make it late. Per stream kind: the newest ts sent, and the held readings as
    # (the ts to exceed, planned arrival, tie key, counter, event time, topic, payload).
    newest: dict[str, int] = {}
    held: dict[str, list[tuple[int, int, float, int, int, str, dict]]] = {}

    def advance(kind: str, ts: int, now: int) -> None:
        """A reading or heartbeat of ``ts`` is sent at ``now``: release the held readings
        it leaves more than the slack behind."""
        nonlocal counter
        if ts <= newest.get(kind, ts - 1):
            return
        newest[kind] = ts
        queue = held.get(kind)
        while queue and queue[0][0] < newest[kind]:
            _, planned, key, _, t, topic, payload = heapq.heappop(queue)
            arrival = max(planned, now + 1)
            counter += 1
            heapq.heappush(heap, (arrival, key, counter, "reading", topic, payload))
            truth.record(
                {
                    "type": "late",
                    "source": payload["source"],
                    "seq": payload["seq"],
                    "ts": payload["ts"],
                    "delay_ms": arrival - t,
                }
            )

    def heartbeats(h: int) -> Iterator[Message]:
        floor = model.floor(h)
        for src in sorted(sources):
            topic = f"lookout/{sources[src]}/{src}/heartbeat"
            advance(sources[src], floor + skew[src], h)
            yield (
                h,
                "heartbeat",
                topic,
                {"source": src, "ts": format_ts(floor + skew[src], ts_format)},
            )

    def drain(upto: int) -> Iterator[Message]:
        while heap and heap[0][0] <= upto:
            arrival, _, _, kind, topic, payload = heapq.heappop(heap)
            if kind == "reading" and isinstance(payload, dict):
                advance(sources[payload["source"]], parse_ts(payload["ts"]), arrival)
            yield arrival, kind, topic, payload

    last_t = start_ms
    for r in readings:
        # Every later reading arrives at or after r.t, so everything before it is final.
        if next_hb is not None:
            while next_hb < r.t:
                yield from drain(next_hb)
                yield from heartbeats(next_hb)
                next_hb += hb_ms
        yield from drain(r.t - 1)
        last_t = r.t
        payload = dict(r.fields)
        payload["ts"] = format_ts(r.t + skew[r.source], ts_format)
        payload["source"] = r.source
        payload["seq"] = r.seq
        if epoch is not None:
            payload["epoch"] = epoch
        arrival, key = model.arrival(r.t, rng)
        u = rng.random()
        kind = "reading"
        body: dict | bytes = payload
        if u < p_mal:
            how = _MALFORMED_KINDS[int(u / p_mal * len(_MALFORMED_KINDS))]
            body = _malform(payload, how)
            kind = "malformed"
            truth.record({"type": "malformed", "source": r.source, "seq": r.seq, "reason": how})
        elif u < p_late:
            # Too near the end, nothing would overtake it: such a reading goes on time.
            if last_late is None or r.t < last_late:
                planned = r.t + late_extra + rng.randint(1000, 10000)
                counter += 1
                threshold = parse_ts(payload["ts"]) + faults.slack_ms
                late = (threshold, planned, key, counter, r.t, r.topic, payload)
                heapq.heappush(held.setdefault(sources[r.source], []), late)
                continue
        elif u < p_dup:
            again = arrival + rng.randint(0, 1000)
            counter += 1
            heapq.heappush(heap, (again, key, counter, kind, r.topic, payload))
            truth.record({"type": "duplicate", "source": r.source, "seq": r.seq})
        counter += 1
        heapq.heappush(heap, (arrival, key, counter, kind, r.topic, body))
    # End of input: flush the stragglers, keeping heartbeats going while they arrive
    # (a late reading released meanwhile may arrive after the rest: go round again).
    last_arrival = last_t
    while heap:
        last_arrival = max(last_arrival, max(e[0] for e in heap))
        if next_hb is not None:
            while next_hb < last_arrival:
                yield from drain(next_hb)
                yield from heartbeats(next_hb)
                next_hb += hb_ms
        yield from drain(last_arrival)
    # A held reading nothing newer overtook by the slack is not late: it goes last, on
    # time (the readings too near the end are not made late, so this is rare).
    for queue in held.values():
        for *_, topic, payload in sorted(queue, key=lambda e: e[3]):
            yield last_arrival, "reading", topic, payload
    if next_hb is not None:
        # Nothing more will come: promise the run's end (never less than before).
        final = max(last_t, end_ms or 0, model.floor(next_hb - hb_ms))
        for src in sorted(sources):
            topic = f"lookout/{sources[src]}/{src}/heartbeat"
            ts = format_ts(final + skew[src], ts_format)
            yield max(last_t, last_arrival), "heartbeat", topic, {"source": src, "ts": ts}
