"""Which layout a lakehouse's checkpoints have, so an incompatible one is refused with a
clear message instead of a Spark stack trace.

A rules query's checkpoint names the Delta tables it reads and the state variables its
processor keeps; the landing query's names the source it reads and that source's
offsets. A Lookout version that changes any of them cannot resume an earlier one's
checkpoints: Spark stops the query (`DIFFERENT_DELTA_TABLE_READ_BY_STREAMING_SOURCE`), or
the source cannot read the offsets. The engine writes `<lakehouse>/_checkpoints/LAYOUT`
when it starts on a lakehouse without checkpoints, and refuses to start where the file
says otherwise or is missing beside existing checkpoints (those predate the file:
layout 1).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs

from lookout.config import Config
from lookout.storage import filesystem

CHECKPOINT_LAYOUT = 6
"""6: a rules query's stateful groups are buckets of the keys of layout 5 (a stable
hash of the key modulo `packing.BUCKETS`), so a key's state is found by its bucket; each
evaluator is saved with its rule's definition digest. 5: a rules query's stateful groups
are the evaluators whose keys start with the same value (a station's), not one (stage,
key) each, so its state is keyed otherwise.
4: the rules queries' stateful step is PySpark's Row-based `transformWithState`, not
`transformWithStateInPandas` (Spark refuses to resume one's state as the other's:
`STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA`). 3: the landing query reads
Lookout's landing source (offsets name the backlog's files), not Spark's file source.
2: heartbeats in one table per stream, and a RANGE frame's tuples in a chunk map beside
each evaluator's head (state per change). 1: one `heartbeats` table."""
CHECKPOINT_LAYOUT_CHANGE = (
    "the rules queries keep their stations' state in hashed buckets, not one group per "
    "station, each evaluator with its rule's definition"
)


class CheckpointLayoutError(RuntimeError):
    """The lakehouse's checkpoints were written in another layout."""


def check_checkpoint_layout(config: Config) -> None:
    """Raise :class:`CheckpointLayoutError` if the lakehouse's checkpoints cannot be
    resumed by this version; mark a lakehouse without any as this version's."""
    location = config.table("_checkpoints")
    fs, root = filesystem(location, config.s3)
    marker = f"{root}/LAYOUT"
    if fs.get_file_info(marker).type == pafs.FileType.File:
        with fs.open_input_stream(marker) as f:
            text = f.read().decode(errors="replace").strip()
        if not text.isdigit():
            raise CheckpointLayoutError(
                f"{marker}: expected a layout number (this version writes "
                f"{CHECKPOINT_LAYOUT}), found {text!r}; it is not a file Lookout wrote"
            )
        found = int(text)
    else:
        listing = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        queries = [Path(i.path).name for i in listing]
        found = 1 if any(q == "landing" or q.startswith("rules-") for q in queries) else None
    if found is None:
        fs.create_dir(root, recursive=True)
        with fs.open_output_stream(marker) as f:
            f.write(f"{CHECKPOINT_LAYOUT}\n".encode())
        return
    if found != CHECKPOINT_LAYOUT:
        raise CheckpointLayoutError(
            f"{location} holds checkpoints of another Lookout version (layout {found}; "
            f"this version resumes layout {CHECKPOINT_LAYOUT}: {CHECKPOINT_LAYOUT_CHANGE}), so "
            f"its queries cannot resume them. Run this version on a new lakehouse (set "
            f"[lakehouse] path, or move {config.lakehouse} aside), or keep the version that "
            f"wrote it; `lookout replay` recomputes rule outputs from recorded readings."
        )
