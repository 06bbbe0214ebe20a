"""What a rule set may reach beyond its own text: the files its reference tables name
and the Python modules its aggregates name.

Rules are written by operators (the dashboard's editor saves them), and checking a rule
reads the files and imports the modules it names, so both are bounded here:

- a table file (`FROM CSV`) must be a regular file inside the rule folders being loaded
  (symlinks resolved, so neither `..` nor a link leads out), of at most
  `max_table_bytes`; a Delta table (`FROM DELTA`) a folder inside them or inside one of
  `delta_roots` (the lakehouse);
- an aggregate's module (`LANGUAGE PYTHON AS 'module:Class'`) must be one of
  `python_modules` (or inside one of those packages), or a module whose file, and its
  packages' files, are inside the rule folders. Whether it is is found out the way the
  import system would find it, without importing anything.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path

LIBRARY_MODULES = ("rules.udas",)
"""The shipped library's aggregates, allowed unless the installation says otherwise."""
MAX_TABLE_BYTES = 16 * 1024 * 1024
"""The largest table file read by default: its rows travel inside the compiled plan."""


class AccessError(Exception):
    """A file or module a rule names and may not reach; the message says why and what
    would allow it, and never quotes the content of a file."""


@dataclass(frozen=True)
class RulePolicy:
    """What an installation lets its rules reach besides the files of their own folders
    (lookout.toml's `[rules]`)."""

    python_modules: tuple[str, ...] = LIBRARY_MODULES
    delta_roots: tuple[str, ...] = ()
    max_table_bytes: int = MAX_TABLE_BYTES


DEFAULT_POLICY = RulePolicy()
"""The shipped library's modules, tables inside the rule folders, the default size cap."""


@dataclass(frozen=True)
class Access:
    """What one rule set may reach: `folders` are its rule folders (resolved)."""

    folders: tuple[Path, ...]
    policy: RulePolicy

    @classmethod
    def of(cls, paths: Iterable[str | Path], policy: RulePolicy) -> Access:
        """The access of the rule files and folders at `paths` (a file's folder is its
        parent)."""
        folders = dict.fromkeys(
            (path if path.is_dir() else path.parent).resolve() for path in map(Path, paths)
        )
        return cls(tuple(folders), policy)

    def table_file(self, written: str, rule_file: str) -> Path:
        """The file `FROM CSV 'written'` in `rule_file` names, if a rule may read it."""
        path = _located(written, rule_file)
        if not _inside(path, self.folders):
            raise AccessError(
                f"'{written}' is outside the rule folders ({_listed(self.folders)}); a "
                "table file must be inside them"
            )
        return path

    def delta_folder(self, written: str, rule_file: str) -> Path:
        """The folder `FROM DELTA 'written'` in `rule_file` names, if a rule may read it."""
        path = _located(written, rule_file)
        lakehouses = tuple(
            Path(root).resolve() for root in self.policy.delta_roots if not _is_url(root)
        )
        if not _inside(path, self.folders + lakehouses):
            raise AccessError(
                f"'{written}' is neither inside the rule folders ({_listed(self.folders)}) "
                f"nor in the lakehouse ({_listed(lakehouses) or 'none on this disk'}); a "
                "Delta table must be in one of them"
            )
        if not path.is_dir():
            raise AccessError(f"no Delta table at '{written}' (not a folder)")
        return path

    def check_module(self, module: str) -> None:
        """Raise AccessError unless importing `module` for an aggregate is allowed (see
        the module docstring). Nothing is imported here."""
        if any(
            module == name or module.startswith(f"{name}.") for name in self.policy.python_modules
        ):
            return
        files = _import_files(module)
        if not all(file is not None and _inside(file, self.folders) for file in files):
            raise AccessError(
                f"module '{module}' is refused: it is outside the rule folders "
                f"({_listed(self.folders)}) and not in [rules] python_modules of lookout.toml; "
                f'to allow it, add "{module}" there (or to LOOKOUT_RULES_PYTHON_MODULES)'
            )


def _is_url(written: str) -> bool:
    return "://" in written


def _located(written: str, rule_file: str) -> Path:
    """`written` resolved (symlinks followed) against the folder of `rule_file`."""
    if _is_url(written):
        raise AccessError(f"'{written}' is a URL; a table is read from a path on this disk")
    path = Path(written)
    return (path if path.is_absolute() else Path(rule_file).parent / path).resolve()


def _inside(path: Path, folders: Iterable[Path]) -> bool:
    resolved = path.resolve()
    return any(resolved.is_relative_to(folder) for folder in folders)


def _listed(folders: Iterable[Path]) -> str:
    return ", ".join(str(folder) for folder in folders)


def _find_spec(name: str, search: list[str] | None) -> ModuleSpec | None:
    """The spec the import system would use for `name` (already imported: its own),
    asking the finders only: no module code runs."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__spec__", None)
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec(name, search) if find_spec else None
        if spec is not None:
            return spec
    return None


def _import_files(module: str) -> list[Path | None]:
    """The files importing `module` would run: each package's on the way and the
    module's own (a namespace package counts its folders; a module built into Python,
    having no file, is None). AccessError when the module cannot be found."""
    files: list[Path | None] = []
    search: list[str] | None = None
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        spec = _find_spec(".".join(parts[:depth]), search)
        locations = None if spec is None else spec.submodule_search_locations
        if spec is None or (depth < len(parts) and locations is None):
            raise AccessError(f"No module named '{module}'")
        if spec.has_location and spec.origin:
            files.append(Path(spec.origin))
        elif locations:
            files.extend(map(Path, locations))
        else:
            files.append(None)
        search = list(locations or ())
    return files
