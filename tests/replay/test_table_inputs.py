"""`lookout replay` from Delta tables and Parquet, and JSON lines read in chunks, against
the row-by-row replay of the same JSON lines (`read_readings` into `engine.core.replay.run`,
the path every other replay test pins).

Recordings are drawn with disorder within and beyond the slack, redeliveries (same id,
same values) and conflicts (same id, other values), readings with and without an id,
and end at +infinity, at the input's watermark or at a heartbeat at a drawn time. The
same readings as a Parquet folder (stored order, several files) and as a Delta table
(rows shuffled, arrival order in an `arrival` column) must give the same outputs, late
readings, incidents, duplicates and conflicts, however the input is cut into chunks and
batches; `--from`/`--until` the same as replaying only the lines a brute-force filter
keeps.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any
from unittest.mock import patch

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.alerts import iso_utc
from engine.core.pipeline import ARRIVAL_WATERMARK, Pipeline
from engine.core.plan import END_OF_TIME, Column, ColumnType, StreamSchema
from engine.core.replay import ReplayResult, ordered_outputs, run, run_arrivals
from ingest.validate import normalize_reading
from lookout import replay_inputs, replay_outputs
from lookout.cli import main
from lookout.replay import read_readings
from lookout.replay_inputs import Readings, TimeRange, parse_inputs
from lookout.replay_outputs import json_lines
from rules.language.loader import RULES_DIR, load_rules
from tests.examples import examples

PLAN = load_rules([RULES_DIR / "traffic.sql"]).plan
TRAFFIC = PLAN.streams["traffic"]
SLACK = TRAFFIC.slack_ms
BASE = 1_767_225_600_000  # 2026-01-01

Reading = dict[str, Any]


@st.composite
def recordings(draw: st.DrawFn) -> list[Reading]:
    """Readings in arrival order: event time moving on with disorder (some beyond the
    slack: late), some repeated (a redelivery, or a conflict with other values), some
    without `source`/`seq` (numbered by arrival) or `epoch`."""
    n = draw(st.integers(1, 60))
    readings: list[Reading] = []
    for i in range(n):
        if readings and draw(st.integers(0, 9)) == 0:
            again = dict(draw(st.sampled_from(readings)))
            if "seq" in again and draw(st.booleans()):
                again["speed"] = again["speed"] + 1.0  # same id, other values
            readings.append(again)
            continue
        jitter = draw(st.sampled_from([0, 0, 0, -500, -1_500, -2_000, -2_500, -6_000]))
        reading: Reading = {
            "station": draw(st.integers(1, 3)),
            "lane": draw(st.integers(1, 2)),
            "speed": draw(st.sampled_from([0.5, 9.75, 20.0, 31.25])),
            "length": draw(st.sampled_from([4.5, 12.0])),
            "ts": BASE + i * 20_000 + jitter,
        }
        if draw(st.integers(0, 3)):
            reading["source"] = f"station-{reading['station']}"
            reading["seq"] = i
            if draw(st.booleans()):
                reading["epoch"] = "e1"
        readings.append(reading)
    return readings


def write_jsonl(path: Path, readings: list[Reading]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in readings))
    return path


def as_table(readings: list[Reading], unit: str = "us") -> pa.Table:
    """The readings as a table, `ts` a TIMESTAMP in `unit` (UTC); missing ids NULL."""
    per_ms = {"ms": 1, "us": 1_000, "ns": 1_000_000}[unit]
    columns = {
        "station": pa.array([r["station"] for r in readings], pa.int32()),
        "lane": pa.array([r["lane"] for r in readings], pa.int64()),  # wider than INT
        "speed": pa.array([r["speed"] for r in readings], pa.float64()),
        "length": pa.array([r["length"] for r in readings], pa.float32()),
        "ts": pa.array([r["ts"] * per_ms for r in readings], pa.int64()).cast(
            pa.timestamp(unit, tz="UTC")
        ),
        "source": pa.array([r.get("source") for r in readings], pa.string()),
        "epoch": pa.array([r.get("epoch") for r in readings], pa.string()),
        "seq": pa.array([r.get("seq") for r in readings], pa.int64()),
    }
    return pa.table(columns)


def write_parquet(folder: Path, readings: list[Reading], files: int, unit: str) -> Path:
    """A folder of Parquet files whose stored order (files by name, rows as stored) is
    the arrival order."""
    folder.mkdir()
    table = as_table(readings, unit)
    size = -(-table.num_rows // files)
    for k, start in enumerate(range(0, table.num_rows, size)):
        pq.write_table(table.slice(start, size), folder / f"part-{k:03d}.parquet", row_group_size=7)
    return folder


def write_delta(folder: Path, readings: list[Reading], seed: int) -> Path:
    """A Delta table of the readings shuffled, in two commits, with `arrival`."""
    table = as_table(readings).append_column("arrival", pa.array(range(len(readings)), pa.int64()))
    order = list(range(table.num_rows))
    random.Random(seed).shuffle(order)
    shuffled = table.take(pa.array(order, pa.int64()))
    half = shuffled.num_rows // 2
    write_deltalake(str(folder), shuffled.slice(0, half), mode="append")
    write_deltalake(str(folder), shuffled.slice(half), mode="append")
    return folder


def reference(path: Path, end_at: int | None) -> ReplayResult:
    """The row-by-row replay of a JSON-lines file."""
    return run(PLAN, read_readings([((TRAFFIC,), path)]), end_at=end_at)


def replayed(
    spec: str, end_at: int | None, batch: int, window: TimeRange = replay_inputs.EVERYTHING
) -> ReplayResult:
    readings = Readings(parse_inputs([spec], PLAN), window, batch=batch)
    result = run_arrivals(PLAN, readings.batches(), end_at)
    result.outputs = ordered_outputs(result.emitted)
    return result


def assert_same(result: ReplayResult, expected: ReplayResult) -> None:
    assert result.outputs == expected.outputs
    assert result.late == expected.late
    assert result.incidents == expected.incidents
    assert result.conflicts == expected.conflicts
    assert result.duplicates == expected.duplicates
    assert result.closed == expected.closed


ENDS = st.sampled_from([END_OF_TIME, None, BASE + 10 * 20_000])


@pytest.mark.slow
@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    recordings(),
    ENDS,
    st.integers(1, 40),
    st.integers(60, 2_000),
    st.integers(1, 4),
    st.sampled_from(["ms", "us", "ns"]),
    st.integers(0, 1000),
    st.integers(1, 50),
)
def test_delta_and_parquet_give_what_the_same_json_lines_give(
    tmp_path_factory: pytest.TempPathFactory,
    readings: list[Reading],
    end_at: int | None,
    batch: int,
    chunk: int,
    files: int,
    unit: str,
    seed: int,
    piece: int,
) -> None:
    """... and a Parquet input read ``piece`` rows at a time (in stored order it is read
    piece by piece, not whole)."""
    folder = tmp_path_factory.mktemp("inputs")
    jsonl = write_jsonl(folder / "traffic.jsonl", readings)
    parquet = write_parquet(folder / "parquet", readings, files, unit)
    delta = write_delta(folder / "delta", readings, seed)
    expected = reference(jsonl, end_at)
    with patch.object(replay_inputs, "CHUNK_BYTES", chunk):
        assert_same(replayed(f"traffic={jsonl}", end_at, batch), expected)
    with patch.object(replay_inputs, "BATCH_READINGS", piece):
        assert_same(replayed(f"traffic={parquet}", end_at, batch), expected)
    assert_same(replayed(f"traffic={delta}", end_at, batch), expected)
    assert_same(replayed(str(delta), end_at, batch), expected)  # the table's columns name it


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(recordings(), ENDS, st.data())
def test_from_and_until_replay_the_readings_a_brute_force_filter_keeps(
    tmp_path_factory: pytest.TempPathFactory,
    readings: list[Reading],
    end_at: int | None,
    data: st.DataObject,
) -> None:
    # Bounds at a reading's time, a millisecond either side, or open.
    stamps = sorted({r["ts"] for r in readings})
    bound = st.one_of(
        st.none(),
        st.builds(lambda t, d: t + d, st.sampled_from(stamps), st.sampled_from([-1, 0, 1])),
    )
    start, end = data.draw(bound), data.draw(bound)
    window = TimeRange(start, end)
    kept = [
        r
        for r in readings
        if (start is None or r["ts"] >= start) and (end is None or r["ts"] < end)
    ]
    folder = tmp_path_factory.mktemp("window")
    expected = reference(write_jsonl(folder / "kept.jsonl", kept), end_at)
    jsonl = write_jsonl(folder / "all.jsonl", readings)
    parquet = write_parquet(folder / "parquet", readings, 2, "ms")
    delta = write_delta(folder / "delta", readings, 7)
    for spec in (f"traffic={jsonl}", f"traffic={parquet}", f"traffic={delta}"):
        assert_same(replayed(spec, end_at, 16, window), expected)


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_the_filter_given_to_the_reader_keeps_exactly_the_window(unit: str) -> None:
    """The pushed-down filter on stored timestamps of any unit (and on epoch-ms
    integers) keeps exactly the readings whose millisecond lies in the window."""
    rng = random.Random(unit)
    scale = {"s": 1 / 1000, "ms": 1, "us": 1_000, "ns": 1_000_000}[unit]
    stored = sorted(int((BASE + rng.randint(-5_000, 5_000)) * scale) for _ in range(400))
    table = pa.table({"ts": pa.array(stored, pa.int64()).cast(pa.timestamp(unit, tz="UTC"))})
    millis = replay_inputs._convert(table.column("ts"), TRAFFIC.column("ts").type).to_pylist()
    as_ms = pa.table({"ts": pa.array(millis, pa.int64())})
    for _ in range(200):
        low, high = sorted(BASE + rng.randint(-6_000, 6_000) for _ in range(2))
        window = TimeRange(low, high)
        for source, column in ((table, "ts"), (as_ms, "ts")):
            expression = replay_inputs._time_filter(
                source.schema.field(column).type, column, window
            )
            got = ds.dataset(source).to_table(filter=expression).num_rows
            assert got == sum(low <= m < high for m in millis), (unit, low, high)


# ---- tables that do not fit -------------------------------------------------------------

FITTING = [
    {"station": 1, "lane": 1, "speed": 20.0 + i, "length": 4.0, "ts": BASE + i * 1_000,
     "source": "station-1", "seq": i}
    for i in range(5)
]  # fmt: skip


def _set(name: str, array: pa.Array) -> Any:
    def change(table: pa.Table) -> pa.Table:
        if name in table.column_names:
            return table.set_column(table.column_names.index(name), name, array)
        return table.append_column(name, array)

    return change


MISFITS = {
    "missing column": (
        lambda t: t.drop_columns(["speed"]),
        "the table has no column 'speed' (stream traffic declares speed DOUBLE)",
    ),
    "text for a number": (
        _set("speed", pa.array(["20"] * 5)),
        "column 'speed' is string; stream traffic declares it DOUBLE: it needs a "
        "floating-point or integer column",
    ),
    "fraction for an INT": (
        _set("station", pa.array([1.0] * 5)),
        "column 'station' is double; stream traffic declares it INT: it needs an integer column",
    ),
    "time without zone": (
        _set("ts", pa.array([BASE * 1000] * 5, pa.int64()).cast(pa.timestamp("us"))),
        "column 'ts' is timestamp[us] (no time zone); stream traffic declares it TIMESTAMP",
    ),
    "NULL value": (
        _set("speed", pa.array([1.0, 2.0, None, 4.0, 5.0])),
        "reading 3 in arrival order: field 'speed' is null",
    ),
    "negative speed": (
        _set("speed", pa.array([1.0, -1.5, 3.0, 4.0, 5.0])),
        "reading 2 in arrival order: field 'speed' is negative (-1.5)",
    ),
    "not a number": (
        _set("speed", pa.array([1.0, 2.0, 3.0, float("nan"), 5.0])),
        "reading 4 in arrival order: field 'speed' is not a finite number",
    ),
    "a source too long": (
        # 256 two-byte characters pass (a byte count alone would refuse them); 257 do not.
        _set("source", pa.array(["é" * 256, "é" * 256, "é" * 257, "a", "a"])),
        "reading 3 in arrival order: field 'source' is 257 characters; the limit is 256",
    ),
    "beyond INT": (
        _set("lane", pa.array([3_000_000_000, 1, 1, 1, 1], pa.int64())),
        "reading 1 in arrival order: field 'lane' is out of the INT range (3000000000)",
    ),
    "text for seq": (
        _set("seq", pa.array(["1"] * 5)),
        "column 'seq' is string; a reading's seq needs an integer column",
    ),
    "text for arrival order": (
        _set("arrival", pa.array(["1"] * 5)),
        "column 'arrival' is string; arrival order needs integers or timestamps",
    ),
}


@pytest.mark.parametrize("kind", ["parquet", "delta"])
@pytest.mark.parametrize("misfit", list(MISFITS))
def test_a_table_that_does_not_fit_its_stream_is_refused_with_the_column_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, misfit: str
) -> None:
    change, message = MISFITS[misfit]
    table = change(as_table(FITTING))
    path = tmp_path / ("t.parquet" if kind == "parquet" else "t")
    if kind == "parquet":
        pq.write_table(table, path)
    else:
        write_deltalake(str(path), table)
    args = ["replay", "--rules", str(RULES_DIR / "traffic.sql"), "--out", str(tmp_path / "o")]
    assert main([*args, "--input", f"traffic={path}"]) == 2
    err = capsys.readouterr().err
    assert f"lookout replay: --input 'traffic={path}': {message}" in err
    assert not (tmp_path / "o").exists()


def test_a_misfit_value_in_a_later_piece_is_located_in_arrival_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Parquet file read 4 readings at a time: reading 11 is refused by its place in
    the whole input, and no output is left."""
    rows = [dict(FITTING[i % len(FITTING)], ts=BASE + i * 1_000, seq=i) for i in range(20)]
    rows[10] = dict(rows[10], speed=-1.5)
    path = tmp_path / "t.parquet"
    pq.write_table(as_table(rows), path)
    args = ["replay", "--rules", str(RULES_DIR / "traffic.sql"), "--out", str(tmp_path / "o")]
    with patch.object(replay_inputs, "BATCH_READINGS", 4):
        assert main([*args, "--input", f"traffic={path}"]) == 2
    err = capsys.readouterr().err
    assert f"--input 'traffic={path}': reading 11 in arrival order: field 'speed' is " in err
    assert not (tmp_path / "o").exists()


