"""What a batch of the pipeline produced (:class:`BatchResult`), and the readings it set
aside with their reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from engine.core.incidents import IncidentUpdate
from engine.core.keycap import CappedReading
from engine.core.runners import SinkRows

Row = dict[str, Any]

HEARTBEAT = "heartbeat"
"""The column that marks a heartbeat among a stream's arrivals (true: only its
timestamp counts)."""


@dataclass(frozen=True)
class LateReading:
    """A reading below its stream's watermark (per source: below the higher of that and
    its source's clock): the reading, its stream, what it was judged against and how
    late."""

    stream: str
    row: Row
    ts: int
    watermark: int

    @property
    def lateness_ms(self) -> int:
        """How far below the watermark the reading was."""
        return self.watermark - self.ts


@dataclass(frozen=True)
class Conflict:
    """A reading whose id (source, epoch, seq) was seen before with other content (or
    with content no longer kept to compare): stored apart, never taken for a copy."""

    stream: str
    row: Row
    ts: int
    reason: str
    original_ts: int | None


@dataclass
class BatchResult:
    """What one batch produced, everything deterministic."""

    readings: dict[str, pa.Table] = field(default_factory=dict)
    late: list[LateReading] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    heartbeats: dict[str, int] = field(default_factory=dict)
    outputs: list[SinkRows] = field(default_factory=list)
    incidents: list[IncidentUpdate] = field(default_factory=list)
    """The incidents the batch changed, each in its state after the batch."""
    watermarks: dict[str, int] = field(default_factory=dict)
    """Each source stream's watermark after the batch."""
    capped: list[CappedReading] = field(default_factory=list)
    """On-time readings of new keys beyond their stream's cap, in arrival order."""


def reading_row(table: pa.Table, index: int) -> Row:
    """Row ``index`` of arrivals as a dict (no heartbeat flag; an empty epoch left out)."""
    return reading_rows(table, np.array([index], dtype=np.int64))[0]


def reading_rows(table: pa.Table, indexes: np.ndarray) -> list[Row]:
    """Rows ``indexes`` of arrivals as dicts, as :func:`reading_row` gives each."""
    rows = table.take(pa.array(indexes, pa.int64())).to_pylist()
    for row in rows:
        row.pop(HEARTBEAT, None)
        if not row.get("epoch"):
            row.pop("epoch", None)
    return rows
