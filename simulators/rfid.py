"""Warehouse RFID: tag readings after the ESL paper's ``tag_readings`` (examples 17 and 18).

Doors are numbered readers: ``1..doors`` along the goods' path, the last one being the
exit, and reader ``0`` the packing table (only present when packing episodes are
planted). ``door`` is an int in the payload, like ``station``; the source is
``door-<n>`` and the topic ``lookout/rfid/<n>/readings``.

Background traffic: consignments (a pallet with 1-3 cases of 2-6 items) enter at door 1
and visit every door in turn, 20-90 s apart, pushed by an authorised person whose badge
(``tagtype`` ``ap``) is read at the start of each visit and after each case, so every
item has an ``ap`` reading within 3 s: no background reading ever looks like a theft.

Planted episodes, ``count`` of each per period (the run's duration, or
``period_s`` repeating when the run is endless), evenly spaced and interleaved:

- ``packing_group`` (ESL example 17): at the packing table, 2-3 groups of 3-8 items
  read less than ``0.6 x gap_s`` apart, groups more than ``1.5 x gap_s`` apart; one
  truth record per group with its tag ids;
- ``theft`` (ESL example 18): an item read at the exit with no ``ap`` reading at that
  door within ``window_s`` before or after (background visits are moved out of the way);
- ``authorised_exit``: an item read at the exit 0.5-2 s after an ``ap`` badge (a
  negative control: no alert is due);
- ``missing_item``: one item of a consignment is not read at the doors after
  ``last_door`` (it went missing between ``last_door`` and ``expected_door``).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from simulators.rows import Block, Field, Layout, Shape, assign_seq, row_dtype, slice_ms
from simulators.truth import Truth

AP_BADGES = 20
#: An authorised exit's badge is read this long (ms, uniform) before its item.
AP_LEAD_MS = (500, 2000)
KINDS = ("packing_group", "theft", "authorised_exit", "missing_item")


@dataclass
class RfidConfig:
    """The warehouse, its volume and the planted episodes (counts per period)."""

    doors: int = 4
    rate: float = 50.0
    gap_s: float = 2.0
    window_s: float = 5.0
    packing: int = 0
    theft: int = 0
    authorised_exit: int = 0
    missing: int = 0
    period_s: float = 600.0


def rfid_sources(cfg: RfidConfig) -> dict[str, str]:
    """Every source id of the run mapped to its kind (for heartbeat topics)."""
    first = 0 if cfg.packing else 1
    return {f"door-{d}": "rfid" for d in range(first, cfg.doors + 1)}


ITEM, CASE, PALLET, AP = 0, 1, 2, 3
#: Tag ids by kind (the row's ``code``): prefix and digits of the number.
TAGS = (("ITEM-", 6), ("CASE-", 6), ("PAL-", 6), ("AP-", 3))
TAGTYPES = ("item", "case", "pallet", "ap")
RFID_DTYPE = row_dtype(("code", "i1"), ("tag", "i8"))
#: Readings made but not yet due: the fields the generator sets.
_READ_DTYPE = np.dtype([("t", "i8"), ("topic", "i4"), ("code", "i1"), ("tag", "i8")])
#: A trip under way: the start of its next door visit, and what it carries (a pallet,
#: up to 3 cases of ``k`` items numbered on from ``case0`` and ``item0``, the badge of
#: the person pushing it, and the item that goes missing after ``last_door``, or -1).
VISIT_DTYPE = np.dtype(
    [
        ("v", "i8"),
        ("door", "i4"),
        ("pallet", "i8"),
        ("case0", "i8"),
        ("item0", "i8"),
        ("k", "i4", (3,)),
        ("badge", "i4"),
        ("lost", "i8"),
        ("last_door", "i4"),
    ]
)


def rfid_layout(cfg: RfidConfig) -> Layout:
    """The run's topics: one per reader (``lookout/rfid/<n>/readings``, ``door-<n>``)."""
    doors = tuple(range(0 if cfg.packing else 1, cfg.doors + 1))
    shape = Shape(
        (
            Field("tagid", "tag", "tag", TAGS),
            Field("tagtype", "code", table=TAGTYPES),
            Field("door", "topic", table=doors),
        )
    )
    return Layout(
        names=tuple(f"lookout/rfid/{d}/readings" for d in doors),
        sources=tuple(f"door-{d}" for d in doors),
        shape_of=tuple(0 for _ in doors),
        shapes=(shape,),
    )


