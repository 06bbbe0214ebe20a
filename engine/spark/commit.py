"""A task's part of a batch: commit the files it wrote, exactly once, from the executor.

The stateful step writes each table's new rows as Parquet files in the table's folder
(`engine.spark.step`) and notes them; when the task has run every component it holds,
the processor's `close` adds each table's files in one Delta commit tagged with a
writer id and the batch id (Delta's transaction identifiers). Spark commits the task's
state only after that, so a batch that fails after its commits runs again from the
state before it, writes the same rows, finds its commits done and deletes the copies
instead. The incidents table is merged by incident id in the same way (one commit with
the writer's version): its rows are whole states, so the table holds each incident's
latest. A task's tables commit side by side (delta-rs works outside the GIL).

The commits run where the rows were made, not on the driver: on a cluster the driver's
part of a batch is then Spark's planning, offsets and the batch's figures, whatever the
rate.

**Writer ids.** Tasks of the same batch may write to the same table (the alerts of
parts on different state-store partitions), and a writer's version says which batches
it committed: so each partition is a writer of its own (`lookout-<query>-<table>-p<n>`).
Spark fixes a query's partitions in its checkpoint, so the ids stay the same across
restarts. An earlier Lookout committed every partition's files from the driver as one
writer (`lookout-<query>-<table>`); until a partition's writer has committed, that
writer's version stands for it, so a lakehouse it wrote goes on where it stopped, a
batch it committed just before it stopped included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from engine import tables
from engine.core.plan import Plan
from lookout.config import Config, S3Config


def table_schemas(plan: Plan, sources: tuple[str, ...]) -> dict[str, pa.Schema]:
    """Every table an engine query over `sources` may append to, with its schema."""
    schemas = dict(tables.SHARED)
    for name in sources:
        schemas[tables.readings_table(name)] = tables.readings_schema(plan.streams[name])
    for query in plan.queries:
        if query.sink.name in plan.streams:
            schemas[query.sink.name] = tables.derived_schema(plan.streams[query.sink.name])
    return schemas


def writer_id(query: str, table: str, partition: int) -> str:
    """The Delta transaction app id of the commits `query`'s tasks on state-store
    `partition` make to `table` (its version: the batch id)."""
    return f"{single_writer_id(query, table)}-p{partition}"


def single_writer_id(query: str, table: str) -> str:
    """The app id under which an earlier Lookout's driver committed every partition's
    files of `query` to `table`; the partitions' writers inherit its version."""
    return f"lookout-{query}-{table}"


class TaskCommits:
    """A Python worker's means to commit its tasks' files: the tables it keeps open
    between batches (`engine.tables.OpenTables`) and threads to commit them side by
    side."""

    def __init__(self, s3: S3Config) -> None:
        self.opened = tables.OpenTables(s3)
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="commit")

    def commit(
        self,
        config: Config,
        schemas: Mapping[str, pa.Schema],
        files: Mapping[str, Sequence[tables.DataFile]],
        writer: tuple[str, int],
        batch_id: int,
    ) -> None:
        """Add each table's `files` to it, or merge them into it (incidents), exactly
        once for the `writer` (query, partition) and `batch_id`. Raises the first failure
        (the task fails, and the batch runs again)."""
        jobs = [
            self._pool.submit(
                self._commit,
                config,
                table,
                schemas[table],
                found,
                writer,
                batch_id,
            )
            for table, found in sorted(files.items())
        ]
        for job in jobs:
            job.result()

    def _commit(
        self,
        config: Config,
        table: str,
        schema: pa.Schema,
        files: Sequence[tables.DataFile],
        writer: tuple[str, int],
        batch_id: int,
    ) -> bool:
        location = config.table(table)
        query, partition = writer
        app_id, inherits = writer_id(query, table, partition), single_writer_id(query, table)
        if table in tables.MERGED:
            key, update = tables.MERGED[table]
            return tables.merge_files(
                location,
                schema,
                files,
                key,
                update,
                app_id,
                batch_id,
                config.s3,
                self.opened,
                inherits,
            )
        return tables.commit_files(
            location, schema, files, app_id, batch_id, config.s3, self.opened, inherits
        )
