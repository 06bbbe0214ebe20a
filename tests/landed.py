"""What the engine makes of landed files, without Spark: the engine's reader and its
pipeline over every file under a landing root, as one batch (for tests of ingest and
of hostile input that check where each landed line ends up)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from engine.core.pipeline import Conflict, LateReading, Pipeline
from engine.core.plan import Plan, StreamSchema
from engine.landed_files import QUARANTINE_FOLDER, read_quarantine_file, read_stream_file


@dataclass
class Judged:
    """Each source stream's accepted readings (dicts), the late readings, conflicts,
    duplicate and heartbeat counts per stream, and the quarantine rows."""

    readings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    late: list[LateReading] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    heartbeats: dict[str, int] = field(default_factory=dict)
    quarantine: list[dict[str, Any]] = field(default_factory=list)


def judge_landing(root: Path, streams: Sequence[StreamSchema]) -> Judged:
    """Read every landed file under `root` (in landing order) as the engine does and
    judge its readings with the engine's pipeline (no rules: sequencing only)."""
    schemas = {s.name: s for s in streams}
    arrivals: dict[str, list[pa.Table]] = {}
    quarantine: list[dict[str, Any]] = []
    for path in sorted(root.glob("stream=*/part-*.jsonl"), key=lambda p: (p.name, p.parent.name)):
        folder = path.parent.name.removeprefix("stream=")
        if folder == QUARANTINE_FOLDER:
            quarantine += read_quarantine_file(path.name, path.read_bytes())
            continue
        table, damaged = read_stream_file(schemas[folder], path.name, path.read_bytes())
        quarantine += damaged
        arrivals.setdefault(folder, []).append(table)
    result = Pipeline(Plan(dict(schemas))).process(
        {name: pa.concat_tables(tables) for name, tables in arrivals.items()}
    )
    return Judged(
        {name: table.to_pylist() for name, table in result.readings.items()},
        result.late,
        result.conflicts,
        result.duplicates,
        result.heartbeats,
        quarantine,
    )
