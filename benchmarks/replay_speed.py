"""`lookout replay` readings per second, per input form, against an earlier commit.

Generates a traffic recording with the simulator (`--rate` readings/s of event time for
`--duration` seconds over `--stations` stations, 1 s of disorder, 1 % late readings
and 1 % redeliveries: 1.2 million readings by default), copies it to a Parquet file
(stored order, timestamps as TIMESTAMP) and a Delta table (the same rows with an
`arrival` column), and runs `lookout replay --rules rules/traffic.sql` on each form
(JSON-lines outputs) with each of `--workers` (by default in one process, and split
among one worker process per core), then the same JSON lines through `--baseline` (a
commit, `git archive`d into the work folder: the replay of that commit's code). Each
run is a fresh process timed from start to exit; readings/s is the recording's
readings over that time, the best of `--repeat` runs, beside the CPU the process and
its workers used per reading (user + system; the steadier figure on a shared machine,
also the best of the runs).

`--compare REV` also replays every form with the code of commit `REV` (another
checkout's speed on the same recording, in the same run).

Every form's outputs are then compared with the JSON lines' (and the baseline's): the
same files, rows, keys and timestamps, floats equal to 1e-9 relative; byte-identical
files are said so.

    python benchmarks/replay_speed.py [--rate 20000] [--duration 60] [--stations 40]
        [--repeat 1] [--workers 1 2] [--baseline a4628d3] [--compare REV] [--work DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq
from deltalake import write_deltalake

from engine.core.plan import ColumnType
from engine.core.schema import arrival_type
from rules.language.loader import RULES_DIR, load_rules

ROOT = Path(__file__).resolve().parent.parent
RULES = RULES_DIR / "traffic.sql"
BASELINE = "a4628d3"
"""The last commit whose replay read JSON lines row by row (10,000-reading batches)."""


def simulate(out: Path, rate: int, duration: int, stations: int) -> int:
    """The recording (seeded: the same bytes every time); its number of readings."""
    subprocess.run(
        [sys.executable, "-m", "lookout.cli", "simulate", "traffic", "--rate", str(rate),
         "--duration", str(duration), "--stations", str(stations), "--out", str(out),
         "--epoch", "bench", "--disorder", "bounded:1", "--late-fraction", "0.01",
         "--duplicate-fraction", "0.01", "--quiet"],
        check=True, cwd=ROOT, env=_env(ROOT),
    )  # fmt: skip
    with open(out, "rb") as handle:
        return sum(1 for _ in handle)


def copies(recording: Path, work: Path) -> tuple[Path, Path]:
    """The recording as a Parquet file (stored order) and a Delta table (`arrival`)."""
    schema = load_rules([RULES]).plan.streams["traffic"]
    fields = [pa.field(c.name, arrival_type(c.type)) for c in schema.columns]
    fields += [pa.field("source", pa.string()), pa.field("epoch", pa.string())]
    fields.append(pa.field("seq", pa.int64()))
    table = pj.read_json(
        recording, parse_options=pj.ParseOptions(explicit_schema=pa.schema(fields))
    )
    for c in schema.columns:
        if c.type == ColumnType.TIMESTAMP:
            i = table.column_names.index(c.name)
            micros = pc.multiply(table.column(i), 1000)
            table = table.set_column(i, c.name, micros.cast(pa.timestamp("us", tz="UTC")))
    parquet = work / "traffic.parquet"
    pq.write_table(table, parquet)
    delta = work / "readings_delta"
    arrival = pa.array(range(table.num_rows), pa.int64())
    # A work folder used again holds the last run's table: replaced, not appended to.
    write_deltalake(str(delta), table.append_column("arrival", arrival), mode="overwrite")
    return parquet, delta


def baseline_tree(rev: str, work: Path) -> Path:
    """The code of commit `rev`, extracted from git into the work folder."""
    archive = subprocess.run(
        ["git", "archive", rev], check=True, capture_output=True, cwd=ROOT
    ).stdout
    target = work / f"baseline-{rev}"
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def _env(code: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(code)}


def replay(
    code: Path, spec: str, out: Path, quiet: bool, workers: int | None = None
) -> tuple[float, float]:
    """Seconds one `lookout replay` process takes, start to exit, and the CPU seconds it
    and its worker processes used (user + system, every thread); ``workers``: its
    `--workers` (None: not given, for code older than the option)."""
    shutil.rmtree(out, ignore_errors=True)
    args = [sys.executable, "-m", "lookout.cli", "replay", "--rules", str(code / "rules" /
            "traffic.sql"), "--input", spec, "--out", str(out)]  # fmt: skip
    if quiet:
        args.append("--quiet")
    if workers is not None:
        args += ["--workers", str(workers)]
    began, used = time.perf_counter(), _children_cpu()
    subprocess.run(args, check=True, cwd=code, env=_env(code), stderr=subprocess.DEVNULL)
    return time.perf_counter() - began, _children_cpu() - used


def _processes(workers: int) -> str:
    return "one process" if workers == 1 else f"{workers} workers"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float | int):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0) or a == b
    return bool(a == b)


def compare(expected: Path, got: Path) -> str:
    """`byte-identical`, `equal` (rows, keys, timestamps; floats to 1e-9 relative) or
    what differs first."""
    names = sorted(p.name for p in expected.glob("*.jsonl"))
    if names != sorted(p.name for p in got.glob("*.jsonl")):
        return f"other files: {sorted(p.name for p in got.glob('*.jsonl'))}"
    if all((expected / n).read_bytes() == (got / n).read_bytes() for n in names):
        return "byte-identical"
    for name in names:
        left = (expected / name).read_bytes().splitlines()
        right = (got / name).read_bytes().splitlines()
        if len(left) != len(right):
            return f"{name}: {len(right)} rows, not {len(left)}"
        for number, (x, y) in enumerate(zip(left, right, strict=True), start=1):
            a, b = orjson.loads(x), orjson.loads(y)
            if list(a) != list(b) or not all(_same(a[k], b[k]) for k in a):
                return f"{name}:{number}: {y.decode()} != {x.decode()}"
    return "equal"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=20_000)
    parser.add_argument("--duration", type=int, default=60)
    parser.add_argument("--stations", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--baseline", default=BASELINE, help="commit to compare with ('' none)")
    parser.add_argument("--compare", default="", help="commit whose code replays every form too")
    parser.add_argument("--work", help="work folder (default: a temporary one, removed)")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, os.cpu_count() or 1],
        help="replay each form with each of these --workers (default: 1 and one per core)",
    )
    args = parser.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="replay-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        recording = work / "traffic.jsonl"
        began = time.perf_counter()
        readings = simulate(recording, args.rate, args.duration, args.stations)
        parquet, delta = copies(recording, work)
        size = recording.stat().st_size / 1e6
        took = time.perf_counter() - began
        print(f"{readings:,} readings ({size:.0f} MB of JSON lines), generated and copied "
              f"in {took:.0f} s", flush=True)  # fmt: skip
        forms = [
            ("JSON lines", f"traffic={recording}"),
            ("Parquet file", f"traffic={parquet}"),
            ("Delta table", f"traffic={delta}"),
        ]
        runs: list[tuple[str, Path, str, int | None]] = [
            (f"{label}, {_processes(n)}", ROOT, spec, n)
            for n in args.workers
            for label, spec in forms
        ]
        if args.compare:
            other = baseline_tree(args.compare, work)
            runs += [(f"{label}, {args.compare}", other, spec, None) for label, spec in forms]
        if args.baseline:
            runs.append((f"JSON lines, {args.baseline}", baseline_tree(args.baseline, work),
                         f"traffic={recording}", None))  # fmt: skip
        results = []
        for label, code, spec, workers in runs:
            out = work / f"out-{len(results)}"
            # A baseline older than --quiet reports no progress either way.
            quiet = code == ROOT or label.endswith(f", {args.compare}")
            times = [replay(code, spec, out, quiet, workers) for _ in range(args.repeat)]
            verdict = "(the reference)" if not results else compare(work / "out-0", out)
            wall, cpu = min(t[0] for t in times), min(t[1] for t in times)
            results.append((label, wall, cpu, verdict))
            print(f"{label}: {wall:.1f} s, {readings / wall:,.0f} readings/s, CPU "
                  f"{1e6 * cpu / readings:.2f} µs/reading; outputs {verdict}",
                  flush=True)  # fmt: skip
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
        print()
        print("| input | time | readings/s | CPU per reading | outputs against JSON lines |")
        print("|---|---:|---:|---:|---|")
        for label, seconds, cpu, verdict in results:
            print(f"| {label} | {seconds:.1f} s | {readings / seconds:,.0f} | "
                  f"{1e6 * cpu / readings:.2f} µs | {verdict} |")  # fmt: skip
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, code {commit}, {os.cpu_count()} CPUs "
              f"({platform.machine()}), load average {load}, Python {platform.python_version()}, "
              f"best of {args.repeat}")  # fmt: skip
        failed = [r for r in results[1:] if r[3] not in ("equal", "byte-identical")]
        return 1 if failed else 0
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