def episode_schedule(cfg: RfidConfig, start_ms: int, period_ms: int) -> Iterator[tuple[int, str]]:
    """(time, kind) of every planted episode in time order, period after period."""
    counts = dict(
        zip(KINDS, (cfg.packing, cfg.theft, cfg.authorised_exit, cfg.missing), strict=True)
    )
    order = [k for i in range(max(counts.values(), default=0)) for k in KINDS if i < counts[k]]
    if not order:
        return
    p = 0
    while True:
        base = start_ms + p * period_ms
        for j, kind in enumerate(order):
            yield base + round(period_ms * (j + 0.5) / len(order)), kind
        p += 1


class _Buckets:
    """Rows filed by the second of one of their time fields (ms), so that taking those
    before a time touches only the seconds before it."""

    def __init__(self, dtype: np.dtype, field: str, origin: int) -> None:
        self.dtype, self.field, self.origin = dtype, field, origin
        self.store: dict[int, list[np.ndarray]] = {}
        self.low = 0  # every second before this one is taken

    def add(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        key = (rows[self.field] - self.origin) // 1000
        order = np.argsort(key, kind="stable")
        rows, key = rows[order], key[order]
        cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
        for k, part in zip(key[np.r_[0, cuts]].tolist(), np.split(rows, cuts), strict=True):
            self.store.setdefault(k, []).append(part)
        self.low = min(self.low, int(key[0]))

    def take(self, end: int) -> np.ndarray:
        """The rows whose time is before ``end``, in the order they were filed by second."""
        last = (end - self.origin) // 1000
        parts = []
        for k in range(self.low, last):
            parts += self.store.pop(k, [])
        self.low = max(self.low, last)
        edge = self.store.pop(last, [])
        if edge:
            rows = np.concatenate(edge)
            now = rows[self.field] < end
            parts.append(rows[now])
            if not now.all():
                self.store[last] = [rows[~now]]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)


