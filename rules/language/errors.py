"""Located, plain-words errors in rule files."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from rules.language.ast import Pos


@dataclass(frozen=True)
class RuleError:
    """One problem in a rule file, at a line and column (both 1-based)."""

    file: str
    line: int
    col: int
    message: str
    source_line: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.message}"

    def format(self) -> str:
        """`file:line:col: message`, then the offending line and a caret under the column."""
        if not self.source_line:
            return str(self)
        # Keep tabs in the caret line so the caret lines up under tabbed source.
        pad = "".join("\t" if ch == "\t" else " " for ch in self.source_line[: self.col - 1])
        return f"{self}\n{self.source_line}\n{pad}^"


def named_by_file(errors: list[RuleError]) -> list[RuleError]:
    """`errors` naming their files without the folder, as the Rules page shows them."""
    return [replace(e, file=Path(e.file).name) for e in errors]


class RuleFileError(Exception):
    """Raised internally when a node is malformed beyond what the grammar catches."""

    def __init__(self, pos: Pos, message: str) -> None:
        super().__init__(message)
        self.pos = pos
        self.message = message


def source_lines(text: str) -> list[str]:
    """`text` cut into lines the way lark counts them: at `\\n` only (a `\\r` before it
    dropped). `str.splitlines` also cuts at `\\r`, form feeds, `\\x1c`-`\\x1e`, `\\x85` and
    `\\u2028`, which would show the wrong line under an error's line number."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def make_error(file: str, text: str, pos: Pos, message: str) -> RuleError:
    """Build a RuleError, copying the offending source line out of `text`."""
    lines = source_lines(text)
    source_line = lines[pos.line - 1] if 0 < pos.line <= len(lines) else ""
    return RuleError(file, pos.line, pos.col, message, source_line)