def test_late_readings_and_quarantine_files_are_written_only_when_there_are_any(
    tmp_path: Path,
) -> None:
    """JSON lines: a file per output (empty if it has no rows) and incidents always;
    late readings and quarantine only when a reading was set aside."""
    jsonl = write_jsonl(tmp_path / "t.jsonl", FITTING)
    args = ["replay", "--rules", str(RULES_DIR / "traffic.sql"), "--input", f"traffic={jsonl}"]
    assert main([*args, "--out", str(tmp_path / "o")]) == 0
    names = {p.name for p in (tmp_path / "o").iterdir()}
    assert {"incidents.jsonl", "lane_reports.jsonl", "accident.jsonl"} <= names
    assert not {"late_readings.jsonl", "quarantine.jsonl"} & names
    late = dict(FITTING[0], ts=BASE - 60_000, seq=99)
    jsonl = write_jsonl(tmp_path / "late.jsonl", [*FITTING, late])
    args[-1] = f"traffic={jsonl}"
    assert main([*args, "--out", str(tmp_path / "o2")]) == 0
    assert (tmp_path / "o2" / "late_readings.jsonl").read_bytes().count(b"\n") == 1


# ---- output formats ---------------------------------------------------------------------


def _recording() -> list[Reading]:
    """Station 3 slow for 20 minutes (congestion: an incident), the others not; a
    reading far out of order (late), a redelivery; 30 minutes."""
    readings: list[Reading] = []
    for i, ts in enumerate(range(BASE, BASE + 30 * 60_000, 10_000)):
        for station in (3, 4):
            speed = 9.5 if station == 3 and ts < BASE + 20 * 60_000 else 27.25
            readings.append({"station": station, "lane": 1 + i % 2, "speed": speed,
                             "length": 4.0 + i % 3, "ts": ts, "source": f"s{station}",
                             "seq": i})  # fmt: skip
    readings.insert(300, {**readings[10], "seq": 10_000})  # 24 minutes late
    readings.insert(330, dict(readings[329]))  # a redelivery
    return readings


