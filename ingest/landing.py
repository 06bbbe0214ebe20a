"""Durable landing: the hand-over point between ingest and the Spark job.

Layout under the landing root (one folder per stream, read by the engine's landing
source, `engine/spark/landing_source.py`):

    <root>/stream=<name>/part-<ns>-<ingester>-<token>-<n>.jsonl   readings and heartbeats
    <root>/stream=_quarantine/part-...jsonl                      rejected payloads

Every line is a JSON object; the arrival order is (file name, line number). The
readings of one message are consecutive lines, and only the first carries the message's
`_topic` and `_received_ms` (the lines after it without them are of the same message):
a traffic reading's line is 115 bytes instead of 195, and half the work to land.
Heartbeats sit among the readings of their stream, marked `"_kind": "heartbeat"`,
because where they fall in the arrival order matters: they move the stream's watermark
like a reading does. A file is written under a dot-name (which the engine's source
ignores), fsynced, then renamed into place, so the engine never sees half a file; only
after the rename returns may ingest acknowledge the MQTT messages it came from. The root
may also be an object store (`ObjectStore`, `s3://bucket/prefix`): there each file is
one PUT of the whole object, same names.

Several ingesters may land into the same folders (shared subscriptions): a file name
holds the ingester id and a random token drawn when the writer is created, so neither two
ingesters nor two lives of one ingester (a restart within the same nanosecond clock
reading is unlikely, a restart with a clock stepped back is not) ever pick the same name.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import secrets
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from ingest.object_store import ObjectStore

STREAM_FOLDER = "stream="
"""The prefix of a stream's folder (``stream=<name>``)."""

QUARANTINE = "_quarantine"

#: How much of a rejected payload quarantine keeps by default (`[ingest]
#: quarantine_payload_bytes`): enough to see what was wrong, never a whole flood.
QUARANTINE_PAYLOAD_BYTES = 4096


def quarantine_record(
    topic: str | None, reason: str, payload: bytes, keep_bytes: int
) -> dict[str, Any]:
    """What quarantine stores of a rejected payload: its first `keep_bytes` bytes, its
    full size and SHA-256.

    The kept bytes are stored in one exact form: as text (`payload`) when they are UTF-8
    and JSON's escapes at most double them, else as base64 (`payload_b64`); the other
    is null. A cut that falls
    inside a UTF-8 character is moved back to before it, so text stays text.
    """
    kept = payload[:keep_bytes]
    try:
        text: str | None = kept.decode("utf-8")
    except UnicodeDecodeError as bad:
        cut_char = bad.reason == "unexpected end of data" and len(payload) > keep_bytes
        kept = kept[: bad.start] if cut_char else kept
        text = kept.decode("utf-8") if cut_char else None
    # NULs and control characters take six bytes each as JSON text: past twice the bytes
    # (quotes take two), base64's third more is the smaller.
    if text is not None and len(orjson.dumps(text)) > 2 * len(kept) + 2:
        text = None
    return {
        "topic": topic,
        "reason": reason,
        "payload": text,
        "payload_b64": None if text is not None else base64.b64encode(kept).decode("ascii"),
        "payload_bytes": len(payload),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
    }


