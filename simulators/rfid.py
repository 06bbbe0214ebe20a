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

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass

from simulators.common import Reading, SeqCounter
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


def _reading(t: int, tagid: str, tagtype: str, door: int) -> Reading:
    return Reading(
        t,
        f"door-{door}",
        f"lookout/rfid/{door}/readings",
        {"tagid": tagid, "tagtype": tagtype, "door": door},
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


class _Warehouse:
    """The generator's state: tag counters, exit-door reservations, the pending heap."""

    def __init__(
        self, cfg: RfidConfig, rng: random.Random, truth: Truth, end_ms: int | None
    ) -> None:
        self.cfg = cfg
        self.end_ms = end_ms
        self.rng = rng
        self.truth = truth
        self.heap: list[tuple[int, int, Reading]] = []
        self.n = 0
        self.items = 0
        self.cases = 0
        self.pallets = 0
        self.reserved: list[tuple[int, int]] = []  # exit-door intervals kept free of ap
        self.missing_due = 0

    def push(self, r: Reading) -> None:
        self.n += 1
        heapq.heappush(self.heap, (r.t, self.n, r))

    def new_tag(self, kind: str) -> str:
        if kind == "item":
            self.items += 1
            return f"ITEM-{self.items:06d}"
        if kind == "case":
            self.cases += 1
            return f"CASE-{self.cases:06d}"
        self.pallets += 1
        return f"PAL-{self.pallets:06d}"

    def badge(self) -> str:
        return f"AP-{self.rng.randrange(AP_BADGES) + 1:03d}"

    def consignment(self, t0: int) -> None:
        """A pallet's trip through every door; maybe with an item going missing."""
        rng = self.rng
        pallet = self.new_tag("pallet")
        cases = [
            (self.new_tag("case"), [self.new_tag("item") for _ in range(rng.randint(2, 6))])
            for _ in range(rng.randint(1, 3))
        ]
        lost, last_door = None, self.cfg.doors  # nothing lost: read at every door
        if self.missing_due:
            self.missing_due -= 1
            lost = rng.choice([i for _, items in cases for i in items])
            last_door = rng.randint(1, self.cfg.doors - 1)
        ap = self.badge()
        v = t0
        for door in range(1, self.cfg.doors + 1):
            # Offsets of the visit's reads: badge, pallet, then each case, its items, badge.
            plan = [(0, ap, "ap"), (rng.randint(100, 400), pallet, "pallet")]
            off = plan[-1][0]
            for case, items in cases:
                off += rng.randint(50, 400)
                plan.append((off, case, "case"))
                for item in items:
                    off += rng.randint(50, 400)
                    if item != lost or door <= last_door:
                        plan.append((off, item, "item"))
                off += rng.randint(50, 400)
                plan.append((off, ap, "ap"))
            if door == self.cfg.doors:
                self.reserved = [(a, b) for a, b in self.reserved if b >= t0]
                for a, b in self.reserved:
                    if v <= b and v + off >= a:
                        v = b + rng.randint(0, 1000)
            if (
                lost is not None
                and door == last_door + 1
                and (self.end_ms is None or v < self.end_ms)
            ):
                self.truth.record(
                    {
                        "type": "episode",
                        "kind": "missing_item",
                        "tagid": lost,
                        "last_door": last_door,
                        "expected_door": door,
                        "expected_at": v,
                    }
                )
            for o, tag, tagtype in plan:
                self.push(_reading(v + o, tag, tagtype, door))
            v += off + rng.randint(20_000, 90_000)

    def episode(self, t: int, kind: str) -> None:
        """Plant one episode at time ``t`` (its readings go to the pending heap)."""
        rng, cfg = self.rng, self.cfg
        exit_door = cfg.doors
        gap_ms = round(cfg.gap_s * 1000)
        if kind == "packing_group":
            for _ in range(rng.randint(2, 3)):
                tags = [self.new_tag("item") for _ in range(rng.randint(3, 8))]
                first = t
                for i, tag in enumerate(tags):
                    if i:
                        t += rng.randint(200, max(201, int(gap_ms * 0.6)))
                    self.push(_reading(t, tag, "item", 0))
                self.truth.record(
                    {
                        "type": "episode",
                        "kind": kind,
                        "door": 0,
                        "tagids": tags,
                        "start": first,
                        "end": t,
                    }
                )
                t += rng.randint(int(gap_ms * 1.5), gap_ms * 3)
        elif kind in ("theft", "authorised_exit"):
            item = self.new_tag("item")
            rec = {"type": "episode", "kind": kind, "door": exit_door, "tagid": item, "ts": t}
            if kind == "authorised_exit":
                ap = self.badge()
                self.push(_reading(t - rng.randint(*AP_LEAD_MS), ap, "ap", exit_door))
                rec["ap"] = ap
            self.push(_reading(t, item, "item", exit_door))
            self.truth.record(rec)
        else:
            self.missing_due += 1  # the next consignment loses an item

    def reserve(self, t: int, kind: str) -> None:
        """Keep background badges away from an exit-door episode at ``t``."""
        if kind in ("theft", "authorised_exit"):
            w = round(self.cfg.window_s * 1000)
            self.reserved.append((t - w - 3000, t + w + 3000))


def generate_rfid(
    cfg: RfidConfig, start_ms: int, end_ms: int | None, rng: random.Random, truth: Truth
) -> Iterator[Reading]:
    """Yield every reading of the run in event-time order; record the planted episodes.

    ``end_ms`` None runs forever; readings at or after ``end_ms`` are cut off.
    """
    if cfg.doors < 2:
        raise ValueError("rfid: at least 2 doors (the last one is the exit)")
    period_ms = round(cfg.period_s * 1000) if end_ms is None else end_ms - start_ms
    schedule = episode_schedule(cfg, start_ms, period_ms)
    wh = _Warehouse(cfg, rng, truth, end_ms)
    per_consignment = cfg.doors * 14  # 2 + 2 cases x (1 case + 4 items + 1 badge) per door
    mean_gap_ms = 1000.0 * per_consignment / cfg.rate
    seqs = SeqCounter()
    # Exit-door episodes are reserved a horizon ahead, so that background trips planned
    # now (up to doors x ~100 s long) steer clear of them.
    horizon = cfg.doors * 120_000
    upcoming: list[tuple[int, str]] = []
    for ep in schedule:
        upcoming.append(ep)
        wh.reserve(*ep)
        if ep[0] > start_ms + horizon:
            break
    # The warehouse is already busy at the start: trips begun up to one full trip
    # earlier are under way (their readings before the start are not sent).
    next_c = float(start_ms - cfg.doors * 100_000) + rng.expovariate(1.0) * mean_gap_ms
    while True:
        while upcoming and upcoming[-1][0] <= next_c + horizon:
            following = next(schedule, None)
            if following is None:
                break
            upcoming.append(following)
            wh.reserve(*following)
        if upcoming and upcoming[0][0] <= next_c:
            wh.episode(*upcoming.pop(0))
        else:
            wh.consignment(int(next_c))
            next_c += rng.expovariate(1.0) * mean_gap_ms
        # Everything created later starts no earlier than this: the next consignment, or
        # the next episode less its lead (an authorised exit's badge read comes before it).
        frontier = int(next_c)
        if upcoming:
            frontier = min(frontier, upcoming[0][0] - AP_LEAD_MS[1])
        if end_ms is not None:
            frontier = min(frontier, end_ms)
        while wh.heap and wh.heap[0][0] < frontier:
            r = heapq.heappop(wh.heap)[2]
            if r.t >= start_ms:
                r.seq = seqs.next(r.source)
                yield r
        if end_ms is not None and frontier >= end_ms:
            return
