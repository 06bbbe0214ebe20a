"""The ``simulate`` command as lookout/cli.py will mount it: register(subparsers)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from simulators.cli import register


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lookout")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_register_and_dispatch(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    args = _parse("simulate", "rfid", "--duration", "60", "--out", str(out), "--quiet")
    assert args.host == "127.0.0.1" and args.port == 1883 and args.qos == 1
    assert args.heartbeats is True and args.disorder == "none"
    assert args.func(args) == 0
    assert out.stat().st_size > 0


def test_demo_flags_parse() -> None:
    args = _parse(
        "simulate",
        "traffic",
        "--rate",
        "200",
        "--stations",
        "10",
        "--congestion",
        "3,7",
        "--duration",
        "0",
        "--no-heartbeats",
    )
    assert (args.rate, args.stations, args.congestion, args.duration) == (200, 10, "3,7", 0)
    assert args.heartbeats is False and args.speedup == 1


@pytest.mark.parametrize(
    "argv",
    [
        ("traffic", "--out", "x.jsonl"),  # a file needs a duration
        ("traffic", "--duration", "5", "--out", "x.jsonl", "--disorder", "shuffled"),
        ("traffic", "--duration", "5", "--out", "x.jsonl", "--congestion", "3@x"),
        ("traffic", "--duration", "5", "--out", "x.jsonl", "--congestion", "11"),
        ("rfid", "--duration", "5", "--out", "x.jsonl", "--doors", "1"),
        ("traffic", "--duration", "5", "--out", "x.jsonl", "--rate", "0"),
        ("traffic", "--duration", "5", "--out", "x.jsonl", "--heartbeat-interval", "0"),
        ("traffic", "--duration", "5", "--out", "x.jsonl", "--late-fraction", "-0.1"),
        (
            "traffic",
            "--duration",
            "5",
            "--out",
            "x.jsonl",
            "--late-fraction",
            "0.6",
            "--duplicate-fraction",
            "0.6",
        ),
    ],
)
def test_bad_arguments_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]
) -> None:
    monkeypatch.chdir(tmp_path)
    args = _parse("simulate", *argv, "--quiet")
    assert args.func(args) == 2


def test_unreachable_broker_exits_1() -> None:
    args = _parse("simulate", "traffic", "--port", "1", "--duration", "1", "--quiet")
    assert args.func(args) == 1
