"""`lookout replay` on a simulator's file: `STREAM=FILE` takes every line as that stream's,
a bare `FILE` sends each line to the source stream whose columns it carries (a traffic
recording with accidents mixes loop-detector readings and position reports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from lookout.replay import run_replay
from rules.language.loader import RULES_DIR


def simulate(tmp_path: Path) -> Path:
    out = tmp_path / "traffic.jsonl"
    subprocess.run(
        [sys.executable, "-m", "simulators.cli", "traffic", "--out", str(out), "--duration",
         "600", "--rate", "20", "--stations", "10", "--accident", "8@120", "--quiet"],
        check=True,
    )  # fmt: skip
    return out


def test_a_bare_file_is_split_by_columns_and_a_named_stream_refuses_the_others(
    tmp_path: Path, capsys
) -> None:
    recording = simulate(tmp_path)
    lines = [orjson.loads(x) for x in recording.read_bytes().splitlines()]
    positions = [r for r in lines if "vid" in r]
    assert positions and len(positions) < len(lines)
    rules = str(RULES_DIR / "traffic.sql")

    assert run_replay([rules], [str(recording)], str(tmp_path / "mixed")) == 0
    accidents = (tmp_path / "mixed" / "accident.jsonl").read_bytes().splitlines()
    assert accidents, "the position reports reached the accident rule"
    # The same rows as two files named by stream.
    (tmp_path / "pos.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in positions))
    loops = [r for r in lines if "vid" not in r]
    (tmp_path / "loops.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in loops))
    inputs = [f"traffic={tmp_path / 'loops.jsonl'}", f"positions={tmp_path / 'pos.jsonl'}"]
    assert run_replay([rules], inputs, str(tmp_path / "split")) == 0
    for name in ("accident.jsonl", "congestion.jsonl", "stopped_vehicles.jsonl"):
        assert (tmp_path / "mixed" / name).read_bytes() == (tmp_path / "split" / name).read_bytes()

    assert run_replay([rules], [f"traffic={recording}"], str(tmp_path / "named")) == 2
    first = next(i for i, r in enumerate(lines, start=1) if "vid" in r)
    assert f"{recording}:{first}: missing field 'station'" in capsys.readouterr().err
