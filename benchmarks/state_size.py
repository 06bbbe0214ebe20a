"""What a rules batch pays for state, as the windows fill: per stage of the traffic
library, the bytes of every key's evaluator snapshot and the time to write (pickle) and
read (unpickle) them, every `--every` minutes of event time.

The Spark runtime keeps one snapshot per (stage, key) in the state store and, in every
batch that touches a key, reads it, advances it and writes it back whole (the Python
worker that runs a partition changes between batches, so nothing stays in memory). A
RANGE window's snapshot holds every tuple of its range, so this cost grows with the
window's contents, not with the batch. The script runs the engine core alone (no
Spark): `--rate` readings/s of `--stations` stations, five lanes each, in event-time
order, the garbage collector paused as the runtime pauses it.

    python benchmarks/state_size.py [--rate 5000] [--minutes 15] [--every 5]
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
from rules.language.loader import load_rules

RULES = Path(__file__).resolve().parents[1] / "rules" / "traffic.sql"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=5000, help="readings per second")
    parser.add_argument("--stations", type=int, default=40)
    parser.add_argument("--minutes", type=int, default=15)
    parser.add_argument("--every", type=int, default=5, help="report every N minutes")
    args = parser.parse_args()
    print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}")
    stages = [s for s in load_rules([RULES]).plan.stages() if s.input == "traffic"]
    evaluators: list[dict[tuple, KeyedEvaluator]] = [{} for _ in stages]
    rng = random.Random(1)
    step_ms = 1000 / args.rate
    start = 1_772_431_200_000
    seq: dict[int, int] = defaultdict(int)
    print(f"{args.rate:,} readings/s, {args.stations} stations, rules/traffic.sql")
    print(f"{'minute':>6} {'stage':<16} {'keys':>5} {'snapshot MB':>12} "
          f"{'write s':>8} {'read s':>7}")  # fmt: skip
    gc.disable()
    n = 0
    for minute in range(1, args.minutes + 1):
        rows = []
        while (ts := start + int(n * step_ms)) < start + minute * 60_000:
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
        for stage, by_key in zip(stages, evaluators, strict=True):
            for row in rows:
                key = tuple(row.get(c) for c in stage.key)
                if (ev := by_key.get(key)) is None:
                    ev = by_key[key] = KeyedEvaluator(stage)
                ev.insert(row)
            for ev in by_key.values():
                ev.advance(rows[-1]["ts"])
        gc.collect()
        if minute % args.every:
            continue
        for stage, by_key in zip(stages, evaluators, strict=True):
            t0 = time.perf_counter()
            snapshots = [ev.snapshot() for ev in by_key.values()]
            t1 = time.perf_counter()
            for data in snapshots:
                KeyedEvaluator.restore(stage, data)
            t2 = time.perf_counter()
            size = sum(map(len, snapshots)) / 1e6
            print(f"{minute:>6} {stage.name:<16} {len(by_key):>5} {size:>12.2f} "
                  f"{t1 - t0:>8.2f} {t2 - t1:>7.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
