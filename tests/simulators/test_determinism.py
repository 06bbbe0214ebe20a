"""Same seed and arguments => byte-identical readings and ground truth."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.simulators.helpers import simulate

FAULTS = (
    "--late-fraction",
    "0.01",
    "--duplicate-fraction",
    "0.01",
    "--malformed-fraction",
    "0.01",
    "--skew",
    "0.5",
)
CASES = {
    "traffic": (
        "traffic",
        "--duration",
        "120",
        "--congestion",
        "3,7@30+60",
        "--silent",
        "2:3",
        "--accident",
        "5@10+60",
        "--speeding",
        "4",
        "--disorder",
        "bounded:1.5",
        *FAULTS,
    ),
    "rfid": ("rfid", "--duration", "600", "--doors", "5", "--disorder", "blocks:5", *FAULTS),
    "iso": ("traffic", "--duration", "30", "--ts-format", "iso", "--start", "2026-03-01T08:00:00"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_seed_same_bytes(tmp_path: Path, case: str) -> None:
    argv = (*CASES[case], "--epoch", "run-1")
    a = simulate(tmp_path, *argv, "--seed", "7", name="a")
    b = simulate(tmp_path, *argv, "--seed", "7", name="b")
    c = simulate(tmp_path, *argv, "--seed", "8", name="c")
    assert a[0].stat().st_size > 10_000
    assert a[0].read_bytes() == b[0].read_bytes()
    assert a[1].read_bytes() == b[1].read_bytes()
    assert a[0].read_bytes() != c[0].read_bytes()


def test_seq_strictly_increasing_per_source(tmp_path: Path) -> None:
    from tests.simulators.helpers import load

    out, _ = simulate(tmp_path, "traffic", "--duration", "60", "--accident", "2@0+30")
    readings, bad = load(out)
    assert not bad
    seqs: dict[str, list[int]] = {}
    for r in readings:
        seqs.setdefault(r["source"], []).append(r["seq"])
    for s in seqs.values():
        assert s == list(range(len(s)))


def test_each_run_has_its_own_epoch_on_every_reading(tmp_path: Path) -> None:
    """A restarted simulator starts its seq again: its epoch tells the two runs apart.
    Without --epoch, two runs differ in their epoch only."""
    from tests.simulators.helpers import load, truth_of

    argv = ("traffic", "--duration", "20", "--accident", "2@0+10", "--seed", "3")
    runs = [simulate(tmp_path, *argv, name=name) for name in ("a", "b")]
    epochs = []
    for out, truth in runs:
        readings, _ = load(out)
        (epoch,) = {r["epoch"] for r in readings}
        assert isinstance(epoch, str) and epoch
        assert truth_of(truth, "run")[0]["epoch"] == epoch
        epochs.append(epoch)
    assert epochs[0] != epochs[1]
    stripped = [
        [{k: v for k, v in r.items() if k != "epoch"} for r in load(out)[0]] for out, _ in runs
    ]
    assert stripped[0] == stripped[1]
