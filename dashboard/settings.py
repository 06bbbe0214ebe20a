"""Dashboard settings: the `[dashboard]` section of lookout.toml (or the file in
`LOOKOUT_CONFIG`) with `LOOKOUT_DASHBOARD_<KEY>` environment overrides, the same way
every Lookout part reads its configuration. Read at each page run (a small file), so a
changed setting applies from the next refresh."""

from __future__ import annotations

from dashboard.data import DataError
from lookout.config import ConfigError, DashboardConfig, load_config


def settings() -> DashboardConfig:
    """The dashboard's settings (see the module docstring)."""
    try:
        return load_config().dashboard
    except ConfigError as exc:
        raise DataError(f"the configuration cannot be read: {exc}") from exc
