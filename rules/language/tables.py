"""Reference tables (`CREATE TABLE t (...) FROM CSV | DELTA 'path'`): their rows, loaded
once by the compiler into the plan (`engine.core.plan.LookupJoin`), so a stage shipped
to a Spark worker carries its table and needs no file access there.

A relative path is resolved against the folder of the rule file that declares the
table (`FROM CSV 'stations.csv'` in `rules/traffic.sql` reads `rules/stations.csv`).
Values are converted to the declared column types; an empty CSV field is NULL.
CSV is read with the `csv` module (header row = column names; extra columns are
ignored); Delta with the `deltalake` package (delta-rs), no Spark needed.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
        values = []
        for name, typ in columns.items():
            raw = record.get(name)
            if raw is None or raw == "":
                values.append(None)
                continue
            try:
                values.append(_CONVERT[typ](raw))
            except ValueError:
                raise TableLoadError(
                    f"{where(number)}: column '{name}' is {typ}, but the value is {raw!r}"
                ) from None
        rows.append(tuple(values))
    return tuple(rows)


def resolve(path: str, rule_file: str) -> Path:
    """The table's location: absolute as written, else relative to the rule file."""
    candidate = Path(path)
    return candidate if candidate.is_absolute() else Path(rule_file).parent / candidate


def load_table(fmt: str, path: Path, columns: Mapping[str, str]) -> tuple[Values, ...]:
    """The rows of a CSV file or Delta table, values in `columns` order and types."""
    if fmt == "CSV":
        try:
            with open(path, newline="", encoding="utf-8") as handle:
                reader = csv.DictReader(handle)
                missing = [c for c in columns if c not in (reader.fieldnames or ())]
                if missing:
                    raise TableLoadError(
                        f"'{path}' has no column {', '.join(repr(c) for c in missing)} "
                        f"(its header: {', '.join(reader.fieldnames or ()) or 'empty'})"
                    )
                # Line numbers count the header as line 1.
                return _convert(reader, columns, lambda n: f"{path}:{n + 2}")
        except OSError as exc:
            raise TableLoadError(f"cannot read '{path}': {exc.strerror}") from None
    # DELTA: imported here, so rule sets without Delta tables need no deltalake.
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(str(path)).to_pyarrow_table()
    except TableNotFoundError:
        raise TableLoadError(f"no Delta table at '{path}'") from None
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise TableLoadError(
            f"Delta table '{path}' has no column {', '.join(repr(c) for c in missing)} "
            f"(it has {', '.join(table.column_names)})"
        )
    return _convert(
        table.select(list(columns)).to_pylist(), columns, lambda n: f"{path} row {n + 1}"
    )
