"""Live keys, memory and batch time while a flood of distinct RFID tag ids goes through
the RFID rules, with idle keys evicted (no Spark: the engine core's pipeline).

`--tags` distinct tag ids (1,000,000 by default) arrive evenly over `--feed-minutes` of
event time (30): each is read at the receiving door, at an aisle door 10 s to 2 min
later, and (97 %) at the shipping door 1 to 10 min after that; an authorised person
passes the shipping door every 2 s. The readings go through `rules/rfid.sql` in event
time order, in one-second batches, and the run goes on to `--minutes` (65) with the
person's readings only, so the last tags' windows close. `missed_shipping` keeps each
tag for 30 minutes after its last reading (its RANGE 30 MINUTES), so its keys are
evicted from minute 30 on.

Like the engine, the pipeline keeps the state batches touched lately in memory and
saves what changed after every batch, through a `JournaledStore`; the store beneath is
an SQLite file, read through a memory map (Spark's RocksDB is off the Python worker's
heap too). Every
`--every` minutes it prints: the tags seen so far, the readings per second, the keys
the rules hold (all rules, and `missed_shipping`), the residues evicted keys left
(their output counts), the readings quarantined by the cap (`[engine] max_live_keys`,
`--cap`; 0: none), the process's heap (its anonymous resident memory: the mapped store
file left out) and the SQLite file's size, the batch time (process and save: what the
engine's evaluate phase holds) over the last interval: mean, 99th percentile and
longest, the store's commit (the journal entry, and the fold of the journal's oldest
entry into the SQLite file; Spark's state store is another store, so this is apart)
mean and longest, and what one full pass of the cyclic garbage collector over the heap
takes then. PySpark runs such a pass after every task, over what the worker made since
its first; here the collector is paused during a batch (as in the engine) and what a
batch leaves is frozen, so the pass is timed once per report instead.

    python benchmarks/key_eviction.py [--tags 1000000] [--feed-minutes 30] \\
        [--minutes 65] [--every 5] [--cap 500000] [--no-evict]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import os
import platform
import random
import sqlite3
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from engine.core.pipeline import Pipeline
from engine.core.replay import arrival_table
from engine.core.state import JournaledStore, StateKey
from lookout.config import EngineConfig
from rules.language.loader import load_rules

RULES = Path(__file__).resolve().parents[1] / "rules" / "rfid.sql"
START = 1_772_431_200_000  # 2026-03-02 06:00 UTC
CACHE_MB = 16
"""SQLite's own page cache (in the heap); the file is read through a memory map."""
MMAP_GB = 16


