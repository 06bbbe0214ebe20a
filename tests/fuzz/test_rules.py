"""Fuzz the rule language with mutated library files and grammar-generated text
(bad input): `parse_text` and `check_paths` never raise, every error is
located with a caret, and what checks clean compiles. `lookout rules check` on a few
nasty files exits 1 with located errors and no traceback. The long run is
`benchmarks/fuzz_input.py`.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.examples import examples
from tests.fuzz.rule_text import (
    LIBRARY,
    check_rule_bytes,
    check_rule_file,
    grammar_text,
    mutated_library,
    non_utf8_library,
    semantic_mutations,
)

FUZZ = settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))


def test_library_is_clean(tmp_path: Path) -> None:
    """The unmutated files check clean (so every error below comes from a mutation)."""
    for name, text in LIBRARY.items():
        assert check_rule_file(tmp_path / name, text) == []


@FUZZ
@given(mutated_library())
def test_mutated_library_files(case: tuple[str, str]) -> None:
    """A mutated library file: located errors, or a clean check that compiles."""
    name, text = case
    with tempfile.TemporaryDirectory() as folder:
        check_rule_file(Path(folder) / name, text)


@settings(FUZZ, max_examples=examples(200))
@given(semantic_mutations())
def test_renamed_library_files(case: tuple[str, str]) -> None:
    """Names and numbers changed or swapped: the checker and compiler see most of these."""
    name, text = case
    with tempfile.TemporaryDirectory() as folder:
        check_rule_file(Path(folder) / name, text)


@settings(FUZZ, max_examples=examples(50))
@given(non_utf8_library())
def test_non_utf8_library_files(case: tuple[str, bytes]) -> None:
    """A library file with non-UTF-8 bytes: one located error, never a traceback."""
    name, raw = case
    with tempfile.TemporaryDirectory() as folder:
        assert check_rule_bytes(Path(folder) / name, raw)


def test_non_utf8_file_regression(tmp_path: Path) -> None:
    """Found by fuzzing: `check_paths` raised UnicodeDecodeError on b"CREATE STREAM \\xff"
    (and `lookout rules check` printed a traceback); now a located error at the byte."""
    path = tmp_path / "bad.sql"
    (error,) = check_rule_bytes(path, b"CREATE STREAM x\n  (a INT\xc3(, \xff")
    assert (error.line, error.col) == (2, 9)
    assert "not UTF-8 (byte 24" in error.message
    assert error.format().endswith("\n        ^")


@settings(FUZZ, max_examples=examples(100))
@given(grammar_text())
def test_grammar_generated_text(text: str) -> None:
    """Text from the grammar: located errors, or a clean check that compiles."""
    with tempfile.TemporaryDirectory() as folder:
        check_rule_file(Path(folder) / "generated.sql", text)


@settings(FUZZ, max_examples=examples(100))
@given(st.text(max_size=200))
def test_arbitrary_text(text: str) -> None:
    """Any text at all."""
    text = text.encode("utf-8", "replace").decode("utf-8")  # what a file can hold
    with tempfile.TemporaryDirectory() as folder:
        check_rule_file(Path(folder) / "any.sql", text)


NASTY = {
    "truncated.sql": LIBRARY["traffic.sql"][: LIBRARY["traffic.sql"].index("PRECEDING") + 4],
    "garbage.sql": "\x00\ufeff☃ CREATE STREAM ((( ;;; '",
    "tabs.sql": "CREATE\tSTREAM\tx\t(a\tINT)\tORDER\tBY\tb\tSLACK\t1\tSECONDS\tSOURCE\t'q';\n",
    "unknown.sql": "CREATE ALERT a SEVERITY info AS SELECT nope FROM nowhere;\n",
    "not_utf8.sql": "CREATE STREAM \udcff",  # a lone 0xff byte (surrogateescape)
}


@pytest.mark.parametrize("name", sorted(NASTY))
def test_rules_check_cli(tmp_path: Path, name: str) -> None:
    """`lookout rules check FILE` exits 1, prints located errors, no traceback."""
    path = tmp_path / name
    errors = check_rule_bytes(path, NASTY[name].encode("utf-8", errors="surrogateescape"))
    assert errors
    done = subprocess.run(
        [sys.executable, "-m", "lookout.cli", "rules", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr + done.stdout
    assert f"{path}:{errors[0].line}:{errors[0].col}: " in done.stderr
    assert "^" in done.stderr
