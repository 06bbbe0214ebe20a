"""Inputs the fuzzers (`tests/fuzz/`, `benchmarks/fuzz_input.py`) found crashing or
mislocating, kept as plain regression tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rules.language.loader import check_paths
from rules.language.parser import parse_text


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


def test_error_line_is_cut_at_newlines_only() -> None:
    """`parse_text("\\r0")` (and text with form feeds, `\\x85`, `\\u2028`) showed the wrong
    source line, or none, under an error: lark counts lines at "\\n" only, the error
    helper cut lines with `str.splitlines`. The caret now sits under the token."""
    (error,) = parse_text("\r0", "f.sql")[1]
    assert (error.line, error.col, error.source_line) == (1, 2, "\r0")
    assert error.format().endswith("\n\r0\n ^")
    (error,) = parse_text("-- x\fy\nCREATE 0", "f.sql")[1]
    assert (error.line, error.col, error.source_line) == (2, 8, "CREATE 0")


def test_end_of_file_error_is_on_a_line_of_the_text() -> None:
    """`parse_text("CREATE\\fSTREAM")` put its end-of-file error on line 2 of a one-line
    text (`splitlines` cut at the form feed); now at the end of line 1."""
    (error,) = parse_text("CREATE\fSTREAM", "f.sql")[1]
    assert (error.line, error.col) == (1, 14)
    assert error.source_line == "CREATE\fSTREAM"
