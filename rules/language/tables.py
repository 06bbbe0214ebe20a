"""Reference tables (`CREATE TABLE t (...) FROM CSV | DELTA 'path'`): their rows, loaded
once by the compiler into the plan (`engine.core.plan.LookupJoin`), so a stage shipped
to a Spark worker carries its table and needs no file access there.

A relative path is resolved against the folder of the rule file that declares the
table (`FROM CSV 'stations.csv'` in `rules/traffic.sql` reads `rules/stations.csv`);
what a rule may read at all is `rules.language.access`'s to say. A table file is read
whole but bounded (`max_table_bytes`), and no error quotes its content.
Values are converted to the declared column types; an empty CSV field is NULL.
CSV is read with the `csv` module (header row = column names; extra columns are
ignored); Delta with the `deltalake` package (delta-rs), no Spark needed.
"""

from __future__ import annotations

import csv
import io
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rules.language.access import Access, AccessError
from rules.language.ast import CreateTable

Values = tuple[Any, ...]


class TableLoadError(Exception):
    """A reference table that cannot be read or whose values do not fit its columns."""


def _timestamp(value: Any) -> int:
    """Epoch ms from epoch ms, ISO-8601 text or a datetime (naive means UTC)."""
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        return int(moment.timestamp() * 1000)
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    return _timestamp(datetime.fromisoformat(text.replace("Z", "+00:00")))


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "t", "yes", "1"):
        return True
    if text in ("false", "f", "no", "0"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "INT": int,
    "BIGINT": int,
    "DOUBLE": float,
    "STRING": str,
    "BOOLEAN": _boolean,
    "TIMESTAMP": _timestamp,
}


def _convert(
    records: Iterable[Mapping[str, Any]], columns: Mapping[str, str], where: Callable[[int], str]
) -> tuple[Values, ...]:
    rows = []
    for number, record in enumerate(records):
        values: list[Any] = []
        for name, typ in columns.items():
            raw = record.get(name)
            if raw is None or raw == "":
                values.append(None)
                continue
            try:
                values.append(_CONVERT[typ](raw))
            except ValueError:
                # The value itself is not quoted: an error never shows a file's content.
                raise TableLoadError(
                    f"{where(number)}: column '{name}' is {typ}, but the value there is not one"
                ) from None
        rows.append(tuple(values))
    return tuple(rows)


def _read_text(path: Path, limit: int) -> str:
    """The text of a regular file of at most `limit` bytes. A device, FIFO or socket is
    refused before anything is read from it (it could block, or never end)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        handle = os.fdopen(os.open(path, flags), "rb")
    except OSError as exc:
        raise TableLoadError(f"cannot read '{path}': {exc.strerror}") from None
    with handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise TableLoadError(f"'{path}' is not a regular file")
        data = handle.read(limit + 1)  # the file may have grown since fstat
    if max(info.st_size, len(data)) > limit:
        raise TableLoadError(
            f"'{path}' is larger than the {limit:,} bytes a table file may have "
            "([rules] max_table_bytes in lookout.toml)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TableLoadError(f"'{path}' is not UTF-8 text (byte {exc.start})") from None


def _missing(columns: Iterable[str], have: Iterable[str]) -> str | None:
    """The declared columns the table lacks, quoted, or None."""
    missing = [c for c in columns if c not in set(have)]
    return ", ".join(repr(c) for c in missing) if missing else None


def _csv_rows(path: Path, columns: Mapping[str, str], limit: int) -> tuple[Values, ...]:
    reader = csv.DictReader(io.StringIO(_read_text(path, limit), newline=""))
    missing = _missing(columns, reader.fieldnames or ())
    if missing:
        raise TableLoadError(f"'{path}' has no column {missing} in its header row")
    # Line numbers count the header as line 1.
    return _convert(reader, columns, lambda n: f"{path}:{n + 2}")


def _delta_rows(path: Path, columns: Mapping[str, str], limit: int) -> tuple[Values, ...]:
    # Imported here, so rule sets without Delta tables need no deltalake.
    import pyarrow as pa
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(str(path))
    except TableNotFoundError:
        raise TableLoadError(f"no Delta table at '{path}'") from None
    size = sum(pa.table(table.get_add_actions(flatten=True)).column("size_bytes").to_pylist())
    if size > limit:
        raise TableLoadError(
            f"Delta table '{path}' has {size:,} bytes of data files, more than the {limit:,} "
            "a table may have ([rules] max_table_bytes in lookout.toml)"
        )
    data = table.to_pyarrow_table()
    missing = _missing(columns, data.column_names)
    if missing:
        raise TableLoadError(f"Delta table '{path}' has no column {missing}")
    return _convert(
        data.select(list(columns)).to_pylist(), columns, lambda n: f"{path} row {n + 1}"
    )


def load_table(stmt: CreateTable, columns: Mapping[str, str], access: Access) -> tuple[Values, ...]:
    """The rows of the CSV file or Delta table `stmt` names, values in `columns` order
    and types, if `access` lets its rule set read it."""
    try:
        if stmt.format == "CSV":
            path = access.table_file(stmt.path, stmt.file)
            return _csv_rows(path, columns, access.policy.max_table_bytes)
        path = access.delta_folder(stmt.path, stmt.file)
        return _delta_rows(path, columns, access.policy.max_table_bytes)
    except AccessError as exc:
        raise TableLoadError(str(exc)) from None
