"""Durable landing: the hand-over point between ingest and the Spark job.

Layout under the landing root (one folder per stream, read by the engine as a file
stream with `stream` as a partition column):

    <root>/stream=<name>/part-<ns>-<ingester>-<token>-<n>.jsonl   readings and heartbeats
    <root>/stream=_quarantine/part-...jsonl                      rejected payloads

Every line is a JSON object carrying `_line` (its index in the file) so the engine can
rebuild the arrival order as (file name, line). Heartbeats sit among the readings of
their stream, marked `"_kind": "heartbeat"`, because where they fall in the arrival order
matters: they move the stream's watermark like a reading does. A file is written under a
dot-name (which Spark's file source ignores), fsynced, then renamed into place, so the
engine never sees half a file; only after the rename returns may ingest acknowledge the
MQTT messages it came from.

Several ingesters may land into the same folders (shared subscriptions): a file name
holds the ingester id and a random token drawn when the writer is created, so neither two
ingesters nor two lives of one ingester (a restart within the same nanosecond clock
reading is unlikely, a restart with a clock stepped back is not) ever pick the same name.
"""

from __future__ import annotations

import base64
import os
import secrets
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

QUARANTINE = "_quarantine"


class LandingWriter:
    """Buffers lines per stream and lands them atomically on `flush()`.

    Lines are serialised when added (their `_line` is their index in the stream's
    buffer, which is their index in the file the next flush writes), so a flush only
    joins bytes, writes and syncs.
    """

    def __init__(self, root: str | os.PathLike[str], ingester_id: str) -> None:
        self.root = Path(root)
        self.ingester_id = ingester_id
        self._token = secrets.token_hex(3)
        self._buffers: dict[str, list[bytes]] = defaultdict(list)
        self._files_written = 0

    def __len__(self) -> int:
        return sum(len(lines) for lines in self._buffers.values())

    def _add(self, stream: str, line: dict[str, Any]) -> None:
        buffer = self._buffers[stream]
        line["_line"] = len(buffer)
        buffer.append(orjson.dumps(line))

    def add_reading(
        self, stream: str, reading: dict[str, Any], topic: str, received_ms: int
    ) -> None:
        """Queue one validated reading of `stream` (the dict is taken over and extended)."""
        reading["_topic"] = topic
        reading["_received_ms"] = received_ms
        self._add(stream, reading)

    def add_heartbeat(self, stream: str, heartbeat: dict[str, Any], received_ms: int) -> None:
        """Queue a heartbeat: `stream` will see nothing older than its timestamp."""
        self._add(stream, {**heartbeat, "_kind": "heartbeat", "_received_ms": received_ms})

    def add_rejection(self, topic: str, reason: str, payload: bytes, received_ms: int) -> None:
        """Queue a rejected payload for the quarantine table, raw bytes kept intact."""
        self._add(
            QUARANTINE,
            {
                "topic": topic,
                "reason": reason,
                "payload": payload.decode("utf-8", errors="replace"),
                "payload_b64": base64.b64encode(payload).decode("ascii"),
                "received_ms": received_ms,
            },
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
            name = (
                f"part-{time.time_ns():020d}-{self.ingester_id}-{self._token}"
                f"-{self._files_written:08d}.jsonl"
            )
            tmp = folder / f".{name}.tmp"
            with open(tmp, "wb") as handle:
                handle.write(b"\n".join(lines) + b"\n")
                handle.flush()
                os.fsync(handle.fileno())
            final = folder / name
            os.replace(tmp, final)
            _fsync_dir(folder)
            written.append(final)
        self._buffers.clear()
        return written

    def remove_orphans(self) -> list[Path]:
        """Delete half-written files a killed life of this ingester left behind.

        Their messages were never acknowledged, so the broker delivers them again; the
        files themselves are dot-names Spark never reads, only clutter.
        """
        removed = []
        for tmp in self.root.glob(f"stream=*/.part-*-{self.ingester_id}-*.tmp"):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
        return removed


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable: fsync the folder that holds the new name."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
