"""Load rule files: parse, check and (on demand) compile them to the engine plan.

A rule set is the `*.sql` files of the folders and the files given, in one order
whatever order they were given in (by their resolved paths), each file once; the
checker resolves names across all of them, so no file has to come before another.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from engine.core.plan import Plan
from rules.language import ast
from rules.language.access import DEFAULT_POLICY, Access, RulePolicy
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


def rule_files(paths: Iterable[str | Path], extra: Iterable[Path] = ()) -> list[Path]:
    """The rule files at `paths` (folders give their `*.sql` files) and `extra`, each
    once, ordered by resolved path: the same list whatever order they come in."""
    files: dict[Path, Path] = {}
    for path in map(Path, paths):
        for file in sorted(path.glob("*.sql")) if path.is_dir() else [path]:
            files.setdefault(file.resolve(), file)
    for file in extra:
        files.setdefault(file.resolve(), file)
    return [files[key] for key in sorted(files)]


def parse_files(
    paths: Iterable[str | Path], edits: Mapping[Path, str | None] | None = None
) -> tuple[list[ast.Statement], dict[str, str], list[RuleError]]:
    """Read and parse the rule files at `paths`: statements, file texts, and the files'
    read and syntax errors (located; never raised). `edits` maps a file (new, or one of
    those at `paths`) to the text to take for it instead of what is on disk, or to None
    to leave it out: the rule set as it would be after writing or removing them."""
    edited = {path.resolve(): text for path, text in (edits or {}).items()}
    statements: list[ast.Statement] = []
    texts: dict[str, str] = {}
    errors: list[RuleError] = []
    for path in rule_files(paths, edits or ()):
        name, resolved = str(path), path.resolve()
        if resolved in edited and edited[resolved] is None:
            continue
        try:
            text = edited.get(resolved)
            texts[name] = path.read_text(encoding="utf-8") if text is None else text
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


class Analysis(NamedTuple):
    """A rule set parsed, checked and, when that found no error, compiled."""

    statements: list[ast.Statement]
    catalog: Catalog
    plan: Plan | None
    texts: dict[str, str]
    errors: list[RuleError]


def analyse(
    paths: Iterable[str | Path],
    policy: RulePolicy = DEFAULT_POLICY,
    edits: Mapping[Path, str | None] | None = None,
) -> Analysis:
    """Parse and check the rule files at `paths` (with `edits`, see `parse_files`), and
    compile them if that found no error. The catalog holds what could be checked even
    when some statements have errors (to explain what can be explained)."""
    paths = list(paths)
    access = Access.of([*paths, *(edits or {})], policy)
    statements, texts, errors = parse_files(paths, edits)
    catalog, check_errors = check_statements(statements, texts, access)
    errors.extend(check_errors)
    plan = None
    if not errors:
        plan, compile_errors = compile_catalog(catalog, texts, access)
        errors.extend(compile_errors)
    return Analysis(statements, catalog, plan, texts, errors)


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


def check_paths(
    paths: Iterable[str | Path],
    policy: RulePolicy = DEFAULT_POLICY,
    edits: Mapping[Path, str | None] | None = None,
) -> list[RuleError]:
    """All errors in the rule files at `paths` (files or folders), those of `edits`
    (see `parse_files`) among them: read and syntax errors, then those of the checks,
    then those of compiling."""
    return analyse(paths, policy, edits).errors


def load_rules(paths: Iterable[str | Path], policy: RulePolicy = DEFAULT_POLICY) -> RuleSet:
    """Parse, check and compile the rule files at `paths`; RuleCheckError if invalid.
    `policy` is what the installation lets them reach (`rules.language.access`)."""
    statements, catalog, plan, texts, errors = analyse(paths, policy)
    if errors or plan is None:
        raise RuleCheckError(errors)
    return RuleSet(tuple(statements), catalog, plan, texts)
