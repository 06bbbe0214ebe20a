"""Output rows handed on as they become final (`engine.core.output_order`): whatever the
batches and bounds, the rows handed on are every row once, in output order (event time,
stage, key in ``sort_key``'s order, the evaluator's own order; brute force from the
definition over Python rows), each handed on only below its sink's bound, and rows of
different layouts in runs of one layout each. A replay handing on its rows batch by batch
writes the rows of a run that keeps them to the end."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.output_order import STAGE, OutputOrder, Runs, row_columns
from engine.core.plan import Plan
from engine.core.replay import arrival_table, run_arrivals, sink_tables
from engine.core.runners import KEY, SEQ, TS, SinkRows, key_of
from engine.core.sequencer import sort_key
from rules.language.loader import load_rules

BASE = 1_767_225_600_000  # 2026-01-01T00:00:00Z

KEYS = ['["a"]', '["b"]', "[10]", "[9]", '[1, "x"]', "[]"]
# Layouts a sink's rows come in: a value column as floats, as ints, all NULL, and
# another column order.
LAYOUTS = ("float", "int", "null", "swapped")


@st.composite
def batches(draw: Any) -> list[tuple[list[SinkRows], dict[str, int]]]:
    """Batches of emitted parts, each with the bounds after it: a part emitted after a
    bound lies at or above it (what a stage advanced to a watermark emits)."""
    bound = {"out": 0, "alert": 0}
    seq = 0
    result = []
    for _ in range(draw(st.integers(1, 6))):
        parts = []
        for _ in range(draw(st.integers(0, 4))):
            sink = draw(st.sampled_from(sorted(bound)))
            rows = draw(st.integers(1, 6))
            ts = [bound[sink] + draw(st.integers(0, 12)) for _ in range(rows)]
            keys = [draw(st.sampled_from(KEYS)) for _ in range(rows)]
            seqs = list(range(seq, seq + rows))
            seq += rows
            layout = draw(st.sampled_from(LAYOUTS))
            values: dict[str, pa.Array] = {
                "float": pa.array([float(t) / 2 for t in ts]),
                "int": pa.array(ts, pa.int64()),
                "null": pa.nulls(rows),
                "swapped": pa.array([float(t) / 2 for t in ts]),
            }
            columns = {TS: pa.array(ts, pa.int64()), KEY: pa.array(keys), SEQ: pa.array(seqs)}
            if layout == "swapped":
                table = pa.table({"v": values[layout], **columns})
            else:
                table = pa.table({**columns, "v": values[layout]})
            parts.append(SinkRows(draw(st.integers(0, 3)), sink, table))
        for sink in bound:
            bound[sink] += draw(st.integers(0, 8))
        result.append((parts, dict(bound)))
    return result


def handed_rows(handed: Iterable[Runs]) -> dict[str, list[dict[str, Any]]]:
    """Each sink's rows handed on, one hand-over after another, as Python rows."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for runs in handed:
        for sink, ordered in runs.items():
            for table in ordered:
                rows.setdefault(sink, []).extend(table.to_pylist())
    return rows


def own_rows(tables: dict[str, pa.Table]) -> dict[str, list[dict[str, Any]]]:
    """Each sink's rows as Python rows of its own columns: what replay hands on as the
    rows become final."""
    return {sink: row_columns(table).to_pylist() for sink, table in tables.items()}


