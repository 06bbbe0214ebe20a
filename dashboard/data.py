"""Reading the lakehouse for the dashboard: Delta tables through delta-rs, health files.

Queries run in DataFusion (delta-rs's `QueryBuilder`) so a page aggregates a million
readings without loading them into pandas first. Results are cached per table version:
a refresh that finds no new commit costs one small metadata read per table.

The dashboard writes two tables itself, `alert_acks` and `incident_acks` (the alert's or
incident's id, acked_at, note, acked_by), so an acknowledgement survives restarts. They
are appended to and joined at read time: the engine merges `incidents` every batch, and
an acknowledgement written into that table would race its merges (one of the two
writers retrying, the engine's batch failing after its last retry).

The lakehouse is a local folder or an `s3://` prefix, reached as the configuration's
`[s3]` says (`lookout.storage`), like the engine that writes it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import pyarrow as pa
import streamlit as st
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from deltalake.exceptions import TableNotFoundError

from lookout.config import ConfigError, S3Config, load_config
from lookout.health import health_parts, read_health
from lookout.storage import delta_options, exists, is_object_store, list_names


@dataclass(frozen=True)
class AckTable:
    """A table of acknowledgements: its name, the table whose rows it acknowledges and
    the id column the two share."""

    name: str
    subject: str
    id_column: str

    @property
    def schema(self) -> pa.Schema:
        """Its columns: the id, when, the note, who."""
        return pa.schema(
            [
                (self.id_column, pa.string()),
                ("acked_at", pa.timestamp("us", tz="UTC")),
                ("note", pa.string()),
                ("acked_by", pa.string()),
            ]
        )


ALERT_ACKS = AckTable("alert_acks", "alerts", "alert_id")
INCIDENT_ACKS = AckTable("incident_acks", "incidents", "incident_id")


class DataError(Exception):
    """A table could not be read or written; the message is fit for the screen."""


def lakehouse() -> str:
    """The lakehouse: a folder or an s3:// URL (set by `lookout dashboard` / `lookout demo`)."""
    return os.environ.get("LOOKOUT_LAKEHOUSE_PATH", "./lakehouse").rstrip("/")


def _s3() -> S3Config:
    """How to reach an S3 lakehouse (the configuration's `[s3]`); unused for a folder,
    so a local lakehouse never reads the configuration for it."""
    if not is_object_store(lakehouse()):
        return S3Config()
    try:
        return load_config().s3
    except ConfigError as exc:
        raise DataError(f"the configuration cannot be read: {exc}") from exc


def storage() -> S3Config:
    """How to reach the lakehouse: the configuration's `[s3]` when it is on S3."""
    return _s3()


def _location(name: str) -> str:
    return f"{lakehouse()}/{name}"


def _options() -> dict[str, str] | None:
    return delta_options(lakehouse(), _s3())


# path -> (monotonic time last brought up to date, the open table or None if absent).
# Opening a table replays its log (tens of ms for a streaming table's hundreds of
# commits); an open table catches up by reading only the commits it has not seen.
# One lock: delta-rs tables are not meant to be updated and read from several sessions'
# threads at once.
_tables: dict[str, tuple[float, DeltaTable | None]] = {}
_tables_lock = threading.Lock()
VERSION_TTL_S = 0.5


def _table(name: str) -> DeltaTable | None:
    """The open Delta table, brought up to date at most every VERSION_TTL_S (call with
    `_tables_lock` held); None when it does not exist yet."""
    path = _location(name)
    now = time.monotonic()
    checked, table = _tables.get(path, (-VERSION_TTL_S, None))
    if now - checked < VERSION_TTL_S:
        return table
    s3 = _s3()
    if table is not None and not exists(f"{path}/_delta_log/{table.version():020d}.json", s3):
        table = None  # deleted, or recreated with a shorter log: open it afresh
    try:
        if table is None:
            table = DeltaTable(path, storage_options=delta_options(path, s3))
        else:
            table.update_incremental()
    except TableNotFoundError:
        table = None
    except Exception as exc:  # a half-written or unreadable log: say which table
        _tables.pop(path, None)
        raise DataError(f"cannot read the Delta table '{name}': {exc}") from exc
    _tables[path] = (now, table)
    return table


def table_version(name: str) -> int | None:
    """Current version of a Delta table (at most VERSION_TTL_S old), None when it does
    not exist yet."""
    with _tables_lock:
        table = _table(name)
        return None if table is None else table.version()


def _forget(name: str) -> None:
    """Make the next lookup of `name` read its log (after the dashboard wrote to it)."""
    with _tables_lock:
        _tables.pop(_location(name), None)


@st.cache_data(show_spinner=False, max_entries=256)
def _query(tables: tuple[tuple[str, str, int], ...], sql: str) -> pd.DataFrame:
    # The versions in `tables` are part of the cache key: a new commit means a new query.
    builder = QueryBuilder()
    options = _options()
    with _tables_lock:  # registering copies the table's snapshot
        for name, path, version in tables:
            _, table = _tables.get(path, (0.0, None))
            if table is None or table.version() != version:  # moved on meanwhile
                table = DeltaTable(path, version=version, storage_options=options)
            builder = builder.register(name, table)
    reader = pa.RecordBatchReader.from_stream(builder.execute(sql))
    return reader.read_all().to_pandas()


