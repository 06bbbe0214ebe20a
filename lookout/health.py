"""Health records: each long-running part writes `<lakehouse>/_health/<part>.json`
(engine, ingest-<id>); the demo and the dashboard read them. Written atomically, so a
reader never sees half a record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def health_path(lakehouse: str | Path, part: str) -> Path:
    """Where `part` (`engine`, `ingest-0`, ...) keeps its health record."""
    return Path(lakehouse) / "_health" / f"{part}.json"


def write_health(path: Path, record: dict[str, Any]) -> None:
    """Replace the record at `path` in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(orjson.dumps(record))
    tmp.replace(path)


def read_health(lakehouse: str | Path, part: str) -> dict[str, Any] | None:
    """The latest record `part` wrote, or None when it has written none yet."""
    try:
        return orjson.loads(health_path(lakehouse, part).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
