"""The running engine's rules: which are running, and changes to the rule files applied
while it runs.

:class:`RuleWatch` looks at the rule folders every `[engine] rules_poll_seconds`
(each file's size and modification time: a change of any file in them, a CSV table or
a UDA module included). A changed rule set is checked like `lookout rules check`; one
that passes is handed to the engine (`EngineJob.apply`), one that fails is not: the
engine keeps running its last good rules and says why, with each error's file, line
and column, in its log and on its health record (`rules`), which the dashboard's Health
and Rules pages and `lookout rules status` show.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.alerts import AlertSpec
from engine.core.plan import Plan
from engine.spark.rule_changes import definitions
from lookout.config import Config
from rules.language.loader import RuleCheckError, RuleSet, load_rules

log = logging.getLogger("lookout.engine")

Apply = Callable[[Plan, dict[str, AlertSpec]], None]
"""What runs a new rule set: the engine's `apply`."""


def version(text: str) -> str:
    """A rule file's version: the start of its text's SHA-256 (hex)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def stamps(paths: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Every file at `paths` (a folder's files, not hidden), with its size and
    modification time (ns): what changes when any of them is saved."""
    found: dict[str, tuple[int, int]] = {}
    for path in map(Path, paths):
        if not path.exists():
            continue
        files = sorted(path.iterdir()) if path.is_dir() else [path]
        for file in files:
            if file.name.startswith(".") or not file.is_file():
                continue
            with_stat = file.stat()
            found[str(file)] = (with_stat.st_size, with_stat.st_mtime_ns)
    return found


def stage_definitions(plan: Plan) -> dict[str, str]:
    """Every stage and incident tracker of `plan` by name, with its definition digest."""
    found = definitions(plan)
    found.update({i.name: i.definition for i in plan.incidents})
    return found


@dataclass
class RuleWatch:
    """The rule files an engine runs, watched for changes (see the module docstring)."""

    config: Config
    paths: Callable[[], Sequence[str]]
    """The rule files and folders, as of now (a rule store may be made later)."""
    load: Callable[[Sequence[str]], RuleSet]
    specs: Callable[[RuleSet], dict[str, AlertSpec]]
    running: RuleSet
    loaded_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    rejected: dict[str, Any] | None = None
    """The last rule set refused: when, and its errors (None: the files are running)."""
    _stamps: dict[str, tuple[int, int]] = field(default_factory=dict)
    _next: float = 0.0

    def __post_init__(self) -> None:
        self._stamps = stamps(self.paths())
        self._next = time.monotonic() + self.config.engine.rules_poll_seconds
        for file, text in sorted(self.running.texts.items()):
            log.info("rules: %s (version %s) loaded", file, version(text))

    def poll(self, apply: Apply, at_once: bool = False) -> None:
        """When due (or `at_once`) and the files changed: check them, and apply them if
        they pass."""
        every = self.config.engine.rules_poll_seconds
        if not at_once and (not every or time.monotonic() < self._next):
            return
        self._next = time.monotonic() + every
        paths = self.paths()
        now = stamps(paths)
        if now == self._stamps:
            return
        self._stamps = now
        try:
            rule_set = self.load(paths)
        except RuleCheckError as err:
            errors = [e.format() for e in err.errors]
            self.rejected = {"at_ms": int(time.time() * 1000), "errors": errors}
            log.error(
                "rules: the changed rule files have %d error(s); still running the last "
                "good rules:\n  %s",
                len(errors),
                "\n  ".join(errors),
            )
            return
        self.rejected = None
        self._changes(self.running, rule_set)
        before = (stage_definitions(self.running.plan), self.specs(self.running))
        if (stage_definitions(rule_set.plan), self.specs(rule_set)) == before:
            self.running = rule_set
            log.info("rules: the files changed, no rule did; nothing to apply")
            return
        began = time.monotonic()
        apply(rule_set.plan, self.specs(rule_set))
        self.running = rule_set
        self.loaded_at_ms = int(time.time() * 1000)
        log.info("rules: applied in %.1f s", time.monotonic() - began)

    def _changes(self, old: RuleSet, new: RuleSet) -> None:
        """Log each rule file added, edited or removed, and each stage."""
        for file in sorted(old.texts.keys() | new.texts.keys()):
            was, now = old.texts.get(file), new.texts.get(file)
            if was == now:
                continue
            what = "added" if was is None else "removed" if now is None else "edited"
            shown = version(now) if now is not None else version(was or "")
            log.info("rules: %s %s (version %s)", file, what, shown)
        old_stages, new_stages = stage_definitions(old.plan), stage_definitions(new.plan)
        for name in sorted(old_stages.keys() | new_stages.keys()):
            if name not in old_stages:
                log.info("rules: %r is new", name)
            elif name not in new_stages:
                log.info("rules: %r is removed", name)
            elif old_stages[name] != new_stages[name]:
                log.info("rules: %r is edited", name)

    def status(self) -> dict[str, Any]:
        """What the health record says of the rules: each running file's version, when
        they were applied, and the last refused change (None: none since)."""
        return {
            "files": {file: version(text) for file, text in sorted(self.running.texts.items())},
            "loaded_at_ms": self.loaded_at_ms,
            "rejected": self.rejected,
        }


def watch_rules(
    config: Config,
    paths: Sequence[str] | None,
    specs: Callable[[RuleSet], dict[str, AlertSpec]],
) -> RuleWatch:
    """A watch over the rules at `paths` (None: the configured library and rule store,
    the store watched even before it exists), loading them now (RuleCheckError if they
    have errors: the engine does not start)."""

    def where() -> Sequence[str]:
        return list(paths) if paths else list(config.rule_paths)

    def watched() -> Sequence[str]:
        return list(paths) if paths else [*config.rules.paths, config.rules.user_path]

    def load(_: Sequence[str]) -> RuleSet:
        return load_rules(where(), config.rule_policy)

    return RuleWatch(config, watched, load, specs, load(where()))
