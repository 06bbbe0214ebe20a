"""The users' rule store: the one folder the dashboard and `lookout rules deploy` write
rule files into (the rule library beside it is read-only here), and how it writes them.

Every change (save, rename, disable, enable, delete) validates the file name itself,
takes the store's file lock (several dashboard sessions and processes may write at
once), checks the rule set as the engine would load it after the change, against the
files as they are under the lock, and only then writes: a new text through a temporary
file in the same folder, fsynced and renamed over the old one, so the engine never
reads half a file. Each change is appended to the store's change log with who made it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson

from rules.language.access import RulePolicy
from rules.language.errors import RuleError, named_by_file
from rules.language.loader import check_paths

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
DISABLED = ".sql.disabled"
"""The ending of a disabled rule file: kept in the store, not loaded (not `*.sql`)."""
LOCK = ".lock"
CHANGES = ".changes.jsonl"


class RuleNameError(ValueError):
    """A rule file name the store refuses; the message says why."""


@dataclass(frozen=True)
class Change:
    """One line of the change log: who did what to which file, and when (UTC)."""

    at: str
    user: str
    action: str
    file: str
    to: str = ""


@dataclass(frozen=True)
class RuleStore:
    """The store `folder`, the library folders loaded with it, and what rules may reach."""

    folder: Path
    library: tuple[Path, ...]
    policy: RulePolicy

    def rule_paths(self) -> list[Path]:
        """The rule set as the engine loads it: the library, then the store (once it
        exists)."""
        return [*self.library, *([self.folder] if self.folder.is_dir() else [])]

    def names(self) -> list[str]:
        """The store's rule files that are loaded, by name (without `.sql`)."""
        return sorted(p.stem for p in self.folder.glob("*.sql")) if self.folder.is_dir() else []

    def disabled(self) -> list[str]:
        """The store's disabled rule files, by name."""
        if not self.folder.is_dir():
            return []
        return sorted(p.name.removesuffix(DISABLED) for p in self.folder.glob(f"*{DISABLED}"))

    def text(self, name: str) -> str:
        """The text of the store's rule file `name` (enabled or disabled)."""
        path = self._file(name)
        return (path if path.exists() else self._disabled(name)).read_text(encoding="utf-8")

    def path(self, name: str) -> Path:
        """Where the store keeps `<name>.sql` (RuleNameError for a name it refuses)."""
        return self._file(name)

    def check(self, name: str, text: str) -> list[RuleError]:
        """The errors of the rule set with `<name>.sql` in the store holding `text`;
        nothing is written."""
        return self._check({self._file(name): text})

    def save(self, name: str, text: str, user: str) -> list[RuleError]:
        """Write `text` as `<name>.sql` if the rule set then checks clean; else its errors."""
        target = self._file(name)
        with self._locked():
            errors = self._check({target: text})
            if not errors:
                action = "saved" if target.exists() else "created"
                _write_atomically(target, text)
                self._log(user, action, target.name)
        return errors

    def rename(self, name: str, new: str, user: str) -> list[RuleError]:
        """Rename `<name>.sql` to `<new>.sql` if the rule set then checks clean."""
        source, target = self._file(name), self._file(new)
        with self._locked():
            if target.exists() or self._disabled(new).exists():
                raise RuleNameError(f"the store already has a rule file named `{new}`")
            errors = self._check({source: None, target: source.read_text(encoding="utf-8")})
            if not errors:
                source.rename(target)
                _sync_folder(self.folder)
                self._log(user, "renamed", source.name, target.name)
        return errors

    def disable(self, name: str, user: str) -> list[RuleError]:
        """Stop loading `<name>.sql` (kept as `<name>.sql.disabled`) if the rest of the
        rule set checks clean without it (no other rule reads what it declares)."""
        source, target = self._file(name), self._disabled(name)
        with self._locked():
            errors = self._check({source: None})
            if not errors:
                source.rename(target)
                _sync_folder(self.folder)
                self._log(user, "disabled", source.name)
        return errors

    def enable(self, name: str, user: str) -> list[RuleError]:
        """Load a disabled rule file again if the rule set checks clean with it."""
        source, target = self._disabled(name), self._file(name)
        with self._locked():
            errors = self._check({target: source.read_text(encoding="utf-8")})
            if not errors:
                source.rename(target)
                _sync_folder(self.folder)
                self._log(user, "enabled", target.name)
        return errors

    def delete(self, name: str, user: str) -> list[RuleError]:
        """Delete the rule file `name` (enabled: if the rest checks clean without it)."""
        enabled, disabled = self._file(name), self._disabled(name)
        with self._locked():
            errors = self._check({enabled: None}) if enabled.exists() else []
            if not errors:
                path = enabled if enabled.exists() else disabled
                path.unlink()
                _sync_folder(self.folder)
                self._log(user, "deleted", path.name)
        return errors

    def changes(self, limit: int = 100) -> list[Change]:
        """The newest `limit` changes, newest first."""
        try:
            lines = (self.folder / CHANGES).read_bytes().splitlines()
        except FileNotFoundError:
            return []
        return [Change(**orjson.loads(line)) for line in reversed(lines[-limit:])]

    # -- inside
    def _file(self, name: str) -> Path:
        """`<name>.sql` in the store, once `name` is known to be a plain file name that
        no library file has."""
        if not NAME.fullmatch(name):
            raise RuleNameError(
                f"`{name}` is not a rule file name: use up to 64 letters, digits and "
                "underscores, starting with a letter or underscore (no folders, no `.sql`)"
            )
        if any((folder / f"{name}.sql").exists() for folder in self.library):
            raise RuleNameError(
                f"`{name}.sql` is a file of the rule library, which is read-only here; "
                "choose another name"
            )
        return self.folder / f"{name}.sql"

    def _disabled(self, name: str) -> Path:
        return self._file(name).with_name(f"{name}{DISABLED}")

    def _check(self, edits: Mapping[Path, str | None]) -> list[RuleError]:
        return named_by_file(check_paths(self.rule_paths(), self.policy, edits))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the store's lock: one change at a time, across processes."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / LOCK, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield  # closing the file releases the lock

    def _log(self, user: str, action: str, file: str, to: str = "") -> None:
        change = Change(datetime.now(UTC).isoformat(timespec="seconds"), user, action, file, to)
        with open(self.folder / CHANGES, "ab") as log:
            log.write(orjson.dumps(change) + b"\n")
            log.flush()
            os.fsync(log.fileno())


def _write_atomically(target: Path, text: str) -> None:
    """Replace `target` by `text` whole: a unique temporary file beside it, fsynced, then
    renamed over it (and the folder fsynced, so the rename survives a crash)."""
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o644)  # readable by the engine, like a file written by hand
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _sync_folder(target.parent)


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
