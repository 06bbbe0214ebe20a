"""Load rule files: parse, check and (on demand) compile them to the engine plan."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.core.plan import Plan
from rules.language import ast
from rules.language.checker import Catalog, check_statements
from rules.language.compiler import compile_catalog
from rules.language.errors import RuleError
from rules.language.parser import parse_text

RULES_DIR = Path(__file__).resolve().parent.parent
"""The rules/ folder: the default place `rules check` looks."""


class RuleCheckError(Exception):
    """Raised by `load_rules` when the files have errors; `errors` lists them."""

    def __init__(self, errors: list[RuleError]) -> None:
        super().__init__("\n".join(e.format() for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class RuleSet:
    """Checked rules: their statements, catalog and compiled engine plan."""

    statements: tuple[ast.Statement, ...]
    catalog: Catalog
    plan: Plan
    texts: dict[str, str]


def rule_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand folders into their `*.sql` files (sorted); keep files as given."""
    files: list[Path] = []
    for path in map(Path, paths):
        files.extend(sorted(path.glob("*.sql")) if path.is_dir() else [path])
    return files


def parse_files(
    paths: Iterable[str | Path],
) -> tuple[list[ast.Statement], dict[str, str], list[RuleError]]:
    """Read and parse the rule files at `paths`: statements, file texts, and the files'
    read and syntax errors (located; never raised)."""
    statements: list[ast.Statement] = []
    texts: dict[str, str] = {}
    errors: list[RuleError] = []
    for path in rule_files(paths):
        name = str(path)
        try:
            texts[name] = path.read_text(encoding="utf-8")
        except OSError as exc:
            errors.append(RuleError(name, 1, 1, f"cannot read the file: {exc.strerror}"))
            continue
        except UnicodeDecodeError as exc:
            errors.append(_not_utf8(name, exc))
            continue
        parsed, syntax = parse_text(texts[name], name)
        statements.extend(parsed)
        errors.extend(syntax)
    return statements, texts, errors


def _analyse(
    paths: Iterable[str | Path],
) -> tuple[list[ast.Statement], Catalog, Plan | None, dict[str, str], list[RuleError]]:
    statements, texts, errors = parse_files(paths)
    catalog, check_errors = check_statements(statements, texts)
    errors.extend(check_errors)
    plan = None
    if not errors:
        plan, compile_errors = compile_catalog(catalog, texts)
        errors.extend(compile_errors)
    return statements, catalog, plan, texts, errors


def _not_utf8(name: str, exc: UnicodeDecodeError) -> RuleError:
    """A located error for a rule file that is not UTF-8: the line and column of the
    first bad byte, counted as for readable files (universal newlines; the text before
    the byte decodes, so the column counts characters)."""
    raw = bytes(exc.object)

    def newlines(data: bytes) -> bytes:
        return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    before = newlines(raw[: exc.start]).split(b"\n")
    lines = newlines(raw).decode("utf-8", errors="replace").split("\n")
    return RuleError(
        name,
        len(before),
        len(before[-1].decode("utf-8")) + 1,
        f"the file is not UTF-8 (byte {exc.start} is 0x{raw[exc.start]:02x})",
        lines[len(before) - 1],
    )


def check_paths(paths: Iterable[str | Path]) -> list[RuleError]:
    """All errors in the rule files at `paths` (files or folders), in file order."""
    return _analyse(paths)[4]


def load_rules(paths: Iterable[str | Path]) -> RuleSet:
    """Parse, check and compile the rule files at `paths`; RuleCheckError if invalid."""
    statements, catalog, plan, texts, errors = _analyse(paths)
    if errors or plan is None:
        raise RuleCheckError(errors)
    return RuleSet(tuple(statements), catalog, plan, texts)
