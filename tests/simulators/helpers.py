"""Running the simulator CLI into files and reading its output back."""

from __future__ import annotations

from pathlib import Path

import orjson

from simulators.cli import main
from simulators.truth import read_truth

#: The fields a valid reading of each kind carries.
KEYS = (
    ("station", "lane", "speed", "length", "source", "seq"),
    ("tagid", "tagtype", "door", "source", "seq"),
    ("vid", "speed", "xway", "lane", "dir", "seg", "pos", "source", "seq"),
)


def is_reading(obj: object) -> bool:
    """A well-formed reading (epoch-ms ts and every field of its kind)."""
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("ts"), int)
        and any(all(k in obj for k in keys) for keys in KEYS)
    )


def simulate(tmp: Path, *argv: str, name: str = "run") -> tuple[Path, Path]:
    """Run ``simulate ARGV --out tmp/name.jsonl --truth tmp/name.truth``; return both paths."""
    out, truth = tmp / f"{name}.jsonl", tmp / f"{name}.truth"
    rc = main([*argv, "--out", str(out), "--truth", str(truth), "--quiet"])
    assert rc == 0
    return out, truth


def load(out: Path) -> tuple[list[dict], list[bytes]]:
    """The file's readings (valid JSON objects with a source and seq) and its other lines."""
    good, bad = [], []
    for line in out.read_bytes().splitlines():
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            bad.append(line)
            continue
        if is_reading(obj):
            good.append(obj)
        else:
            bad.append(line)
    return good, bad


def truth_of(path: Path, kind: str) -> list[dict]:
    """The truth records of one type."""
    return [r for r in read_truth(str(path)) if r["type"] == kind]


def lateness(readings: list[dict]) -> list[int]:
    """For each reading in arrival order: how far (ms) it is behind the newest before it."""
    out, newest = [], None
    for r in readings:
        out.append(0 if newest is None else max(0, newest - r["ts"]))
        newest = r["ts"] if newest is None else max(newest, r["ts"])
    return out
