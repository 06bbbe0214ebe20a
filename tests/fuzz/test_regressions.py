"""Inputs the fuzzers (`tests/fuzz/`, `benchmarks/fuzz_input.py`) found crashing or
mislocating, kept as plain regression tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rules.language.loader import check_paths


def test_non_utf8_rule_file_is_a_located_error(tmp_path: Path) -> None:
    """`check_paths` raised UnicodeDecodeError on a file holding b"CREATE STREAM \\xff"
    (`lookout rules check` printed a traceback); now one error at the first bad byte."""
    path = tmp_path / "bad.sql"
    path.write_bytes(b"CREATE STREAM x\r\n  (a INT\xc3(, \xff")
    (error,) = check_paths([path])
    assert (error.file, error.line, error.col) == (str(path), 2, 9)
    assert error.message == "the file is not UTF-8 (byte 25 is 0xc3)"
    assert error.format().endswith("\n  (a INT\ufffd(, \ufffd\n        ^")
    done = subprocess.run(
        [sys.executable, "-m", "lookout.cli", "rules", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"{path}:2:9: the file is not UTF-8" in done.stderr
