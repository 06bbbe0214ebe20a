"""Durable landing: the hand-over point between ingest and the Spark job.

Layout under the landing root (one folder per stream, read by the engine as a file
stream with `stream` as a partition column):

    <root>/stream=<name>/part-<ns>-<ingester>-<n>.jsonl      readings and heartbeats
    <root>/stream=_quarantine/part-...jsonl                   rejected payloads

Every line is a JSON object carrying `_line` (its index in the file) so the engine can
rebuild the arrival order as (file name, line). Heartbeats sit among the readings of
their stream, marked `"_kind": "heartbeat"`, because where they fall in the arrival order
matters: they move the stream's watermark like a reading does. A file is written under a
dot-name (which Spark's file source ignores), fsynced, then renamed into place, so the
engine never sees half a file; only after the rename returns may ingest acknowledge the
MQTT messages it came from.
"""

from __future__ import annotations

import base64
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

QUARANTINE = "_quarantine"


class LandingWriter:
    """Buffers lines per stream and lands them atomically on `flush()`."""

    def __init__(self, root: str | os.PathLike[str], ingester_id: str) -> None:
        self.root = Path(root)
        self.ingester_id = ingester_id
        self._buffers: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._files_written = 0

    def __len__(self) -> int:
        return sum(len(lines) for lines in self._buffers.values())

    def add_reading(
        self, stream: str, reading: dict[str, Any], topic: str, received_ms: int
    ) -> None:
        """Queue one validated reading of `stream`."""
        self._buffers[stream].append({**reading, "_topic": topic, "_received_ms": received_ms})

    def add_heartbeat(self, stream: str, heartbeat: dict[str, Any], received_ms: int) -> None:
        """Queue a heartbeat: `stream` will see nothing older than heartbeat['ts']."""
        self._buffers[stream].append(
            {**heartbeat, "_kind": "heartbeat", "_received_ms": received_ms}
        )

    def add_rejection(self, topic: str, reason: str, payload: bytes, received_ms: int) -> None:
        """Queue a rejected payload for the quarantine table, raw bytes kept intact."""
        self._buffers[QUARANTINE].append(
            {
                "topic": topic,
                "reason": reason,
                "payload": payload.decode("utf-8", errors="replace"),
                "payload_b64": base64.b64encode(payload).decode("ascii"),
                "received_ms": received_ms,
            }
        )

    def flush(self) -> list[Path]:
        """Land everything buffered; returns the files written. Durable when it returns."""
        written: list[Path] = []
        for stream, lines in self._buffers.items():
            if not lines:
                continue
            folder = self.root / f"stream={stream}"
            folder.mkdir(parents=True, exist_ok=True)
            self._files_written += 1
            name = f"part-{time.time_ns():020d}-{self.ingester_id}-{self._files_written:08d}.jsonl"
            body = b"".join(
                orjson.dumps({**line, "_line": i}) + b"\n" for i, line in enumerate(lines)
            )
            tmp = folder / f".{name}.tmp"
            with open(tmp, "wb") as handle:
                handle.write(body)
                handle.flush()
                os.fsync(handle.fileno())
            final = folder / name
            os.replace(tmp, final)
            _fsync_dir(folder)
            written.append(final)
        self._buffers.clear()
        return written


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable: fsync the folder that holds the new name."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
