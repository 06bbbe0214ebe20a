"""`lookout rules test`: the library passes its own tests, every alert of it is tested
firing, and a wrong expectation, a wrong message or an unusable test file fails."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.core.plan import SinkKind
from lookout.cli import main
from lookout.rule_tests import ALERT_FIELDS, companion_tests, diff, load_cases
from rules.language.loader import RULES_DIR, load_rules, rule_files


def _library_copy(tmp_path: Path) -> Path:
    """The rule library's rule files, tables and tests in a folder of their own."""
    folder = tmp_path / "rules"
    folder.mkdir()
    for pattern in ("*.sql", "*.csv", "*.test.yaml"):
        for path in RULES_DIR.glob(pattern):
            shutil.copy(path, folder / path.name)
    return folder


def test_the_library_passes_its_tests(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "test", str(RULES_DIR)]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "ERROR" not in out
    assert out.endswith("9 passed, 0 failed\n")


def test_every_library_alert_is_tested_firing() -> None:
    rule_set = load_rules([RULES_DIR])
    files = companion_tests(rule_files([RULES_DIR]))
    assert [path.name for path in files] == ["rfid.test.yaml", "traffic.test.yaml"]
    cases = [case for path in files for case in load_cases(path, rule_set)]
    fired = {rule for case in cases for rule, items in case.alerts.items() if items}
    alerts = {q.sink.name for q in rule_set.plan.queries if q.sink.kind == SinkKind.ALERT}
    # A case compares every alert of the rules it names, so the readings that must not
    # give one are tested with those that must.
    assert fired == alerts


def test_a_wrong_expectation_fails_with_a_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _library_copy(tmp_path)
    tests = folder / "traffic.test.yaml"
    text = tests.read_text()
    assert text.count('at: "2024-05-01T08:06:00Z"') == 1
    tests.write_text(text.replace('at: "2024-05-01T08:06:00Z"', 'at: "2024-05-01T08:07:00Z"'))
    assert main(["rules", "test", str(folder)]) == 1
    out = capsys.readouterr().out
    assert (
        "  FAIL a station silent for 5 minutes is reported once, one that reports is not\n"
        "       alerts of silent_detector:\n"
        "         + key 'station=1', at '2024-05-01T08:06:00.000+00:00', "
        "message 'station 1: no reading since 1714550460000'\n"
        "         - key 'station=1', at '2024-05-01T08:07:00.000+00:00'\n"
    ) in out
    assert out.endswith("8 passed, 1 failed (-: expected, not given; +: given, not expected)\n")


def test_a_message_given_must_match_and_one_left_out_matches_any() -> None:
    got = [("station=3", "08:00", "slow"), ("station=3", "08:01", "slow")]
    assert (
        diff([("station=3", "08:00", None), ("station=3", "08:01", "slow")], got, ALERT_FIELDS)
        == []
    )
    assert diff(
        [("station=3", "08:00", "fast"), ("station=3", "08:01", None)], got, ALERT_FIELDS
    ) == [
        "- key 'station=3', at '08:00', message 'fast'",
        "+ key 'station=3', at '08:00', message 'slow'",
    ]
    # The complete expectation takes its item first, whatever the order they are in.
    either = [("station=3", None, None), ("station=3", "08:00", "slow")]
    assert diff(either, got, ALERT_FIELDS) == []


@pytest.mark.parametrize(
    ("case", "error"),
    [
        (
            "{name: x, input: {traffic: []}, alerts: {congestoin: []}}",
            "case 1 (x): alerts: unknown alert 'congestoin' (alerts: accident, congestion,",
        ),
        (
            "{name: x, input: {traffic: [{station: 1, ts: 0}]}, alerts: {}}",
            "case 1 (x): input: traffic #1: missing field",
        ),
        (
            "{name: x, input: {}, alerts: {congestion: [{key: station=1}]}}",
            "case 1 (x): alerts: congestion #1: missing field 'at'",
        ),
        ("{name: x, input: {}, end_at: soon, alerts: {}}", "case 1 (x): end_at: cannot parse"),
    ],
)
def test_an_unusable_case_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, error: str
) -> None:
    folder = _library_copy(tmp_path)
    (folder / "traffic.test.yaml").write_text(f"cases:\n  - {case}\n")
    assert main(["rules", "test", str(folder)]) == 1
    out = capsys.readouterr().out
    assert f"rules/traffic.test.yaml\n  ERROR {error}" in out
    assert out.endswith("3 passed, 1 failed (-: expected, not given; +: given, not expected)\n")
