"""`rules check` and `rules explain` as registered on an argparse parser."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rules.language.cli import register
from tests.rules.helpers import TRAFFIC


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lookout")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_check_library_default_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["rules", "check"]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


def test_check_reports_errors_with_caret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.sql"
    bad.write_text(TRAFFIC + "CREATE STREAM s AS SELECT station, sped FROM traffic;\n")
    assert _run(["rules", "check", str(bad)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{bad}:3:36: unknown column 'sped'")
    assert err[1] == "CREATE STREAM s AS SELECT station, sped FROM traffic;"
    assert err[2] == " " * 35 + "^"
    assert err[3] == "1 error"


def test_explain_congestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["rules", "explain", "station_speed"]) == 0
    out = capsys.readouterr().out
    assert "reads stream: traffic" in out
    assert "slack 2 seconds" in out
    assert "keys: station" in out
    assert "for a tuple at t, the tuples in [t - 15 minutes, t]" in out
    assert "a tuple at 01-01 01:15:00 sees [01-01 01:00:00, 01-01 01:15:00]" in out
    assert "SLIDE 1 minute: only the last tuple of each slot is output" in out
    assert "outputs: station INT, ts TIMESTAMP, avg_speed DOUBLE" in out


def test_explain_follows_an_alert_to_the_windows_upstream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # congestion has no window of its own: it is keyed and windowed by station_speed.
    assert _run(["rules", "explain", "congestion"]) == 0
    out = capsys.readouterr().out
    assert "keys: station\nwindow: none here" in out
    assert "upstream window in station_speed: time-based window per station" in out
    # accident's own tumble, then the count-based window two streams up.
    assert _run(["rules", "explain", "accident"]) == 0
    out = capsys.readouterr().out
    assert "window: domain-driven tumbling window" in out
    assert "upstream window in last_reports: count-based window per vid" in out


def test_explain_domain_window(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["rules", "explain", "segment_minmax"]) == 0
    out = capsys.readouterr().out
    assert (
        "extent [01-01 00:56:00, 01-01 01:01:00) is emitted when the watermark reaches "
        "01-01 01:01:00" in out
    )


@pytest.mark.parametrize(
    ("alert", "says"),
    [
        ("congestion", "resolved at the key's first row of station_speed where WHERE does not"),
        ("silent_detector", "resolved at the key's first row of traffic where RESOLVE WHEN holds"),
        ("accident", "resolved 30 seconds after the key's last report"),
    ],
)
def test_explain_says_how_incidents_resolve(
    alert: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(["rules", "explain", alert]) == 0
    assert f"incidents: per key, open at its first report, {says}" in capsys.readouterr().out


def test_explain_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["rules", "explain", "nope"]) == 1
    assert "no stream, alert, table or aggregate named 'nope'" in capsys.readouterr().err


def test_explain_exits_non_zero_when_the_rules_have_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "r.sql"
    rules.write_text(
        TRAFFIC + "CREATE STREAM fast AS SELECT station, ts FROM traffic WHERE speed > 30;\n"
        "CREATE STREAM s AS SELECT station, sped FROM traffic;\n"
    )
    # The stream that checks is still explained; the status says the file does not.
    assert _run(["rules", "explain", "fast", "--rules", str(rules)]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("fast: derived stream")
    assert "unknown column 'sped'" in captured.err


def test_explain_per_source_clocks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "s.sql"
    rules.write_text(
        "CREATE STREAM s (station INT, ts TIMESTAMP)\n"
        "  ORDER BY ts SLACK 2 SECONDS PER SOURCE IDLE 30 SECONDS SOURCE 'lookout/s/+/readings';\n"
        "CREATE STREAM d AS SELECT station, ts FROM s;\n"
    )
    assert _run(["rules", "explain", "d", "--rules", str(rules)]) == 0
    assert "slack 2 seconds per source (idle after 30 seconds)" in capsys.readouterr().out
    assert _run(["rules", "explain", "s", "--rules", str(rules)]) == 0
    assert "slack 2 seconds per source (idle after 30 seconds)" in capsys.readouterr().out