def _text(value: Any) -> Any:
    return value.isoformat(timespec="milliseconds") if hasattr(value, "isoformat") else value


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as comparable: timestamps as replay's text, NULL columns left out."""
    return [{k: _text(v) for k, v in r.items() if v is not None} for r in rows]


def test_delta_and_parquet_outputs_hold_the_json_lines_rows(tmp_path: Path) -> None:
    """In the same order, the tables written 5 rows a row group."""
    from deltalake import DeltaTable

    recording = write_jsonl(tmp_path / "traffic.jsonl", _recording())
    base = ["replay", "--rules", str(RULES_DIR / "traffic.sql"), "--input", f"traffic={recording}"]
    for fmt in ("jsonl", "parquet", "delta"):
        with patch.object(replay_outputs, "_ROW_GROUP", 5):
            assert main([*base, "--out", str(tmp_path / fmt), "--format", fmt, "--quiet"]) == 0
    names = sorted(p.stem for p in (tmp_path / "jsonl").glob("*.jsonl"))
    assert {"late_readings", "incidents", "congestion", "station_speed"} <= set(names)
    assert sorted(p.stem for p in (tmp_path / "parquet").glob("*.parquet")) == names
    assert sorted(p.name for p in (tmp_path / "delta").iterdir()) == names
    for name in names:
        lines = (tmp_path / "jsonl" / f"{name}.jsonl").read_bytes().splitlines()
        expected = _rows([orjson.loads(x) for x in lines])
        parquet = pq.read_table(tmp_path / "parquet" / f"{name}.parquet")
        delta = DeltaTable(str(tmp_path / "delta" / name)).to_pyarrow_table()
        assert _rows(parquet.to_pylist()) == expected, name
        assert _rows(delta.to_pylist()) == expected, name
        if name in PLAN.streams:
            declared = {c.name: c.type for c in PLAN.streams[name].columns}
            for field in parquet.schema:
                if declared.get(field.name) == "TIMESTAMP":
                    assert field.type == pa.timestamp("us", tz="UTC"), (name, field)
    late = (tmp_path / "jsonl" / "late_readings.jsonl").read_bytes().splitlines()
    assert len(late) == 1 and orjson.loads(late[0])["seq"] == 10_000
    incidents = _rows(pq.read_table(tmp_path / "parquet" / "incidents.parquet").to_pylist())
    assert [(i["rule"], i["key"]) for i in incidents if i["rule"] == "congestion"] == [
        ("congestion", "station=3")
    ]


