"""Health records: each long-running part writes `<lakehouse>/_health/<part>.json`
(engine, ingest-<id>); the demo and the dashboard read them. The lakehouse may be a local
folder or an `s3://` prefix (`lookout.storage`); either way a record is replaced whole,
so a reader never sees half of one."""

from __future__ import annotations

from typing import Any

import orjson

from lookout.config import S3Config
from lookout.storage import DEFAULT_S3, list_names, put_whole, read_whole

HEALTH_FOLDER = "_health"


def health_location(lakehouse: str, part: str) -> str:
    """Where `part` (`engine`, `ingest-0`, ...) keeps its health record."""
    return f"{str(lakehouse).rstrip('/')}/{HEALTH_FOLDER}/{part}.json"


def write_health(
    lakehouse: str, part: str, record: dict[str, Any], s3: S3Config = DEFAULT_S3
) -> None:
    """Replace `part`'s record in one rename (local) or one PUT (S3)."""
    put_whole(health_location(lakehouse, part), orjson.dumps(record), s3)


def read_health(lakehouse: str, part: str, s3: S3Config = DEFAULT_S3) -> dict[str, Any] | None:
    """The latest record `part` wrote, or None when it has written none yet."""
    data = read_whole(health_location(lakehouse, part), s3)
    try:
        return None if data is None else orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def health_parts(lakehouse: str, s3: S3Config = DEFAULT_S3) -> list[str]:
    """Names of the parts that wrote a record (`engine`, `ingest-0`, ...)."""
    folder = f"{str(lakehouse).rstrip('/')}/{HEALTH_FOLDER}"
    return [name[: -len(".json")] for name in list_names(folder, s3) if name.endswith(".json")]


def engine_running(record: dict[str, Any] | None, since_ms: int) -> bool:
    """Whether an engine record says its queries run, in a run started at or after
    `since_ms` (a record an earlier run left behind never counts)."""
    return bool(record and record.get("ready") and record.get("started_at_ms", 0) >= since_ms)
