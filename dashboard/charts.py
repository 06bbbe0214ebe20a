"""Vega-Lite chart specs for the pages, written as plain dicts.

`st.vega_lite_chart` draws a dict directly; building the same charts with altair cost
its import (about 0.6 s on the first page a new server draws) and a schema walk on
every refresh. Time axes are shown in UTC, as their titles say, on a 24-hour clock like
the tables beside them (Vega's default labels hours on a 12-hour clock without am/pm).
"""

from __future__ import annotations

from typing import Any

Spec = dict[str, Any]
CLOCK = "%H:%M"
"""A time axis's labels: hours and minutes, 24-hour clock."""


def channel(field: str, kind: str, title: str | None = None, **extra: Any) -> Spec:
    """One encoding channel; `kind` is a Vega-Lite type (temporal, quantitative, ...)."""
    spec: Spec = {"field": field, "type": kind, **extra}
    if title is not None:
        spec["title"] = title
    if kind == "temporal":  # a UTC scale labels the axis in UTC, not the browser's zone
        spec.setdefault("scale", {"type": "utc"})
        spec.setdefault("axis", {"format": CLOCK})
    return spec


def chart(
    mark: str | Spec, x: Spec, y: Spec, color: Spec | None = None, tooltip: list[Spec] | None = None
) -> Spec:
    """A one-layer chart: `mark` (bar, line, ...) with x, y and optional colour."""
    encoding: Spec = {"x": x, "y": y}
    if color is not None:
        encoding["color"] = color
    if tooltip:
        encoding["tooltip"] = tooltip
    return {"mark": mark if isinstance(mark, dict) else {"type": mark}, "encoding": encoding}


def with_threshold(spec: Spec, value: float) -> Spec:
    """`spec` with a dashed red horizontal line at y = `value`."""
    rule = {
        "mark": {"type": "rule", "strokeDash": [4, 4], "color": "red"},
        "encoding": {"y": {"datum": value}},
    }
    return {"layer": [spec, rule]}


def tip(field: str, kind: str, **extra: Any) -> Spec:
    """A tooltip entry; times are shown in UTC."""
    if kind == "temporal":
        extra = {"format": "%Y-%m-%d %H:%M:%S", "formatType": "utc", **extra}
    return {"field": field, "type": kind, **extra}