def query(sql: str, *tables: str) -> pd.DataFrame | None:
    """Run `sql` over the named tables; None when one of them does not exist yet."""
    versions = []
    for name in tables:
        version = table_version(name)
        if version is None:
            return None
        versions.append((name, _location(name), version))
    try:
        return _query(tuple(versions), sql)
    except Exception as exc:
        raise DataError(f"query over {', '.join(tables)} failed: {exc}") from exc


def sql_text(value: str) -> str:
    """`value` as a quoted SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def sql_time(when: datetime) -> str:
    """A UTC instant as a SQL timestamp literal DataFusion compares with Delta times."""
    return sql_text(when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))


def acknowledge(alert_ids: list[str], note: str, user: str) -> None:
    """Record that `user` acknowledged the alerts now, with a note."""
    _record_acks(ALERT_ACKS, alert_ids, note, user)


def acknowledge_incident(incident_id: str, note: str, user: str) -> None:
    """Record that `user` acknowledged the incident now, with a note."""
    _record_acks(INCIDENT_ACKS, [incident_id], note, user)


def _record_acks(acks: AckTable, ids: list[str], note: str, user: str) -> None:
    if not ids:
        return
    now = datetime.now(UTC)
    rows = pa.table(
        {
            acks.id_column: ids,
            "acked_at": [now] * len(ids),
            "note": [note] * len(ids),
            "acked_by": [user] * len(ids),
        },
        schema=acks.schema,
    )
    try:
        # "merge" adds `acked_by` to a table written before acknowledgements named anyone.
        write_deltalake(
            _location(acks.name),
            rows,
            mode="append",
            schema_mode="merge",
            storage_options=_options(),
        )
    except Exception as exc:
        raise DataError(f"could not record the acknowledgement: {exc}") from exc
    _forget(acks.name)  # the next read must see it


def health(part: str) -> dict[str, Any] | None:
    """The latest health record a running part wrote (`engine`, `ingest-0`, ...)."""
    return read_health(lakehouse(), part, _s3())


def ingest_parts() -> list[str]:
    """Names of the ingesters that wrote a health file (`ingest-0`, ...)."""
    return [part for part in health_parts(lakehouse(), _s3()) if part.startswith("ingest-")]


def table_names(prefix: str = "") -> list[str]:
    """Names of the lakehouse's Delta tables (folders with a `_delta_log`) starting with
    `prefix`, sorted."""
    root, s3 = lakehouse(), _s3()
    return [
        name
        for name in list_names(root, s3)
        if name.startswith(prefix) and list_names(f"{root}/{name}/_delta_log", s3)
    ]


def age_seconds(record: dict[str, Any] | None) -> float | None:
    """Seconds since a health record was written (None without a record)."""
    if not record or "updated_at_ms" not in record:
        return None
    return max(0.0, time.time() - record["updated_at_ms"] / 1000)


def delta_tables() -> pd.DataFrame:
    """Every Delta table of the lakehouse with its version and last commit time."""
    rows = []
    for name in table_names():
        try:
            with _tables_lock:
                table = _table(name)
                if table is None:
                    continue
                version, last = table.version(), table.history(1)[0].get("timestamp")
        except Exception:  # a table being created right now: skip it this refresh
            continue
        committed = pd.to_datetime(last, unit="ms", utc=True) if last else pd.NaT
        rows.append({"table": name, "version": version, "last commit": committed})
    return pd.DataFrame(rows, columns=["table", "version", "last commit"])


def alert_source() -> tuple[str, tuple[str, ...]]:
    """A SQL subquery of the alerts with `acked_at`, `note` and `acked_by` (NULL while
    open), and the tables it reads."""
    return _acknowledged(ALERT_ACKS)


def incident_source() -> tuple[str, tuple[str, ...]]:
    """A SQL subquery of the incidents with `acked_at`, `note` and `acked_by` (NULL while
    not acknowledged), and the tables it reads."""
    return _acknowledged(INCIDENT_ACKS)


def _acknowledged(acks: AckTable) -> tuple[str, tuple[str, ...]]:
    """`acks.subject`'s rows with their latest acknowledgement, and the tables read."""
    if table_version(acks.name) is None:
        return (
            "(SELECT *, CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS VARCHAR) AS note, "
            f"CAST(NULL AS VARCHAR) AS acked_by FROM {acks.subject})",
            (acks.subject,),
        )
    return (
        f"(SELECT a.*, k.acked_at, k.note, k.acked_by FROM {acks.subject} a LEFT JOIN "
        f"(SELECT {acks.id_column}, max(acked_at) AS acked_at, "
        "first_value(note ORDER BY acked_at DESC) AS note, "
        "first_value(acked_by ORDER BY acked_at DESC) AS acked_by "
        f"FROM {acks.name} GROUP BY {acks.id_column}) k USING ({acks.id_column}))",
        (acks.subject, acks.name),
    )