def brute_force(parts: list[SinkRows]) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {}
    for part in parts:
        for row in part.table.to_pylist():
            rows.setdefault(part.sink, []).append({**row, STAGE: part.stage})
    for listed in rows.values():
        listed.sort(key=lambda r: (r[TS], r[STAGE], sort_key(key_of(r[KEY])), r[SEQ]))
    return rows


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(batched=batches())
def test_rows_handed_on_are_every_row_once_in_output_order(
    batched: list[tuple[list[SinkRows], dict[str, int]]],
) -> None:
    order = OutputOrder()
    handed: dict[str, list[dict[str, Any]]] = {}
    for parts, bounds in batched:
        order.add(parts)
        for sink, ordered in order.finished(bounds).items():
            for table in ordered:
                assert all(ts < bounds[sink] for ts in table.column(TS).to_pylist())
                # One layout a run: its rows keep their own columns and types.
                assert table.schema.field("v").type in {pa.float64(), pa.int64(), pa.null()}
            handed.setdefault(sink, []).extend(handed_rows([{sink: ordered}])[sink])
    for sink, rows in handed_rows([order.finished()]).items():
        handed.setdefault(sink, []).extend(rows)
    assert order.held_rows == 0
    expected = brute_force([p for parts, _ in batched for p in parts])
    assert handed == expected


def test_a_sink_without_a_bound_keeps_its_rows() -> None:
    order = OutputOrder()
    table = pa.table({TS: [5], KEY: ["[]"], SEQ: [0]})
    order.add([SinkRows(0, "out", table), SinkRows(1, "other", table)])
    assert list(order.finished({"other": 6})) == ["other"]
    assert order.held_rows == 1
    assert list(order.finished({"out": 5})) == []
    assert list(order.finished({"out": 6})) == ["out"]


TWO_CLOCKS = """\
CREATE STREAM a (k INT, ts TIMESTAMP) ORDER BY ts SLACK 1 SECONDS SOURCE 'x/a/+';
CREATE STREAM b (k INT, ts TIMESTAMP) ORDER BY ts SLACK 1 SECONDS SOURCE 'x/b/+';
CREATE STREAM counts AS SELECT k, window_end, count(*) AS n FROM a [RANGE 2 SECONDS] GROUP BY k
  UNION ALL SELECT k, window_end, count(*) AS n FROM b [RANGE 2 SECONDS] GROUP BY k;
"""


@pytest.fixture(scope="module")
def two_clocks(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    path = tmp_path_factory.mktemp("rules") / "two.sql"
    path.write_text(TWO_CLOCKS)
    return load_rules([path]).plan


@st.composite
def two_streams(draw: Any) -> list[dict[str, pa.Table]]:
    """Readings of two streams with clocks of their own (b's behind a's by up to 20 s),
    interleaved in arrival order and cut into batches."""
    lag = draw(st.integers(0, 20_000))
    clocks = {"a": BASE + lag, "b": BASE}
    rows: list[tuple[str, dict[str, Any]]] = []
    for seq in range(draw(st.integers(1, 120))):
        stream = draw(st.sampled_from(["a", "b"]))
        clocks[stream] += draw(st.integers(0, 700))
        row = {"k": draw(st.integers(1, 3)), "ts": clocks[stream], "source": "g", "seq": seq}
        rows.append((stream, row))
    cuts = sorted(draw(st.sets(st.integers(1, max(len(rows) - 1, 1)), max_size=8)))
    bounds = [0, *cuts, len(rows)]
    batched = []
    for start, end in itertools.pairwise(bounds):
        by_stream: dict[str, list[dict[str, Any]]] = {}
        for stream, row in rows[start:end]:
            by_stream.setdefault(stream, []).append(row)
        batched.append(by_stream)
    return batched


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batched=two_streams())
def test_a_sink_of_two_clocks_is_handed_on_below_the_slower_one(
    two_clocks: Plan, batched: list[dict[str, list[dict[str, Any]]]]
) -> None:
    """Rows of a UNION ALL of two streams, one far behind the other: handed on batch by
    batch, the rows of the whole run in its order (a bound from the faster stream's
    clock would hand on rows the slower one's later rows belong before)."""

    def tables() -> list[dict[str, pa.Table]]:
        return [
            {s: arrival_table(two_clocks.streams[s], rows) for s, rows in batch.items()}
            for batch in batched
        ]

    expected = sink_tables(run_arrivals(two_clocks, tables()).emitted)
    assert expected is not None
    handed: list[Runs] = []
    run_arrivals(two_clocks, tables(), finished=handed.append)
    assert handed_rows(handed) == own_rows(expected)