class _Warehouse:
    """The generator's state: tag counters, trips under way, exit-door reservations and
    the readings made but not yet due."""

    def __init__(
        self,
        cfg: RfidConfig,
        rng: random.Random,
        gen: np.random.Generator,
        truth: Truth,
        start_ms: int,
        end_ms: int | None,
    ) -> None:
        self.cfg = cfg
        self.rng = rng
        self.gen = gen
        self.truth = truth
        self.start_ms = start_ms
        self.end_ms = end_ms
        self.first_door = 0 if cfg.packing else 1
        self.items = 0
        self.cases = 0
        self.pallets = 0
        self.reserved: list[tuple[int, int]] = []  # exit-door intervals kept free of ap
        self.missing_at: list[int] = []  # missing items due: the next trip from then on
        self.visits = _Buckets(VISIT_DTYPE, "v", start_ms)
        self.reads = _Buckets(_READ_DTYPE, "t", start_ms)
        self.single: list[tuple[int, int, int, int]] = []  # episodes' (t, door, code, tag)
        # Trips start as a Poisson process; a trip is some 14 readings per door.
        self.trips_per_ms = cfg.rate / (cfg.doors * 14) / 1000

    def new_item(self) -> int:
        self.items += 1
        return self.items

    def badge(self) -> int:
        return self.rng.randrange(AP_BADGES) + 1

    def consignments(self, begin: int, end: int) -> None:
        """The trips starting in [begin, end): a pallet with 1-3 cases of 2-6 items; one
        of them maybe losing an item."""
        gen, doors = self.gen, self.cfg.doors
        n = int(gen.poisson(self.trips_per_ms * (end - begin)))
        trips = np.zeros(n, dtype=VISIT_DTYPE)
        trips["v"] = begin + np.floor(np.sort(gen.random(n)) * (end - begin))
        trips["door"] = 1
        cases = gen.integers(1, 4, n)
        k = gen.integers(2, 7, (n, 3))
        k[np.arange(3) >= cases[:, None]] = 0
        trips["k"] = k
        items = k.sum(axis=1)
        trips["pallet"] = self.pallets + 1 + np.arange(n)
        trips["case0"] = self.cases + 1 + np.cumsum(cases) - cases
        trips["item0"] = self.items + 1 + np.cumsum(items) - items
        self.pallets += n
        self.cases += int(cases.sum())
        self.items += int(items.sum())
        trips["badge"] = gen.integers(1, AP_BADGES + 1, n)
        trips["lost"] = -1
        trips["last_door"] = doors
        taken = -1
        while self.missing_at:
            i = max(int(np.searchsorted(trips["v"], self.missing_at[0])), taken + 1)
            if i >= n:
                break
            self.missing_at.pop(0)
            trips["lost"][i] = trips["item0"][i] + self.rng.randrange(int(items[i]))
            trips["last_door"][i] = self.rng.randint(1, doors - 1)
            taken = i
        self.visits.add(trips)

    def visit(self, end: int) -> None:
        """Every door visit starting before ``end``: its readings, and the trip's next
        visit 20-90 s after it."""
        while len(due := self.visits.take(end)):
            self.visits.add(self._expand(due))

    def _expand(self, vis: np.ndarray) -> np.ndarray:
        """The readings of door visits ``vis``; return the trips' next visits.

        A visit reads the badge, the pallet 100-400 ms later, then each case, its items
        and the badge again, 50-400 ms apart.
        """
        gen, doors = self.gen, self.cfg.doors
        n = len(vis)
        k = vis["k"]
        size = 2 + np.where(k > 0, k + 2, 0).sum(axis=1)
        first = np.cumsum(size) - size
        total = int(size.sum())
        step = gen.integers(50, 401, total)
        step[first] = 0
        step[first + 1] = gen.integers(100, 401, n)
        cum = np.cumsum(step)
        length = cum[first + size - 1] - cum[first]
        v = vis["v"].copy()
        exits = vis["door"] == doors
        if exits.any():
            # Steer clear of the exit-door episodes: no background badge near them.
            for a, b in self.reserved:
                clash = exits & (v <= b) & (v + length >= a)
                if clash.any():
                    v[clash] = b + gen.integers(0, 1001, int(clash.sum()))
        for i in np.flatnonzero(
            (vis["lost"] >= 0) & (vis["door"] == vis["last_door"] + 1)
        ).tolist():
            if self.end_ms is None or v[i] < self.end_ms:
                self.truth.record(
                    {
                        "type": "episode",
                        "kind": "missing_item",
                        "tagid": f"ITEM-{int(vis['lost'][i]):06d}",
                        "last_door": int(vis["last_door"][i]),
                        "expected_door": int(vis["door"][i]),
                        "expected_at": int(v[i]),
                    }
                )
        if (v + length >= self.start_ms).any():  # none is sent from before the start
            owner = np.repeat(np.arange(n), size)
            off = cum - cum[first][owner]
            read = v[owner] + off >= self.start_ms
            self._reads(vis, v, first, owner[read], off[read], np.flatnonzero(read))
        more = vis["door"] < doors
        nxt = vis[more]
        nxt["v"] = (v + length)[more] + gen.integers(20_000, 90_001, int(more.sum()))
        nxt["door"] += 1
        return nxt

    def _reads(
        self,
        vis: np.ndarray,
        v: np.ndarray,
        first: np.ndarray,
        owner: np.ndarray,
        off: np.ndarray,
        index: np.ndarray,
    ) -> None:
        """Add readings of visits ``vis`` (starting at ``v``, their readings from
        ``first`` on) to those not yet due: those at ``index`` (of visit ``owner``, at
        ``off`` from its start)."""
        k = vis["k"][owner]
        pos = index - first[owner]
        # Case j of a visit takes positions q_j.. : the case, its k_j items, the badge.
        q1 = k[:, 0] + 4
        q2 = q1 + k[:, 1] + 2
        j = (pos >= q1).astype(np.int64) + (pos >= q2)
        local = pos - np.where(j == 0, 2, np.where(j == 1, q1, q2))
        kj = np.take_along_axis(k, j[:, None], axis=1)[:, 0]
        before = np.where(j == 0, 0, np.where(j == 1, k[:, 0], k[:, 0] + k[:, 1]))
        code = np.where(local == 0, CASE, np.where(local == kj + 1, AP, ITEM))
        code[pos == 0] = AP
        code[pos == 1] = PALLET
        tag = vis["item0"][owner] + before + local - 1
        tag = np.where(code == CASE, vis["case0"][owner] + j, tag)
        tag = np.where(code == PALLET, vis["pallet"][owner], tag)
        tag = np.where(code == AP, vis["badge"][owner], tag)
        door = vis["door"][owner]
        t = v[owner] + off
        # The missing item is not read after its last door.
        keep = ~((code == ITEM) & (tag == vis["lost"][owner]) & (door > vis["last_door"][owner]))
        rows = np.empty(int(keep.sum()), dtype=_READ_DTYPE)
        rows["t"] = t[keep]
        rows["topic"] = door[keep] - self.first_door
        rows["code"] = code[keep]
        rows["tag"] = tag[keep]
        self.reads.add(rows)

    def episode(self, t: int, kind: str) -> None:
        """Plant one episode at time ``t`` (its readings go to those not yet due)."""
        rng, cfg = self.rng, self.cfg
        exit_door = cfg.doors
        gap_ms = round(cfg.gap_s * 1000)
        if kind == "packing_group":
            for _ in range(rng.randint(2, 3)):
                tags = [self.new_item() for _ in range(rng.randint(3, 8))]
                first = t
                for i, tag in enumerate(tags):
                    if i:
                        t += rng.randint(200, max(201, int(gap_ms * 0.6)))
                    self.single.append((t, 0, ITEM, tag))
                self.truth.record(
                    {
                        "type": "episode",
                        "kind": kind,
                        "door": 0,
                        "tagids": [f"ITEM-{tag:06d}" for tag in tags],
                        "start": first,
                        "end": t,
                    }
                )
                t += rng.randint(int(gap_ms * 1.5), gap_ms * 3)
        elif kind in ("theft", "authorised_exit"):
            item = self.new_item()
            rec = {
                "type": "episode",
                "kind": kind,
                "door": exit_door,
                "tagid": f"ITEM-{item:06d}",
                "ts": t,
            }
            if kind == "authorised_exit":
                ap = self.badge()
                self.single.append((t - rng.randint(*AP_LEAD_MS), exit_door, AP, ap))
                rec["ap"] = f"AP-{ap:03d}"
            self.single.append((t, exit_door, ITEM, item))
            self.truth.record(rec)
        else:
            self.missing_at.append(t)  # the next consignment loses an item

    def reserve(self, t: int, kind: str) -> None:
        """Keep background badges away from an exit-door episode at ``t``."""
        if kind in ("theft", "authorised_exit"):
            w = round(self.cfg.window_s * 1000)
            self.reserved.append((t - w - 3000, t + w + 3000))

    def take(self, begin: int, end: int) -> np.ndarray:
        """The readings of event time before ``end`` (none before the start), in
        event-time order; forget the reservations that ended before ``begin``."""
        self.reserved = [(a, b) for a, b in self.reserved if b >= begin]
        if self.single:
            rows = np.array(self.single, dtype=_READ_DTYPE)
            rows["topic"] -= self.first_door
            self.single = []
            self.reads.add(rows[rows["t"] >= self.start_ms])
        due = self.reads.take(end)
        due = due[np.argsort(due["t"], kind="stable")]
        out = np.zeros(len(due), dtype=RFID_DTYPE)
        for name in _READ_DTYPE.names or ():
            out[name] = due[name]
        return out


