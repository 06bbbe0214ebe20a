"""Ground truth: every planted episode and every reading made late, duplicated or malformed.

One JSON object per line, each with a ``type``:

- ``run``: the simulator's arguments (first line);
- ``episode``: a planted episode (``kind`` says which; times as epoch ms);
- ``skew``: a source's constant clock skew in ms;
- ``speeding``: one reading of a planted speeding vehicle (``source``, ``seq``, ``speed``);
- ``late`` / ``duplicate`` / ``malformed``: one reading, named by ``source`` and ``seq``.

Scoring a run: alerts are matched against ``episode`` lines; loss is counted against
the readings sent minus ``malformed`` ones; ``duplicate`` lines say which copies a
deduplicating ingest must drop; ``late`` lines say which readings belong in
``late_readings``.
"""

from __future__ import annotations

from collections import Counter
from typing import IO

import orjson


class Truth:
    """Writes ground-truth records as JSON lines (or only counts them when ``path`` is None)."""

    def __init__(self, path: str | None) -> None:
        self._fh: IO[bytes] | None = open(path, "wb") if path else None  # noqa: SIM115
        self.counts: Counter[str] = Counter()

    def record(self, rec: dict) -> None:
        """Write one record; ``rec["type"]`` is counted for progress reports."""
        kind = rec["type"] if rec["type"] != "episode" else "episode:" + rec["kind"]
        self.counts[kind] += 1
        if self._fh is not None:
            self._fh.write(orjson.dumps(rec) + b"\n")

    def close(self) -> None:
        """Flush and close the file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_truth(path: str) -> list[dict]:
    """Load a ground-truth file."""
    with open(path, "rb") as fh:
        return [orjson.loads(line) for line in fh if line.strip()]
