"""Dashboard settings from the environment (set by `lookout dashboard`)."""

from __future__ import annotations

import os

REFRESH_SECONDS = float(os.environ.get("LOOKOUT_DASHBOARD_REFRESH_SECONDS", "2"))
"""How often the live panels re-read the tables."""

SILENT_MINUTES = float(os.environ.get("LOOKOUT_DASHBOARD_SILENT_MINUTES", "5"))
"""A station with no reading for this long (in event time) shows as silent."""

CONGESTED_MINUTES = float(os.environ.get("LOOKOUT_DASHBOARD_CONGESTED_MINUTES", "15"))
"""A station with an open congestion alert this recent shows as congested."""

DOWN_AFTER_SECONDS = float(os.environ.get("LOOKOUT_DASHBOARD_DOWN_AFTER_SECONDS", "15"))
"""A part whose health file is older than this is shown as down."""