def generate_rfid(
    cfg: RfidConfig, start_ms: int, end_ms: int | None, rng: random.Random, truth: Truth
) -> Iterator[Block]:
    """Yield every reading of the run in event-time order, in blocks of
    :func:`simulators.rows.slice_ms`; record the planted episodes.

    ``end_ms`` None runs forever; readings at or after ``end_ms`` are cut off.
    """
    if cfg.doors < 2:
        raise ValueError("rfid: at least 2 doors (the last one is the exit)")
    period_ms = round(cfg.period_s * 1000) if end_ms is None else end_ms - start_ms
    schedule = episode_schedule(cfg, start_ms, period_ms)
    layout = rfid_layout(cfg)
    wh = _Warehouse(cfg, rng, np.random.default_rng(rng.getrandbits(128)), truth, start_ms, end_ms)
    seqs = np.zeros(len(layout.names), dtype=np.int64)
    # The warehouse is already busy at the start: trips begun up to one full trip
    # earlier are under way (their readings before the start are not sent).
    begin = start_ms - cfg.doors * 100_000
    while begin < start_ms:
        end = min(begin + 20_000, start_ms)
        wh.consignments(begin, end)
        wh.visit(end)
        begin = end
    # Exit-door episodes are reserved a horizon ahead of the trips' visits; an episode
    # is planted in the slice its first reading (an authorised exit's badge, up to
    # AP_LEAD_MS before it) may fall in.
    horizon = cfg.doors * 120_000
    upcoming: deque[tuple[int, str]] = deque()
    following = next(schedule, None)
    step = slice_ms(cfg.rate)
    while end_ms is None or begin < end_ms:
        end = begin + step if end_ms is None else min(begin + step, end_ms)
        while following is not None and following[0] <= end + horizon:
            upcoming.append(following)
            wh.reserve(*following)
            following = next(schedule, None)
        while upcoming and upcoming[0][0] - AP_LEAD_MS[1] < end:
            wh.episode(*upcoming.popleft())
        wh.consignments(begin, end)
        wh.visit(end)
        rows = wh.take(begin, end)
        rows["seq"] = assign_seq(rows["topic"], seqs)
        yield Block(rows, end, layout)
        begin = end
