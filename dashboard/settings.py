"""Dashboard settings from the environment (set by `lookout dashboard`)."""

from __future__ import annotations

import os

REFRESH_SECONDS = float(os.environ.get("LOOKOUT_DASHBOARD_REFRESH_SECONDS", "2"))
