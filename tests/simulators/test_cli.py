"""The ``simulate`` command as lookout/cli.py will mount it: register(subparsers)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lookout.cli import build_parser
from lookout.config import Config, load_config
from lookout.demo import lookout_argv, simulator_argvs
from lookout.services import alert_specs, load_rule_set
from rules.language.loader import RULES_DIR
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


def demo_simulators(*demo_args: str) -> dict[str, argparse.Namespace]:
    """The simulators `lookout demo` starts (with `demo_args`), by part name, their
    command lines parsed as `lookout` parses them."""
    args = build_parser().parse_args(["demo", *demo_args])
    parts = simulator_argvs(Config(), args)
    prefix = lookout_argv()
    assert all(argv[: len(prefix)] == prefix for _, argv in parts)
    return {name: build_parser().parse_args(argv[len(prefix) :]) for name, argv in parts}


def test_the_demo_runs_traffic_and_rfid_with_a_theft_and_a_missing_item_planted() -> None:
    found = demo_simulators()
    traffic, rfid = found["traffic-simulator"], found["rfid-simulator"]
    assert traffic.simulate_command == "traffic"
    assert (traffic.rate, traffic.stations, traffic.congestion) == (200, 10, "3,7")
    assert rfid.simulate_command == "rfid"
    assert rfid.theft >= 1 and rfid.missing >= 1 and rfid.packing >= 1
    assert rfid.rate <= 100  # the demo shares two cores with Spark
    for args in found.values():
        assert args.duration == 0 and args.heartbeats is True and args.speedup == 1
    assert demo_simulators("--rfid-rate", "20")["rfid-simulator"].rate == 20
    assert list(demo_simulators("--rfid-rate", "0")) == ["traffic-simulator"]


def test_the_demos_engine_loads_the_rfid_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """`lookout engine` without --rules on the shipped lookout.toml, as the demo starts
    it from the checkout."""
    monkeypatch.chdir(RULES_DIR.parent)
    alerts = alert_specs(load_rule_set(load_config("lookout.toml"), None))
    assert {"congestion", "larceny", "missed_shipping"} <= alerts.keys()


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
