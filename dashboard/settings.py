"""Dashboard settings: the `[dashboard]`, `[health]`, `[rules]` and `[alertmanager]`
sections of lookout.toml (or of the file in `LOOKOUT_CONFIG`) with
`LOOKOUT_<SECTION>_<KEY>` environment overrides, the same way every Lookout part reads
its configuration. Read at each page run (a small file), so a changed setting applies
from the next refresh."""

from __future__ import annotations

from pathlib import Path

from dashboard.data import DataError
from lookout.config import (
    AlertmanagerConfig,
    Config,
    ConfigError,
    DashboardConfig,
    HealthConfig,
    load_config,
)
from rules.store import RuleStore


def _config() -> Config:
    try:
        return load_config()
    except ConfigError as exc:
        raise DataError(f"the configuration cannot be read: {exc}") from exc


def settings() -> DashboardConfig:
    """The dashboard's settings (see the module docstring)."""
    return _config().dashboard


def config() -> Config:
    """The whole configuration (the pages mostly need one section: see the others)."""
    return _config()


def health_limits() -> HealthConfig:
    """When the Health page turns red (`[health]`)."""
    return _config().health


def alertmanager() -> AlertmanagerConfig:
    """The Alertmanager incidents are routed through, where silences are made
    (`[alertmanager]`)."""
    return _config().alertmanager


def rule_store() -> RuleStore:
    """The user rule store the Rules page writes, with the library the engine loads
    beside it and what rules may reach, as configured (`[rules]`)."""
    config = _config()
    library = tuple(Path(path) for path in config.rules.paths)
    return RuleStore(Path(config.rules.user_path), library, config.rule_policy)
