"""What a batch of the traffic rules costs as their windows fill (the engine core's
pipeline, no Spark): the longest window, `station_speed`'s 15 minutes, fills for
the first 15 minutes of any run, and a cost that grows with it shows up only then.

`--rate` readings/s of `--stations` stations (lanes, speeds and lengths at random), in
event-time order, in batches of one second, through `rules/traffic.sql`, with a
`JournaledStore` over a dict as the state store. Every `--every` minutes of event time
it prints the mean process and save time of the batches of that last minute, and,
per stage, the save time.

    python benchmarks/window_fill.py [--rate 2000] [--stations 40] [--minutes 16] [--every 2]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from engine.core.pipeline import Pipeline
from engine.core.replay import arrival_table
from engine.core.state import JournaledStore, MemoryStore
from rules.language.loader import load_rules

RULES = Path(__file__).resolve().parents[1] / "rules" / "traffic.sql"
START = 1_772_431_200_000  # 2026-03-02 06:00 UTC


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--stations", type=int, default=40)
    parser.add_argument("--minutes", type=int, default=16)
    parser.add_argument("--every", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {platform.node()}, {os.cpu_count()} cores; {args.rate} readings/s, "
          f"{args.stations} stations")  # fmt: skip
    plan = load_rules([RULES]).plan
    schema = plan.streams["traffic"]
    store = JournaledStore.open(MemoryStore())
    pipeline = Pipeline(plan, ["traffic"], store)
    saves: dict[str, float] = defaultdict(float)
    for i, stage in pipeline.stages:
        runner = pipeline.runners[i]
        runner.save = timed(runner.save, saves, stage.name)  # type: ignore[method-assign]
    rng = np.random.default_rng(1)
    minute: list[tuple[float, float]] = []
    seq = np.zeros(args.stations + 1, dtype=np.int64)
    gc.collect()
    gc.freeze()
    print(f"{'minute':>6} {'process ms':>10} {'save ms':>8}  save ms per stage")
    for second in range(args.minutes * 60):
        n = args.rate
        ts = START + second * 1000 + np.sort(rng.integers(0, 1000, n))
        stations = rng.integers(1, args.stations + 1, n)
        lanes = rng.integers(1, 6, n)
        speeds = rng.uniform(0, 40, n)
        lengths = rng.choice([4.0, 12.0], n, p=[0.9, 0.1])
        # Each station's gateway numbers its own readings, as real sources do.
        rows = []
        for s, la, v, le, t in zip(stations, lanes, speeds, lengths, ts, strict=True):
            seq[s] += 1
            rows.append({"station": int(s), "lane": int(la), "speed": float(v),
                         "length": float(le), "ts": int(t), "source": f"gw{s}",
                         "seq": int(seq[s])})  # fmt: skip
        table = arrival_table(schema, rows)
        t0 = time.perf_counter()
        pipeline.process({"traffic": table})
        t1 = time.perf_counter()
        pipeline.save()
        store.commit()
        t2 = time.perf_counter()
        gc.collect(0)
        gc.freeze()
        minute.append((t1 - t0, t2 - t1))
        if (second + 1) % 60:
            continue
        if (second + 1) // 60 % args.every == 0:
            process, save = (np.mean(x) * 1000 for x in zip(*minute, strict=True))
            stages = ", ".join(f"{k} {v / 60 * 1000:.1f}" for k, v in sorted(saves.items()) if v)
            print(f"{(second + 1) // 60:>6} {process:>10.1f} {save:>8.1f}  {stages}", flush=True)
        minute.clear()
        saves.clear()


def timed(save, totals: dict[str, float], name: str):  # type: ignore[no-untyped-def]
    """``save``, adding the seconds each call takes to ``totals[name]``."""

    def run(store):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        save(store)
        totals[name] += time.perf_counter() - started

    return run


if __name__ == "__main__":
    main()
