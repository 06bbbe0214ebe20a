"""`lookout rules preview FILE`: counts per rule and key, incidents, the time taken;
errors located as file:line:col, nothing evaluated."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.alerts import iso_utc
from lookout.cli import main
from rules.language.loader import RULES_DIR
from tests.preview.history import END, RULE, readings, write_history


def preview(tmp_path: Path, text: str, *extra: str) -> int:
    lakehouse = tmp_path / "lakehouse"
    if not lakehouse.exists():
        write_history(lakehouse)
    rule = tmp_path / "mine.sql"
    rule.write_text(text)
    args = ["--lakehouse", str(lakehouse), "--rules", str(RULES_DIR), *extra]
    return main(["rules", "preview", str(rule), *args])


def test_counts_per_rule_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert preview(tmp_path, RULE, "--since", "1h", "--limit", "1") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"history {iso_utc(END - 3_600_000)} .. {iso_utc(END)} (the stored watermark)"
    assert out[1] == f"  traffic: {len(readings()):,} readings, watermark {iso_utc(END)}"
    slow = out.index("slow_minute:")
    assert out[slow + 1].split() == ["key", "alerts", "incidents", "firing"]
    assert out[slow + 2].split() == ["station=2", "4", "2", "1"]
    assert "station=2  firing  2 report(s)  station 2: 3.00 m/s" in out[slow + 3]
    assert out[slow + 4] == "  (1 earlier incidents not shown)"
    quiet = out.index("quiet:")
    assert out[quiet + 2].split() == ["station=3", "1", "1", "1"]
    assert out[-1].startswith("evaluated in ")


def test_errors_at_file_line_col(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert preview(tmp_path, "CREATE ALERT x SEVERITY info AS SELECT nope FROM traffic;\n") == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'mine.sql'}:1:40: " in err
    assert err.rstrip().endswith("1 error; nothing evaluated")
    assert preview(tmp_path, RULE, "--since", "soon") == 2
    assert "'soon' is not a duration" in capsys.readouterr().err
