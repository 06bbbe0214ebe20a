"""Hypothesis strategies and property checks for fuzzing rule text (bad input).

Shared by `tests/fuzz/test_rules.py` and `benchmarks/fuzz_input.py`. Rule text comes
from mutating the real library files (`rules/*.sql`: tokens deleted, duplicated, swapped
or replaced, identifiers and numbers changed, garbage inserted, the file truncated) and
from the grammar itself (`hypothesis.extra.lark.from_lark`).

`check_rule_file` states the properties: checking never raises; every error is located
in the file (line >= 1, col >= 1, both inside the text), says something, and formats
with the offending line and a caret under the column; text without errors loads.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark

from rules.language.errors import RuleError, source_lines
from rules.language.loader import check_paths, load_rules
from rules.language.parser import _parser, parse_text

REPO = Path(__file__).resolve().parents[2]
LIBRARY = {path.name: path.read_text(encoding="utf-8") for path in (REPO / "rules").glob("*.sql")}
"""The real rule files, by name."""

_TOKEN = re.compile(
    r"--[^\n]*|'(?:[^']|'')*'|\d+(?:\.\d*)?|[A-Za-z_][A-Za-z0-9_]*|\s+|<=|>=|<>|!=|.",
    re.DOTALL,
)

_GARBAGE = st.sampled_from(
    [
        "",
        "(",
        ")",
        "[",
        "]",
        ",",
        ";",
        ";;",
        "'",
        "''",
        "--",
        "\n",
        "\t",
        "\r\n",
        "\r",
        "\f",
        "\x1c",
        "\x85",
        "\u2028",
        "\x00",
        "\ufeff",
        "é",
        "☃",
        "\U0001f600",
        "`",
        "$",
        "{x}",
        "SELECT",
        "FROM",
        "OVER",
        "PRECEDING",
        "AS",
        "STREAM",
        "CREATE",
        "UNION ALL",
        "GROUP BY",
        "RANGE",
        "ROWS",
        "SLIDE",
        "INTERVAL",
        "TIMESTAMP",
        "TIMESTAMP '0001-01-01T00:00:00+01:00'",
        "TIMESTAMP '9999-12-31T23:59:59-14:00'",
        "TIMESTAMP 'yesterday'",
        "CASE WHEN",
        "END",
        "NULL",
        "count(*)",
        "1.5",
        ".5",
        "0",
        "99999999999999999999999999",
        "'no.such:Thing'",
        "'rules.udas'",
        "'lookout/#'",
        "0 SECONDS",
        "1 DAYS",
        "5 MILLISECONDS",
    ]
)
_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True) | st.sampled_from(
    ["ts", "station", "traffic", "window_end", "count", "avg", "select", "x" * 300]
)
_NUMBERS = st.sampled_from(["0", "1", "-1", "00", "2147483648", "9" * 30, "1.0", "1e3"])


def tokens(text: str) -> list[str]:
    """`text` cut into comments, strings, numbers, words, whitespace and symbols."""
    return _TOKEN.findall(text)


_ALL_OPS = ("delete", "duplicate", "swap", "insert", "replace", "name", "number", "truncate")
_SEMANTIC_OPS = ("name", "number", "swap_names")


@st.composite
def mutated_library(draw: st.DrawFn, ops: tuple[str, ...] = _ALL_OPS) -> tuple[str, str]:
    """(file name, text): a library file after one to four random mutations.

    With `ops=_SEMANTIC_OPS` (see `semantic_mutations`) only names and numbers change, so
    most results parse and the checker and compiler see them.
    """
    name = draw(st.sampled_from(sorted(LIBRARY)))
    toks = tokens(LIBRARY[name])
    for _ in range(draw(st.integers(1, 4))):
        if not toks:
            toks = [""]
        i = draw(st.integers(0, len(toks) - 1))
        j = draw(st.integers(0, len(toks) - 1))
        op = draw(st.sampled_from(ops))
        words = [k for k, t in enumerate(toks) if re.fullmatch(r"[A-Za-z_]\w*", t)]
        if op == "swap_names" and words:
            a, b = draw(st.sampled_from(words)), draw(st.sampled_from(words))
            toks[a], toks[b] = toks[b], toks[a]
        elif op == "delete":
            del toks[i]
        elif op == "duplicate":
            toks.insert(i, toks[i])
        elif op == "swap":
            toks[i], toks[j] = toks[j], toks[i]
        elif op == "insert":
            toks.insert(i, draw(_GARBAGE))
        elif op == "replace":
            toks[i] = draw(_GARBAGE | st.sampled_from(toks))
        elif op == "name":
            if words:
                others = [toks[k] for k in words]
                toks[draw(st.sampled_from(words))] = draw(_NAMES | st.sampled_from(others))
        elif op == "number":
            numbers = [k for k, t in enumerate(toks) if t[:1].isdigit()]
            if numbers:
                toks[draw(st.sampled_from(numbers))] = draw(_NUMBERS)
        elif op == "truncate":
            text = "".join(toks)
            toks = [text[: draw(st.integers(0, len(text)))]]
    return name, "".join(toks)


def semantic_mutations() -> st.SearchStrategy[tuple[str, str]]:
    """Library files with names and numbers changed or swapped (mostly still parse)."""
    return mutated_library(_SEMANTIC_OPS)


def grammar_text() -> st.SearchStrategy[str]:
    """Text generated from the rule grammar (mostly syntactically valid, often wrong)."""
    return from_lark(
        _parser(),
        explicit={
            "NAME": _NAMES.filter(lambda n: n.lower() not in {"select"}),
            "WS": st.sampled_from([" ", "\n", "\t", "  \n  "]),
        },
    )


def check_errors(path: str, text: str, errors: list[RuleError]) -> None:
    """Every error is located inside `text`, says something, and shows line and caret."""
    lines = source_lines(text)  # at "\n" only, as lark and editors count lines
    assert isinstance(errors, list)
    for error in errors:
        assert isinstance(error, RuleError), error
        assert error.file == path, error
        assert error.message.strip(), error
        assert 1 <= error.line <= len(lines), (error, len(lines))
        line = lines[error.line - 1]
        assert 1 <= error.col <= len(line) + 1, (error, line)
        assert error.source_line == line, (error, line)
        shown = error.format()
        assert shown.startswith(f"{path}:{error.line}:{error.col}: "), shown
        if line.strip():
            _head, source, caret = shown.rsplit("\n", 2)
            assert source == line and caret.endswith("^"), shown
            assert len(caret) == error.col, shown


@st.composite
def non_utf8_library(draw: st.DrawFn) -> tuple[str, bytes]:
    """(file name, bytes): a library file with bytes that are not UTF-8 put in."""
    name = draw(st.sampled_from(sorted(LIBRARY)))
    raw = LIBRARY[name].encode("utf-8")
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(raw)))
        junk = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\xfe\xff"]))
        raw = raw[:at] + junk + raw[at:]
    return name, raw


def check_rule_bytes(path: Path, raw: bytes) -> list[RuleError]:
    """Write `raw` to `path` and check it; the file may not be UTF-8. Properties as below,
    against the text as an editor would show it (bad bytes replaced, universal newlines)."""
    _with_tables(path.parent)
    path.write_bytes(raw)
    errors = check_paths([path])
    text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    check_errors(str(path), text, errors)
    return errors


def _with_tables(folder: Path) -> None:
    for data in (REPO / "rules").glob("*.csv"):  # tables the library reads (stations.csv)
        if not (folder / data.name).exists():
            (folder / data.name).write_bytes(data.read_bytes())


def check_rule_file(path: Path, text: str) -> list[RuleError]:
    """Write `text` to `path`, parse and check it; the properties hold; return the errors."""
    _with_tables(path.parent)
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _, syntax = parse_text(text, str(path))
    check_errors(str(path), text, syntax)
    errors = check_paths([path])
    # The loader reads with universal newlines ("\r" and "\r\n" become "\n").
    check_errors(str(path), path.read_text(encoding="utf-8", errors="replace"), errors)
    if syntax:
        assert errors, "a syntax error must survive into check_paths"
    if not errors:
        rule_set = load_rules([path])  # a valid mutation compiles
        assert rule_set.plan is not None
    return errors
