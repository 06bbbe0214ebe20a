"""Where a replay's history ends: by default a heartbeat at +infinity closes every window
and fires every expiration; `--end-at watermark` ends at the input's own watermark
(nothing expires because the recording stops); `--end-at TIME` at a heartbeat at TIME.
Each is checked against a brute force over the recording: station 7 stops reporting
at minute 10 of 30, the nine others report every 10 s to the end."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from engine.core.plan import END_OF_TIME
from engine.core.replay import run
from lookout.cli import main
from rules.language.loader import RULES_DIR, load_rules

MINUTE = 60_000
SLACK = 2_000  # the traffic stream's
RANGE = 5 * MINUTE  # silent_detector's and segment_minmax's windows
READINGS = [
    {"station": station, "lane": 1, "speed": 20.0 + station, "length": 4.0, "ts": ts}
    for ts in range(0, 30 * MINUTE, 10_000)
    for station in range(1, 11)
    if station != 7 or ts <= 10 * MINUTE
]
LAST = {r["station"]: r["ts"] for r in READINGS}  # in time order: each station's last
WATERMARK = max(LAST.values()) - SLACK


def expected(end: int) -> dict[str, set[tuple[int, int]]]:
    """Brute force, for a history that ends at `end`: (station, event time) of every
    silent_detector alert (5 minutes after the station's last reading, once that instant
    is behind the end) and of every segment_minmax row (each whole minute e with a
    reading of the station in [e - 5 min, e), up to the end)."""
    silent = {(s, last + RANGE) for s, last in LAST.items() if last + RANGE < end}
    extents = {
        (r["station"], e)
        for r in READINGS
        for e in range((r["ts"] // MINUTE + 1) * MINUTE, r["ts"] + RANGE + 1, MINUTE)
        if e <= end
    }
    return {"silent_detector": silent, "segment_minmax": extents}


def replayed(end_at: int | None) -> tuple[dict[str, set[tuple[int, int]]], dict[str, int]]:
    """The replay's silent_detector and segment_minmax rows as (station, event time),
    and how many rows the final close produced per output."""
    plan = load_rules([RULES_DIR / "traffic.sql"]).plan
    result = run(plan, [("traffic", dict(r)) for r in READINGS], end_at=end_at)
    assert result.watermarks["traffic"] == WATERMARK
    rows: dict[str, set[tuple[int, int]]] = {"silent_detector": set(), "segment_minmax": set()}
    for out in result.outputs:
        if out.sink in rows:
            rows[out.sink].add((out.row["station"], out.ts))
    return rows, result.closed


def closed_by(end: int) -> Counter[str]:
    """Brute force: the rows past the input's watermark, which only the end produces."""
    return Counter(
        {sink: sum(ts > WATERMARK for _, ts in rows) for sink, rows in expected(end).items()}
    )


@pytest.mark.parametrize(
    ("end_at", "end"),
    [
        (END_OF_TIME, END_OF_TIME),
        (None, WATERMARK),
        (LAST[1] + 4 * MINUTE, LAST[1] + 4 * MINUTE),
    ],
    ids=["infinity", "watermark", "4 minutes after the last reading"],
)
def test_the_end_of_history_closes_what_a_heartbeat_there_would(
    end_at: int | None, end: int
) -> None:
    rows, closed = replayed(end_at)
    assert rows == expected(end)
    assert {sink: closed.get(sink, 0) for sink in rows} == closed_by(end)


def test_at_the_watermark_no_output_is_past_it_and_the_rest_is_the_default_run() -> None:
    plan = load_rules([RULES_DIR / "traffic.sql"]).plan
    readings = [("traffic", dict(r)) for r in READINGS]
    at_watermark = run(plan, readings, end_at=None)
    everything = run(plan, readings)
    assert at_watermark.closed == {}
    assert max(out.ts for out in at_watermark.outputs) <= WATERMARK
    assert at_watermark.outputs == [out for out in everything.outputs if out.ts <= WATERMARK]
    assert sum(everything.closed.values()) == len(everything.outputs) - len(at_watermark.outputs)


def test_the_summary_says_what_the_final_close_produced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recording = tmp_path / "traffic.jsonl"
    recording.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in READINGS))
    base = ["replay", "--rules", str(RULES_DIR / "traffic.sql"), "--input", f"traffic={recording}"]

    assert main([*base, "--out", str(tmp_path / "all")]) == 0
    err = capsys.readouterr().err
    assert "replay: ended at +infinity; the final close produced 72 output rows: " in err
    assert "segment_minmax 45, silent_detector 9, station_speed 9" in err
    silent = (tmp_path / "all" / "silent_detector.jsonl").read_bytes().splitlines()
    assert len(silent) == 10

    assert main([*base, "--out", str(tmp_path / "wm"), "--end-at", "watermark"]) == 0
    err = capsys.readouterr().err
    assert "replay: ended at the input's watermark; the final close produced no output rows" in err
    assert len((tmp_path / "wm" / "silent_detector.jsonl").read_bytes().splitlines()) == 1

    end = "1970-01-01T00:34:50+00:00"  # 5 minutes after the last reading: not past it
    assert main([*base, "--out", str(tmp_path / "t"), "--end-at", end]) == 0
    assert "ended at 1970-01-01T00:34:50.000+00:00; " in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "e"), "--end-at", "soon"]) == 2
    assert "lookout replay: --end-at: cannot parse timestamp" in capsys.readouterr().err