class LandingWriter:
    """Buffers lines per stream and lands them atomically on `flush()`.

    Lines are serialised when added, a message's worth at a time (`json_lines`); a
    flush only joins bytes, writes and syncs.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | ObjectStore,
        ingester_id: str,
        quarantine_payload_bytes: int = QUARANTINE_PAYLOAD_BYTES,
    ) -> None:
        self.store = root if isinstance(root, ObjectStore) else None
        self.root = Path(root.base if isinstance(root, ObjectStore) else root)
        self.ingester_id = ingester_id
        self.quarantine_payload_bytes = quarantine_payload_bytes
        self._token = secrets.token_hex(3)
        self._chunks: dict[str, list[bytes]] = defaultdict(list)
        self._lines: dict[str, int] = defaultdict(int)
        self._files_written = 0

    def __len__(self) -> int:
        return sum(self._lines.values())

    def _add(self, stream: str, records: list[dict[str, Any]]) -> None:
        self._lines[stream] += len(records)
        self._chunks[stream].append(json_lines(records))

    def add_readings(
        self, stream: str, readings: list[dict[str, Any]], topic: str, received_ms: int
    ) -> None:
        """Queue the validated readings of one message (the dicts are taken over); the
        first line carries the message's topic and time of receipt for all of them."""
        if readings:
            readings[0]["_topic"] = topic
            readings[0]["_received_ms"] = received_ms
        self._add(stream, readings)

    def add_heartbeat(self, stream: str, heartbeat: dict[str, Any], received_ms: int) -> None:
        """Queue a heartbeat: `stream` will see nothing older than its timestamp."""
        self._add(stream, [{**heartbeat, "_kind": "heartbeat", "_received_ms": received_ms}])

    def add_rejection(self, topic: str, reason: str, payload: bytes, received_ms: int) -> None:
        """Queue a rejected payload for the quarantine table (see `quarantine_record`)."""
        record = quarantine_record(topic, reason, payload, self.quarantine_payload_bytes)
        record["received_ms"] = received_ms
        self._add(QUARANTINE, [record])

    def flush(self) -> list[Path]:
        """Land everything buffered; returns the files written. Durable when it returns."""
        written: list[Path] = []
        for stream in list(self._chunks):
            self._files_written += 1
            name = (
                f"{STREAM_FOLDER}{stream}/part-{time.time_ns():020d}"
                f"-{self.ingester_id}-{self._token}-{self._files_written:08d}.jsonl"
            )
            data = b"\n".join(self._chunks[stream]) + b"\n"
            if self.store is not None:
                written.append(Path(self.store.put(name, data)))
            else:
                written.append(_write_file(self.root / name, data))
            # Forget a stream's lines as soon as they are safe: if a later stream's file
            # fails, a retry of flush() does not land these again.
            del self._chunks[stream], self._lines[stream]
        return written

    def remove_orphans(self) -> list[Path]:
        """Delete half-written files a killed life of this ingester left behind.

        Their messages were never acknowledged, so the broker delivers them again; the
        files themselves are dot-names Spark never reads, only clutter.
        """
        removed: list[Path] = []
        if self.store is not None:
            return removed  # an object is whole or absent: nothing is left half-written
        for tmp in self.root.glob(f"{STREAM_FOLDER}*/.part-*-{self.ingester_id}-*.tmp"):
            # .part-<ns>-<id>-<token>-<n>.jsonl.tmp: the id may itself hold dashes
            ingester = tmp.name.split("-", 2)[2].rsplit("-", 2)[0]
            if ingester == self.ingester_id:
                try:
                    tmp.unlink(missing_ok=True)
                except OSError:  # a read-only disk: clutter, and no reason not to start
                    continue
                removed.append(tmp)
        return removed


def json_lines(records: list[dict[str, Any]]) -> bytes:
    """JSON lines (no final newline) for flat, non-empty objects, in one orjson call.

    orjson writes `[{...},{...}]`; the separators `},{"` become newlines. Inside a
    string every `"` is escaped, so `},{"` elsewhere needs a key or text value that
    ends in `},{` (the `"` is its closing quote); the records hold no nested objects
    (validated values are scalars). Counting the newlines after the replacement finds
    that case, and then each record is encoded on its own.

    The result is always a new bytes object, never orjson's output itself: keeping
    those buffered until a flush cost ten times their encoding (measured, one reading
    per message), apparently from the spare room orjson allocates.
    """
    body = orjson.dumps(records)[1:-1]  # a copy: orjson's own output keeps spare room
    if len(records) == 1:
        return body
    lines = body.replace(b'},{"', b'}\n{"')
    # orjson escapes newlines inside strings, so each raw one is a replacement made here.
    if lines.count(b"\n") == len(records) - 1:  # exactly the separators
        return lines
    return b"\n".join(map(orjson.dumps, records))


def _write_file(final: Path, data: bytes) -> Path:
    """Write `data` as `final` atomically and durably: dot-name, fsync, rename, fsync dir."""
    folder = final.parent
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{final.name}.tmp"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    except OSError:
        with contextlib.suppress(OSError):  # a full or read-only disk: leave no half file
            tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(folder)
    return final


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable: fsync the folder that holds the new name."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