def test_a_delta_output_keeps_the_order_of_many_row_groups(tmp_path: Path) -> None:
    """70,000 lane reports written 1,000 rows a row group: the Delta table's rows in the
    Parquet file's order (delta-rs writing a stream of batches would reorder them)."""
    from deltalake import DeltaTable

    readings = [
        {"station": 1 + i % 7, "lane": 1, "speed": 20.0, "length": 4.0, "ts": BASE + i * 10,
         "source": "s", "seq": i}
        for i in range(70_000)
    ]  # fmt: skip
    recording = write_jsonl(tmp_path / "traffic.jsonl", readings)
    base = ["replay", "--rules", str(RULES_DIR / "traffic.sql"), "--input", f"traffic={recording}"]
    with patch.object(replay_outputs, "_ROW_GROUP", 1_000):
        for fmt in ("parquet", "delta"):
            assert main([*base, "--out", str(tmp_path / fmt), "--format", fmt, "--quiet"]) == 0
    parquet = pq.read_table(tmp_path / "parquet" / "lane_reports.parquet")
    delta = DeltaTable(str(tmp_path / "delta" / "lane_reports"))
    assert parquet.num_rows == 70_000
    assert delta.to_pyarrow_table().equals(parquet)
    assert delta.metadata().configuration["delta.enableDeletionVectors"] == "false"