class SqliteStore:
    """A `StateStore` in an SQLite file: the state off the Python heap, as Spark's is."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode = OFF")
        self.db.execute("PRAGMA synchronous = OFF")
        self.db.execute(f"PRAGMA cache_size = -{CACHE_MB * 1024}")
        self.db.execute(f"PRAGMA mmap_size = {MMAP_GB << 30}")
        self.db.execute(
            "CREATE TABLE state (kind TEXT, name TEXT, key TEXT, number INTEGER, value BLOB, "
            "PRIMARY KEY (kind, name, key, number)) WITHOUT ROWID"
        )

        self.writes: dict[StateKey, bytes | None] = {}  # until `flush`

    def flush(self) -> None:
        """Apply the writes so far, two statements in all."""
        puts = [(*k, v) for k, v in self.writes.items() if v is not None]
        gone = [k for k, v in self.writes.items() if v is None]
        self.db.execute("BEGIN")
        self.db.executemany("INSERT OR REPLACE INTO state VALUES (?, ?, ?, ?, ?)", puts)
        self.db.executemany(
            "DELETE FROM state WHERE kind = ? AND name = ? AND key = ? AND number = ?", gone
        )
        self.db.execute("COMMIT")
        self.writes.clear()

    def get(self, key: StateKey) -> bytes | None:
        if key in self.writes:
            return self.writes[key]
        found = self.db.execute(
            "SELECT value FROM state WHERE kind = ? AND name = ? AND key = ? AND number = ?", key
        ).fetchone()
        return None if found is None else bytes(found[0])

    def get_many(self, keys: Sequence[StateKey]) -> list[bytes | None]:
        return [self.get(key) for key in keys]

    def put(self, key: StateKey, value: bytes) -> None:
        self.writes[key] = value

    def delete(self, key: StateKey) -> None:
        self.writes[key] = None

    def write(self, changes: Sequence[tuple[StateKey, bytes | None]]) -> None:
        self.writes.update(changes)

    def scan(self, kind: str) -> Iterator[tuple[StateKey, bytes]]:
        rows = self.db.execute(
            "SELECT kind, name, key, number, value FROM state WHERE kind = ?", (kind,)
        )
        for k, name, text, number, value in rows.fetchall():
            yield (k, name, text, number), bytes(value)

    def keys(self, kind: str) -> Iterator[StateKey]:
        rows = self.db.execute("SELECT kind, name, key, number FROM state WHERE kind = ?", (kind,))
        yield from rows.fetchall()


def heap_mb() -> float:
    """This process's anonymous resident memory in MB: its heap, the SQLite file's
    mapped pages left out (the state store is not the worker's memory)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tags", type=int, default=1_000_000)
    parser.add_argument("--feed-minutes", type=float, default=30)
    parser.add_argument("--minutes", type=int, default=65)
    parser.add_argument("--every", type=int, default=5, help="report every N minutes")
    parser.add_argument(
        "--cap", type=int, default=EngineConfig().max_live_keys, help="max_live_keys (0: none)"
    )
    parser.add_argument("--no-evict", action="store_true", help="keep every key")
    args = parser.parse_args()
    print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}")
    plan = load_rules([RULES]).plan
    schema = plan.streams["tag_readings"]
    folder = Path(tempfile.mkdtemp(prefix="key-eviction-"))
    inner = SqliteStore(folder / "state.db")
    journal = JournaledStore(inner)
    caps = {"tag_readings": args.cap} if args.cap else None
    pipeline = Pipeline(plan, store=journal, evict=not args.no_evict, caps=caps)
    rng = random.Random(1)
    feed_ms = int(args.feed_minutes * 60_000)
    every_ms = feed_ms / args.tags  # one new tag this often
    due: list[tuple[int, int, str, str, str]] = []  # (ts, order, tagid, tagtype, door)
    order = 0  # ties in `due` in the order the readings were made
    # Each reader numbers what it sends, counting up (one range of seen ids per reader).
    sent: dict[str, int] = {}
    tags = 0
    print(f"{args.tags:,} tags over {args.feed_minutes:g} min, rules/rfid.sql, 1 s batches, "
          f"evict {'off' if args.no_evict else 'on'}, cap {args.cap or 'none'}")  # fmt: skip
    print(f"{'minute':>6} {'tags':>9} {'readings/s':>10} {'live keys':>10} "
          f"{'of missed_shipping':>18} {'residues':>9} {'capped':>7} {'heap MB':>7} "
          f"{'store MB':>8} {'batch ms mean':>13} {'p99':>6} {'max':>6} {'commit ms':>9} "
          f"{'max':>9} "
          f"{'full gc ms':>10}")  # fmt: skip
    gc.disable()
    gc.collect()
    gc.freeze()  # what a worker holds before its first task (engine.python_gc)
    times: list[float] = []
    commits: list[float] = []
    readings = capped = 0
    minute_readings = 0
    for second in range(args.minutes * 60):
        end = START + (second + 1) * 1000
        while tags < args.tags and START + int(tags * every_ms) < end:
            t0 = START + int(tags * every_ms)
            tag = f"tag-{tags:07d}"
            heapq.heappush(due, (t0, order, tag, "item", "1"))
            aisle = t0 + rng.randint(10_000, 120_000)
            heapq.heappush(due, (aisle, order + 1, tag, "item", str(rng.choice((2, 3)))))
            if rng.random() < 0.97:
                ship = aisle + rng.randint(60_000, 600_000)
                heapq.heappush(due, (ship, order + 2, tag, "item", "4"))
            order += 3
            tags += 1
        if second % 2 == 0:
            heapq.heappush(due, (end - 500, order, "badge-1", "ap", "4"))
            order += 1
        rows = []
        while due and due[0][0] < end:
            ts, _, tag, kind, door = heapq.heappop(due)
            number = sent.get(door, 0)
            sent[door] = number + 1
            rows.append(
                {
                    "tagid": tag,
                    "tagtype": kind,
                    "door": door,
                    "ts": ts,
                    "source": f"reader-{door}",
                    "seq": number,
                }
            )
        started = time.perf_counter()
        result = pipeline.process({"tag_readings": arrival_table(schema, rows)})
        pipeline.save()
        saved = time.perf_counter()
        journal.commit()
        inner.flush()
        times.append(saved - started)
        commits.append(time.perf_counter() - saved)
        gc.collect(0)  # the young objects (a batch leaves no cycles)
        gc.freeze()
        readings += len(rows)
        minute_readings += len(rows)
        capped += len(result.capped)
        if (second + 1) % (args.every * 60):
            continue
        gc.unfreeze()  # a full pass over everything, timed: PySpark's after each task
        collecting = time.perf_counter()
        gc.collect()
        collected = time.perf_counter() - collecting
        gc.freeze()
        live = pipeline.live_keys()
        residues = sum(len(getattr(r, "rests", ())) for r in pipeline.runners.values())
        ms = np.array(times) * 1000
        print(f"{(second + 1) // 60:>6} {tags:>9,} {minute_readings / (args.every * 60):>10,.0f} "
              f"{sum(live.values()):>10,} {live['missed_shipping']:>18,} {residues:>9,} "
              f"{capped:>7,} {heap_mb():>7,.0f} "
              f"{(folder / 'state.db').stat().st_size / 2**20:>8,.0f} {ms.mean():>13.1f} "
              f"{np.percentile(ms, 99):>6.0f} {ms.max():>6.0f} {np.mean(commits) * 1000:>9.1f} "
              f"{max(commits) * 1000:>9.0f} "
              f"{collected * 1000:>10.0f}", flush=True)  # fmt: skip
        times, commits = [], []
        minute_readings = 0


if __name__ == "__main__":
    main()
