"""Plan-building helpers for engine tests: what the rule compiler would produce."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.core.plan import (
    R2S,
    AggCall,
    Column,
    ColumnType,
    Expr,
    ExtentWindow,
    Filter,
    FrameUnits,
    OverWindow,
    Plan,
    Project,
    Query,
    Sink,
    SinkKind,
    StreamSchema,
)

MINUTE = 60_000


def col(name: str) -> Expr:
    """The expression ``name`` (a column reference)."""

    def read(row: Mapping[str, Any]) -> Any:
        return row[name]

    return read


def select(*names: str) -> Project:
    """``SELECT name, ...`` of plain columns."""
    return Project(tuple((n, col(n)) for n in names))


TRAFFIC = StreamSchema(
    "traffic",
    (
        Column("station", ColumnType.INT),
        Column("lane", ColumnType.INT),
        Column("speed", ColumnType.DOUBLE),
        Column("length", ColumnType.DOUBLE),
        Column("ts", ColumnType.TIMESTAMP),
    ),
    timestamp="ts",
    slack_ms=2_000,
    topic="lookout/traffic/+/readings",
)


def congestion_plan() -> Plan:
    """The congestion rule: station_speed (avg over 15 min sliding by 1 min) and its alert."""
    station_speed = StreamSchema(
        "station_speed",
        (
            Column("station", ColumnType.INT),
            Column("ts", ColumnType.TIMESTAMP),
            Column("avg_speed", ColumnType.DOUBLE),
        ),
        timestamp="ts",
    )
    window = OverWindow(
        aggregates=(AggCall("avg", (col("speed"),), "avg_speed"),),
        units=FrameUnits.RANGE,
        preceding=15 * MINUTE,
        partition_by=("station",),
        slide_ms=MINUTE,
    )
    queries = (
        Query(
            Sink("station_speed", SinkKind.STREAM),
            "traffic",
            window=window,
            post=(select("station", "ts", "avg_speed"),),
        ),
        Query(
            Sink("congestion", SinkKind.ALERT),
            "station_speed",
            pre=(Filter(lambda r: r["avg_speed"] is not None and r["avg_speed"] < 15),),
            post=(select("station", "ts", "avg_speed"),),
        ),
    )
    return Plan({"traffic": TRAFFIC, "station_speed": station_speed}, queries)


def over_plan(
    window: OverWindow,
    stream: StreamSchema = TRAFFIC,
    extra: tuple[str, ...] = (),
    r2s: R2S | None = None,
) -> Plan:
    """One OVER query over ``stream`` selecting ts, source, seq, the key, extras and
    aliases; with ``r2s``, a CQL relation query selecting the key and aliases only."""
    plain = (stream.timestamp or "ts", "source", "seq", *extra) if r2s is None else ()
    names = (*plain, *window.partition_by, *(c.alias for c in window.aggregates))
    post = Project(tuple((n, col(n)) for n in names))
    q = Query(Sink("out", SinkKind.STREAM), stream.name, window=window, post=(post,), r2s=r2s)
    return Plan({stream.name: stream}, (q,))


def extent_plan(
    window: ExtentWindow,
    stream: StreamSchema = TRAFFIC,
    r2s: R2S | None = None,
    bounds: bool = True,
    copies: bool = False,
) -> Plan:
    """One extent query selecting the group columns, the window bounds (if ``bounds``)
    and the aliases, with an optional relation-to-stream operator; with ``copies``, its
    projection says it copies them (as the compiler's does: results may leave as
    columns)."""
    names = (
        *window.group_by,
        *(("window_start", "window_end") if bounds else ()),
        *(c.alias for c in window.aggregates),
    )
    q = Query(
        Sink("out", SinkKind.STREAM),
        stream.name,
        window=window,
        post=(Project(tuple((n, col(n)) for n in names), names if copies else None),),
        r2s=r2s,
    )
    return Plan({stream.name: stream}, (q,))
