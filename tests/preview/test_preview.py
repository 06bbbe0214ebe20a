"""The preview of a rule file over stored readings, against `lookout replay` over the
same readings cut at the stored watermark (an independent path: JSON lines, the
engine's replay runner, every stage of the rule set, run to +infinity) and against
what the readings plainly say."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from engine.alerts import iso_utc
from lookout.preview import Preview, PreviewError, parse_duration, preview
from lookout.replay import run_replay
from rules.language.loader import RULES_DIR, RuleCheckError
from tests.preview.history import END, RULE, T0, TIMESTAMPS, write_history

HOUR = 3_600_000


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    lakehouse = tmp_path / "lakehouse"
    return lakehouse, write_history(lakehouse)


def run(lakehouse: Path, text: str = RULE, since: int = HOUR, file: str = "mine.sql") -> Preview:
    return preview([RULES_DIR], lakehouse.parent / file, text, str(lakehouse), since)


def shown(row: dict[str, Any]) -> dict[str, Any]:
    """A preview alert's row as replay writes it (timestamps as ISO text)."""
    return {k: iso_utc(v) if k in TIMESTAMPS else v for k, v in row.items()}


def replayed(tmp_path: Path, rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    recording = tmp_path / "traffic.jsonl"
    recording.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    rule = tmp_path / "mine.sql"
    rule.write_text(RULE)
    out = tmp_path / "replay"
    assert run_replay([str(RULES_DIR), str(rule)], [f"traffic={recording}"], str(out)) == 0
    return {
        name: [orjson.loads(line) for line in (out / f"{name}.jsonl").read_bytes().splitlines()]
        for name in ("slow_minute", "crawl", "quiet")
    }


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def test_the_alerts_are_replays_cut_at_the_stored_watermark(
    history: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    lakehouse, rows = history
    result = run(lakehouse)
    assert result.end == END and result.start == END - HOUR
    assert result.rules == ("slow_minute", "crawl", "quiet")
    replay = replayed(tmp_path, rows)
    # The instant each replayed alert became final: its window's end, its reading's
    # time, its expiration (the newest reading plus the 2 minutes).
    final: dict[str, Callable[[dict[str, Any]], int]] = {
        "slow_minute": lambda r: ms(r["window_end"]),
        "crawl": lambda r: ms(r["ts"]) + 1,
        "quiet": lambda r: ms(r["last_reading"]) + 2 * 60_000,
    }
    for rule, when in final.items():
        mine = [shown(a.row) for a in result.alerts if a.rule == rule]
        assert mine == [r for r in replay[rule] if when(r) <= END], rule
        assert mine, f"{rule} raised something to compare"
    # The window that ends at minute 30 is final only at the stored watermark, past
    # the readings' own clock (their newest minus the slack).
    slow = [a for a in result.alerts if a.rule == "slow_minute"]
    assert shown(slow[-1].row)["window_end"] == iso_utc(T0 + 30 * 60_000)


def test_nothing_expires_because_the_history_ends(
    history: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Station 3 fell silent at minute 20, station 4 a minute before the end: only
    station 3 has been silent for 2 minutes by the watermark. Replayed to +infinity,
    every station falls silent at the end."""
    lakehouse, rows = history
    result = run(lakehouse)
    last = {r["station"]: r["ts"] for r in rows}
    silent = {s for s, ts in last.items() if ts + 2 * 60_000 < END}
    assert silent == {3}
    assert {a.key for a in result.alerts if a.rule == "quiet"} == {f"station={s}" for s in silent}
    quiet = [i for i in result.incidents if i["rule"] == "quiet"]
    assert [(i["key"], i["resolved_at"]) for i in quiet] == [("station=3", None)]
    assert {r["station"] for r in replayed(tmp_path, rows)["quiet"]} == {1, 2, 3, 4}


def test_incidents_and_counts_per_key(history: tuple[Path, list[dict[str, Any]]]) -> None:
    """Station 2 is slow in minutes 10-11 (an incident that resolved) and from minute 28
    on (an incident still firing at the end)."""
    result = run(history[0])
    slow = [i for i in result.incidents if i["rule"] == "slow_minute"]
    assert [(i["key"], i["opened_at"], i["resolved_at"] is None) for i in slow] == [
        ("station=2", T0 + 11 * 60_000, False),
        ("station=2", T0 + 29 * 60_000, True),
    ]
    assert slow[0]["reports"] == 2 and slow[1]["reports"] == 2
    summary = {(r["rule"], r["key"]): r for r in result.summary()}
    assert summary[("slow_minute", "station=2")] == {
        "rule": "slow_minute", "key": "station=2", "alerts": 4, "incidents": 2, "firing": 1
    }  # fmt: skip
    assert summary[("quiet", "station=3")]["firing"] == 1
    assert result.evaluate_s > 0


def test_only_the_asked_history_is_read(history: tuple[Path, list[dict[str, Any]]]) -> None:
    lakehouse, rows = history
    result = run(lakehouse, since=10 * 60_000)
    assert result.start == END - 10 * 60_000
    assert result.streams[0].readings == sum(r["ts"] >= result.start for r in rows)
    # State starts at the start: the slow minutes 10-11 are outside it.
    assert all(a.ts >= result.start for a in result.alerts)
    assert {i["opened_at"] for i in result.incidents if i["rule"] == "slow_minute"} == {
        T0 + 29 * 60_000
    }


def test_errors_are_located_and_nothing_runs(history: tuple[Path, list[dict[str, Any]]]) -> None:
    lakehouse, _ = history
    with pytest.raises(RuleCheckError) as caught:
        run(lakehouse, "CREATE ALERT x SEVERITY info AS SELECT nope FROM traffic;\n")
    assert [(e.line, e.col) for e in caught.value.errors] == [(1, 40)]
    assert caught.value.errors[0].file.endswith("mine.sql")


def test_the_sandbox_refuses_a_module_before_anything_runs(
    history: tuple[Path, list[dict[str, Any]]],
) -> None:
    sneaky = (
        "CREATE AGGREGATE boom(x DOUBLE) RETURNS DOUBLE LANGUAGE PYTHON AS 'os:system';\n"
        "CREATE ALERT x SEVERITY info AS SELECT station, boom(speed) OVER "
        "(PARTITION BY station ROWS 1 PRECEDING) AS b FROM traffic;\n"
    )
    with pytest.raises(RuleCheckError) as caught:
        run(history[0], sneaky)
    assert "module 'os' is refused" in caught.value.errors[0].message


def test_a_file_without_an_alert_or_a_lakehouse_without_readings(
    history: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    derived = "CREATE STREAM fast AS SELECT station, ts FROM traffic WHERE speed > 20;\n"
    with pytest.raises(PreviewError, match="defines no alert"):
        run(history[0], derived)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PreviewError, match="no stored readings"):
        run(tmp_path / "empty")


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90s", "15m", "1h", "2d", "30")] == [
        90_000, 900_000, HOUR, 2 * 86_400_000, 30_000
    ]  # fmt: skip
    with pytest.raises(ValueError):
        parse_duration("soon")
