"""Reading the lakehouse for the dashboard: Delta tables through delta-rs, health files.

Queries run in DataFusion (delta-rs's `QueryBuilder`) so a page aggregates a million
readings without loading them into pandas first. Results are cached per table version:
a refresh that finds no new commit costs one small metadata read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import streamlit as st
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import TableNotFoundError


def lakehouse() -> Path:
    """The lakehouse folder (set by `lookout dashboard` / `lookout demo`)."""
    return Path(os.environ.get("LOOKOUT_LAKEHOUSE_PATH", "./lakehouse"))


def table_version(name: str) -> int | None:
    """Current version of a Delta table, None when it does not exist yet."""
    try:
        return DeltaTable(str(lakehouse() / name)).version()
    except TableNotFoundError:
        return None


@st.cache_data(show_spinner=False, max_entries=64)
def _query(path: str, name: str, version: int, sql: str) -> pd.DataFrame:
    # `version` is part of the cache key: a new commit means a fresh query.
    table = DeltaTable(path, version=version)
    result = QueryBuilder().register(name, table).execute(sql)
    return result.read_pandas()


def query(name: str, sql: str) -> pd.DataFrame | None:
    """Run `sql` (which names the table as `name`); None when the table is missing."""
    version = table_version(name)
    if version is None:
        return None
    return _query(str(lakehouse() / name), name, version, sql)


def health(part: str) -> dict[str, Any] | None:
    """The latest health record a running part wrote (`engine`, `ingest-0`, ...)."""
    path = lakehouse() / "_health" / f"{part}.json"
    try:
        return orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