# ---- a readings table the engine wrote -----------------------------------------------------


@settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(recordings(), ENDS, st.integers(1, 30), st.integers(0, 1000))
def test_a_readings_table_replays_to_the_rows_of_the_live_arrivals(
    tmp_path_factory: pytest.TempPathFactory,
    readings: list[Reading],
    end_at: int | None,
    batch: int,
    seed: int,
) -> None:
    """`readings_<stream>` holds the on-time readings with their `arrival_watermark`
    (Delta keeps no row order: here shuffled): sorted by it they are all on time again,
    and give every row, incident and final close the whole recording gave."""
    folder = tmp_path_factory.mktemp("lakehouse")
    expected = reference(write_jsonl(folder / "traffic.jsonl", readings), end_at)
    pipeline = Pipeline(PLAN)
    stored = []
    numbered = Readings(parse_inputs([f"traffic={folder / 'traffic.jsonl'}"], PLAN), batch=batch)
    for tables in numbered.batches():
        stored.append(pipeline.process(tables).readings["traffic"])
    table = pa.concat_tables(stored)
    micros = {
        name: pc.multiply(table.column(name), 1000).cast(pa.timestamp("us", tz="UTC"))
        for name in ("ts", ARRIVAL_WATERMARK)
    }
    table = table.drop_columns(["heartbeat"])
    for name, column in micros.items():
        table = table.set_column(table.column_names.index(name), name, column)
    order = list(range(table.num_rows))
    random.Random(seed).shuffle(order)
    write_deltalake(str(folder / "readings_traffic"), table.take(pa.array(order, pa.int64())))

    result = replayed(str(folder / "readings_traffic"), end_at, batch)
    assert result.late == [] and result.duplicates == {} and result.conflicts == []
    assert result.outputs == expected.outputs
    assert result.incidents == expected.incidents
    assert result.closed == expected.closed


