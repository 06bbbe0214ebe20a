"""What the per-row runner's state costs as the windows fill: per stage of the traffic
library, what the store holds and what each batch reads and writes of it.

A `KeyedEvaluator` saves what changed since its last save: a RANGE window holds every
tuple of its range, kept in chunks, so a batch reads and writes the window's ends only
(`engine.core.chunks`). This script runs the engine core alone (no Spark), every
(stage, key) evaluator loaded, advanced and saved in each batch, with a dict as the
store (the live engine keeps its pipeline in memory between batches and reads the store
only to rebuild it): `--rate` readings/s of `--stations` stations, five lanes each, in
event-time order, in batches of `--batch` seconds, the garbage collector paused as the
runtime pauses it. Every `--every` minutes it prints per stage: the bytes stored, the
bytes a batch read and wrote and its load + save time (averaged over the last minute's
batches), and, for comparison, what writing and reading every key's whole snapshot
takes.

    python benchmarks/state_size.py [--rate 5000] [--minutes 15] [--every 5] [--batch 1]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import time
from collections import defaultdict
from pathlib import Path

from engine.core.evaluator import KeyedEvaluator
from engine.core.plan import Stage
from rules.language.loader import load_rules

RULES = Path(__file__).resolve().parents[1] / "rules" / "traffic.sql"


class Store:
    """One stage's state store: per key a head and a map of chunks, with byte counts."""

    def __init__(self) -> None:
        self.heads: dict[tuple, bytes] = {}
        self.chunks: dict[tuple, bytes] = {}
        self.read = self.written = 0
        self.seconds = 0.0

    def load(self, stage: Stage, key: tuple) -> KeyedEvaluator:
        head = self.heads.get(key)
        if head is None:
            return KeyedEvaluator(stage)
        self.read += len(head)

        def chunk(number: int) -> bytes:
            data = self.chunks[(*key, number)]
            self.read += len(data)
            return data

        return KeyedEvaluator.load(stage, head, chunk)

    def save(self, key: tuple, evaluator: KeyedEvaluator) -> None:
        saved = evaluator.save()
        self.heads[key] = saved.head
        self.written += len(saved.head) + sum(map(len, saved.writes.values()))
        for number in saved.deletes:
            del self.chunks[(*key, number)]
        for number, data in saved.writes.items():
            self.chunks[(*key, number)] = data

    def size(self) -> int:
        return sum(map(len, self.heads.values())) + sum(map(len, self.chunks.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=5000, help="readings per second")
    parser.add_argument("--stations", type=int, default=40)
    parser.add_argument("--minutes", type=int, default=15)
    parser.add_argument("--every", type=int, default=5, help="report every N minutes")
    parser.add_argument("--batch", type=float, default=1.0, help="seconds of readings per batch")
    args = parser.parse_args()
    print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}")
    stages = [s for s in load_rules([RULES]).plan.stages() if s.input == "traffic"]
    stores = [Store() for _ in stages]
    rng = random.Random(1)
    step_ms = 1000 / args.rate
    batch_ms = int(args.batch * 1000)
    start = 1_772_431_200_000
    seq: dict[int, int] = defaultdict(int)
    print(f"{args.rate:,} readings/s, {args.stations} stations, {args.batch} s batches, "
          f"rules/traffic.sql; per batch: averages over the last minute")  # fmt: skip
    print(f"{'minute':>6} {'stage':<16} {'keys':>5} {'stored MB':>10} {'read KB':>8} "
          f"{'wrote KB':>9} {'load+save ms':>13} {'whole: MB':>10} {'write s':>8} "
          f"{'read s':>7}")  # fmt: skip
    gc.disable()
    n = 0
    end = start
    for minute in range(1, args.minutes + 1):
        batches = 0
        for store in stores:
            store.read = store.written = 0
            store.seconds = 0.0
        while end < start + minute * 60_000:
            end += batch_ms
            rows = []
            while (ts := start + int(n * step_ms)) < end:
                station = rng.randrange(args.stations) + 1
                rows.append(
                    {
                        "station": station,
                        "lane": rng.randrange(5) + 1,
                        "speed": rng.uniform(5, 40),
                        "length": rng.uniform(3, 18),
                        "ts": ts,
                        "source": f"station-{station}",
                        "seq": seq[station],
                    }
                )
                seq[station] += 1
                n += 1
            batches += 1
            for stage, store in zip(stages, stores, strict=True):
                by_key: dict[tuple, list[dict]] = defaultdict(list)
                for row in rows:
                    by_key[tuple(row.get(c) for c in stage.key)].append(row)
                for key, key_rows in by_key.items():
                    t0 = time.perf_counter()
                    ev = store.load(stage, key)
                    t1 = time.perf_counter()
                    ev.insert_many(key_rows)
                    ev.advance(end - 2_000)  # the stream's 2 s slack
                    t2 = time.perf_counter()
                    store.save(key, ev)
                    store.seconds += t1 - t0 + time.perf_counter() - t2
        gc.collect()
        if minute % args.every:
            continue
        for stage, store in zip(stages, stores, strict=True):
            per_batch = (store.read / batches, store.written / batches, store.seconds / batches)
            evaluators = [store.load(stage, key) for key in store.heads]
            t0 = time.perf_counter()
            snapshots = [ev.snapshot() for ev in evaluators]
            t1 = time.perf_counter()
            for data in snapshots:
                KeyedEvaluator.restore(stage, data)
            t2 = time.perf_counter()
            whole = sum(map(len, snapshots)) / 1e6
            print(f"{minute:>6} {stage.name:<16} {len(store.heads):>5} "
                  f"{store.size() / 1e6:>10.2f} {per_batch[0] / 1e3:>8.1f} "
                  f"{per_batch[1] / 1e3:>9.1f} "
                  f"{per_batch[2] * 1e3:>13.1f} {whole:>10.2f} {t1 - t0:>8.2f} "
                  f"{t2 - t1:>7.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
