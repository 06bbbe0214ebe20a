"""Helpers shared by the dashboard tests: what a page under AppTest shows."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest


def texts(app: AppTest) -> str:
    """Every markdown, caption, info, error and code text on the page, joined."""
    parts = [
        e.value
        for kind in ("markdown", "caption", "info", "error", "warning", "success", "code")
        for e in getattr(app, kind)
    ]
    return "\n".join(str(p) for p in parts)


def metrics(app: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in app.metric}