# ---- JSON lines: Arrow's chunks and the per-line validation ---------------------------------


def test_lines_to_normalise_give_what_the_per_line_path_gives(tmp_path: Path) -> None:
    """Lines Arrow's reader would take otherwise (ISO-8601 times, 3.0 for an INT, an
    integer for a DOUBLE, a numeric epoch, blank lines) among plain ones: the chunks
    holding them go line by line, the others through Arrow, and the replay is the
    row-by-row one."""
    readings = _recording()
    lines = [orjson.dumps(r) for r in readings]
    lines[40] = orjson.dumps({**readings[40], "lane": float(readings[40]["lane"])})
    lines[81] = orjson.dumps({**readings[81], "speed": 27})
    iso = "2026-01-01T00:10:05.5+00:00"
    lines[120] = orjson.dumps({"station": 4, "lane": 2, "speed": 3, "length": 4, "ts": iso})
    lines[160] = orjson.dumps({**readings[160], "epoch": 7})
    lines[200] = b"   "
    assert b'"lane":1.0' in lines[40] and b'"speed":27,' in lines[81]
    recording = tmp_path / "traffic.jsonl"
    recording.write_bytes(b"\n".join(lines) + b"\n")
    expected = reference(recording, END_OF_TIME)
    with patch.object(replay_inputs, "CHUNK_BYTES", 2_000):
        assert_same(replayed(f"traffic={recording}", END_OF_TIME, 50), expected)


