"""The rule files as the Rules page shows them: each statement's text and explanation,
and checking or saving an edited file with the same checker as `lookout rules check`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rules.language import ast
from rules.language.checker import Catalog, check_statements
from rules.language.compiler import compile_catalog
from rules.language.errors import RuleError
from rules.language.explain import explain
from rules.language.loader import rule_files
from rules.language.parser import parse_text

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
KINDS: dict[type, str] = {
    ast.CreateStream: "source stream",
    ast.CreateDerived: "derived stream",
    ast.CreateAlert: "alert",
    ast.CreateAggregate: "aggregate",
    ast.CreateTable: "reference table",
}


@dataclass(frozen=True)
class Rule:
    """One statement of a rule file: what it defines, where, its text and explanation."""

    name: str
    kind: str
    file: str
    line: int
    text: str
    explanation: str
    severity: str | None


@dataclass(frozen=True)
class Book:
    """Every statement of the rule folder, and the problems the checker found there."""

    rules: list[Rule]
    errors: list[RuleError]


def statement_text(lines: list[str], start: int, end: int) -> str:
    """Lines [start, end) of a file (0-based) with the comments just above the statement,
    without the blank and comment lines that lead into the next one."""
    while start > 0 and lines[start - 1].lstrip().startswith("--"):
        start -= 1
    while end > start and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("--")):
        end -= 1
    return "\n".join(lines[start:end])


def read_book(folder: Path) -> Book:
    """Parse and check every `*.sql` file of `folder` and explain each statement."""
    statements: list[ast.Statement] = []
    texts: dict[str, str] = {}
    errors: list[RuleError] = []
    if not folder.is_dir():
        return Book([], [])
    for path in rule_files([folder]):
        # Full paths, so table files named relative to a rule file resolve.
        texts[str(path)] = path.read_text(encoding="utf-8")
        parsed, syntax = parse_text(texts[str(path)], str(path))
        statements.extend(parsed)
        errors.extend(syntax)
    # Explain what can be explained even if some statements have errors (as the CLI does).
    catalog, check_errors = check_statements(statements, texts)
    errors.extend(check_errors)
    shown = [RuleError(Path(e.file).name, e.line, e.col, e.message, e.source_line) for e in errors]
    return Book(_rules(statements, texts, catalog), shown)


def _rules(statements: list[ast.Statement], texts: dict[str, str], catalog: Catalog) -> list[Rule]:
    rules = []
    for i, stmt in enumerate(statements):
        lines = texts[stmt.file].splitlines()
        following = statements[i + 1] if i + 1 < len(statements) else None
        end = following.pos.line - 1 if following and following.file == stmt.file else len(lines)
        name = stmt.name.name
        rules.append(
            Rule(
                name=name,
                kind=KINDS.get(type(stmt), "statement"),
                file=Path(stmt.file).name,
                line=stmt.pos.line,
                text=statement_text(lines, stmt.pos.line - 1, end),
                explanation=explain(catalog, name) or "",
                severity=str(stmt.severity) if isinstance(stmt, ast.CreateAlert) else None,
            )
        )
    return rules


def check_file(folder: Path, name: str, text: str) -> list[RuleError]:
    """Errors of the rule folder with `<name>.sql` replaced by `text` (errors in that file
    name it `<name>.sql`). Nothing is written: the edited text is checked as if it were
    in the folder, so relative table paths in it resolve as they will there."""
    target = folder / f"{name}.sql"
    texts: dict[str, str] = {}
    statements: list[ast.Statement] = []
    errors: list[RuleError] = []
    others = [p for p in rule_files([folder]) if p.name != target.name] if folder.is_dir() else []
    for path, source in [*((p, p.read_text(encoding="utf-8")) for p in others), (target, text)]:
        texts[str(path)] = source
        parsed, syntax = parse_text(source, str(path))
        statements.extend(parsed)
        errors.extend(syntax)
    # The same steps as `lookout rules check` (rules.language.loader).
    catalog, check_errors = check_statements(statements, texts)
    errors.extend(check_errors)
    if not errors:
        errors.extend(compile_catalog(catalog, texts)[1])
    return [RuleError(Path(e.file).name, e.line, e.col, e.message, e.source_line) for e in errors]


def save_file(folder: Path, name: str, text: str) -> list[RuleError]:
    """Write `<name>.sql` into `folder` if the folder stays valid; else return the errors."""
    errors = check_file(folder, name, text)
    if not errors:
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{name}.sql"
        tmp = target.with_suffix(".sql.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)  # the engine never sees a half-written file
    return errors


def annotate(text: str, errors: list[RuleError]) -> str:
    """The text with line numbers and, under each offending line, a caret at the
    column, then `line:col: message`."""
    by_line: dict[int, list[RuleError]] = {}
    for error in errors:
        by_line.setdefault(error.line, []).append(error)
    lines = text.splitlines() or [""]
    width = len(str(len(lines)))
    out = []
    for number, line in enumerate(lines, start=1):
        out.append(f"{number:>{width}} | {line}")
        for error in by_line.pop(number, []):
            pad = "".join("\t" if ch == "\t" else " " for ch in line[: error.col - 1])
            out.append(f"{'':>{width}} | {pad}^")
            out.append(f"{'':>{width}} | {error.line}:{error.col}: {error.message}")
    for rest in by_line.values():  # errors past the end of the text (end of input)
        out.extend(f"{'':>{width}} | {e.line}:{e.col}: {e.message}" for e in rest)
    return "\n".join(out)
