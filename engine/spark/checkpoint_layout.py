"""Which layout a lakehouse's checkpoints have, so an incompatible one is refused with a
clear message instead of a Spark stack trace.

A query's checkpoint names the source it reads, that source's offsets and the state
variables its processor keeps. A Lookout version that changes any of them cannot resume
an earlier one's checkpoints: Spark stops the query, or the source cannot read the
offsets. The engine writes `<lakehouse>/_checkpoints/LAYOUT` when it starts on a
lakehouse without checkpoints, and refuses to start where the file says otherwise or is
missing beside existing checkpoints (those predate the file: layout 1).

Spark also fixes a query's state-store partitions in its checkpoint, whatever
`spark.sql.shuffle.partitions` says at a restart: :func:`checkpoint_partitions` reads
how many the engine query has.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs

from lookout.config import Config, S3Config
from lookout.storage import filesystem

CHECKPOINT_LAYOUT = 10
"""The layout this version writes: one engine query (`engine`) from the landing files to
every table, a group per connected part of the stream graph, each part's pipeline state
in two maps of LZ4-compressed values (`engine.spark.step`). Layout 9 stored the
values uncompressed; layout 8 kept a map per kind of entry; layout 7
had a query per connected part; layouts 1 to 6 a landing query and rules queries reading
Delta tables; none of them can be resumed by this version."""
CHECKPOINT_LAYOUT_CHANGE = (
    "one query runs sequencing and every rule from the landing files to the tables, a "
    "group per connected part of the rules, its state in two maps of compressed values"
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
        found: int | None = int(text)
    else:
        listing = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        queries = [Path(i.path).name for i in listing]
        found = (
            1
            if any(q == "landing" or q.startswith(("rules-", "engine-")) for q in queries)
            else None
        )
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


def checkpoint_partitions(checkpoint: str, s3: S3Config) -> int | None:
    """The state-store partitions of the query checkpointed at `checkpoint`: the
    `spark.sql.shuffle.partitions` its latest readable offset log entry records (Spark
    resumes with that count); None without one."""
    fs, root = filesystem(f"{checkpoint.rstrip('/')}/offsets", s3)
    try:
        listing = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except OSError:
        return None
    batches = sorted((int(i.base_name) for i in listing if i.base_name.isdigit()), reverse=True)
    for batch in batches:
        try:
            with fs.open_input_stream(f"{root}/{batch}") as f:
                lines = f.read().decode().splitlines()
            return int(json.loads(lines[1])["conf"]["spark.sql.shuffle.partitions"])
        except (OSError, ValueError, IndexError, KeyError, TypeError):
            continue  # a torn or foreign entry: an earlier one says the same
    return None