TAGS = StreamSchema(
    "tags",
    (Column("tagid", ColumnType.STRING), Column("door", ColumnType.STRING),
     Column("ts", ColumnType.TIMESTAMP)),
    "ts",
)  # fmt: skip
ID = (
    st.integers(-(2**70), 2**70)
    | st.text("abc-1", max_size=4)
    | st.floats(-1e20, 1e20, allow_nan=False)
    | st.booleans()
)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(ID, ID), min_size=1, max_size=12))
def test_ids_as_numbers_take_arrows_path_as_ingest_takes_them(ids: list[tuple[Any, Any]]) -> None:
    """STRING columns whose JSON values are numbers, text, or both: a chunk Arrow's
    reader takes holds what the per-line path (orjson, then ingest's validation) makes
    of each line, an integer id as its digits; any other chunk goes line by line. Ids
    all text, or all 64-bit integers, per column always take Arrow's path."""
    lines = [
        json.dumps({"tagid": tag, "door": door, "ts": BASE + i, "seq": i}).encode()
        for i, (tag, door) in enumerate(ids)
    ]
    data = b"\n".join(lines) + b"\n"
    fast = replay_inputs._fast_chunk(data, TAGS, len(lines))
    plain = all(
        all(isinstance(v, str) for v in column)
        or all(type(v) is int and -(2**63) <= v < 2**63 for v in column)
        for column in zip(*ids, strict=True)
    )
    assert fast is not None or not plain
    if fast is None:
        return
    names = ["tagid", "door", "ts", "seq"]
    want = [normalize_reading(TAGS, orjson.loads(x), require_identity=False) for x in lines]
    assert fast.select(names).to_pylist() == [{k: r[k] for k in names} for r in want]


def test_a_bad_line_is_located_in_its_file_whichever_chunk_holds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readings = _recording()
    lines = [orjson.dumps(r) for r in readings]
    lines[150] = orjson.dumps({**readings[150], "speed": None})
    recording = tmp_path / "traffic.jsonl"
    recording.write_bytes(b"\n".join(lines) + b"\n")
    args = ["replay", "--rules", str(RULES_DIR / "traffic.sql"), "--out", str(tmp_path / "o")]
    with patch.object(replay_inputs, "CHUNK_BYTES", 1_000):
        assert main([*args, "--input", f"traffic={recording}"]) == 2
    assert f"lookout replay: {recording}:151: field 'speed' is null" in capsys.readouterr().err


def test_progress_says_readings_rate_and_what_is_left(capsys: pytest.CaptureFixture[str]) -> None:
    progress = replay_inputs.Progress(every_s=0.0, out=sys.stderr)
    progress.started -= 10  # ten seconds in
    progress.done = 0.25
    progress.fed(50_000)
    assert capsys.readouterr().err == "replay: 50,000 readings, 5,000/s, 25%, ETA 30 s\n"
    progress.done = None
    progress.fed(10_000)
    assert capsys.readouterr().err.startswith("replay: 60,000 readings, 6,000/s\n")


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.none() | st.integers(-(2**63), 2**63 - 1),
            st.none()
            | st.floats(width=64)
            | st.floats(-1e-3, 1e-3)
            | st.integers(-99, 99).map(float),
            st.none() | st.text(),
            st.none() | st.booleans(),
            st.none() | st.integers(-8_600_000_000_000, 8_600_000_000_000),
        ),
        max_size=40,
    )
)
def test_rows_written_per_column_are_the_bytes_orjson_writes_per_row(
    rows: list[tuple[Any, ...]],
) -> None:
    """JSON lines are built per column (Arrow's text of numbers, quoted plain text, the
    ISO-8601 text of timestamps by arithmetic); each line must be the bytes the per-row
    writer (`orjson.dumps` of the row, timestamps by `iso_utc`) gives."""
    names = ["count", "value", "label", "flag", "ts"]
    table = pa.table(
        [pa.array([r[i] for r in rows], t)
         for i, t in enumerate([pa.int64(), pa.float64(), pa.string(), pa.bool_(), pa.int64()])],
        names=names,
    )  # fmt: skip
    stream = StreamSchema(
        "s", (Column("ts", ColumnType.TIMESTAMP), Column("value", ColumnType.DOUBLE)), "ts"
    )
    expected = b"".join(
        orjson.dumps(
            {**dict(zip(names, r, strict=True)), "ts": None if r[4] is None else iso_utc(r[4])},
            option=orjson.OPT_APPEND_NEWLINE,
        )
        for r in rows
    )
    assert b"".join(json_lines(table, stream)) == expected
