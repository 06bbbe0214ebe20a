"""When health turns red, and why in words (`lookout.health`): recent figures from the
engine's running totals, each limit of `[health]` crossed or not, and the demo's status
line saying so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lookout.config import Config, HealthConfig
from lookout.demo import status_line
from lookout.health import RecentFigures, problems, write_health

NOW = 1_800_000_000_000
LIMITS = HealthConfig()  # 60 s window, shares 5 % (conflicts 1 %), 10 events, 60 s clock


def engine(*streams: dict[str, Any], quarantined: int = 0, **fields: Any) -> dict[str, Any]:
    """An engine record as `EngineJob.health` writes it, written now."""
    return {
        "updated_at_ms": NOW,
        "window_ms": 60_000,
        "recent_quarantined": quarantined,
        "streams": list(streams),
        **fields,
    }


def stream(name: str = "traffic", **recent: int) -> dict[str, Any]:
    """A stream of the engine's record: what arrived in the window (1,000 on time unless
    said), its clock moving."""
    return {
        "stream": name,
        "max_event_ms": NOW - 500,
        "recent": {"readings": 1_000, "late": 0, "duplicates": 0, "conflicts": 0, **recent},
        "clock_still_ms": 0,
        "arrived_while_still": 0,
    }


def reasons(*streams: dict[str, Any], quarantined: int = 0) -> list[str]:
    record = engine(*streams, quarantined=quarantined)
    return [p.text for p in problems({"engine": record}, LIMITS, 15, NOW)]


def test_recent_figures_count_the_last_window_only() -> None:
    recent = RecentFigures(window_ms=60_000)
    assert recent.window(0, {"duplicates.traffic": 0}) == (0, {"duplicates.traffic": 0})
    for second in range(2, 62, 2):
        span, counted = recent.window(second * 1000, {"duplicates.traffic": 100 * second})
    assert (span, counted) == (60_000, {"duplicates.traffic": 6_000})
    # 50,000 since the start, but only the last minute's 10 s of them count.
    for second in range(62, 500, 2):
        recent.window(second * 1000, {"duplicates.traffic": 6_100})
    span, counted = recent.window(510_000, {"duplicates.traffic": 7_100})
    assert span <= 62_000 and counted == {"duplicates.traffic": 1_000}


def test_a_stream_clock_standing_still_while_readings_arrive() -> None:
    recent = RecentFigures(window_ms=60_000)
    assert recent.clock("traffic", 0, 5_000, arrived=10) == (0, 0)
    assert recent.clock("traffic", 2_000, 6_000, arrived=20) == (0, 0)  # it moved
    assert recent.clock("traffic", 4_000, 6_000, arrived=50) == (2_000, 30)
    assert recent.clock("traffic", 90_000, 6_000, arrived=950) == (88_000, 930)
    assert recent.clock("traffic", 92_000, 6_001, arrived=960) == (0, 0)
    assert recent.clock("tags", 92_000, None, arrived=0) == (0, 0)  # no reading yet


def test_green_when_every_share_is_under_its_limit() -> None:
    assert reasons(stream(late=40, duplicates=40, conflicts=5), quarantined=40) == []
    # Fewer than min_events: one late reading of a quiet stream is no alarm.
    assert reasons(stream(readings=3, late=9)) == []


def test_red_names_the_stream_the_figure_and_the_limit() -> None:
    assert reasons(stream("traffic", readings=30, duplicates=50_000)) == [
        "stream traffic: 50,000 of the 50,030 readings that arrived in the last 60 s "
        "were duplicates (99.9 %; the limit is 5 %)"
    ]
    (late,) = reasons(stream("tag_readings", late=100))
    assert late.startswith("stream tag_readings: 100 of the 1,100 readings") and "late" in late
    (conflicts,) = reasons(stream(conflicts=20))
    assert "were conflicts (1.96 %; the limit is 1 %)" in conflicts
    (quarantine,) = reasons(stream(), quarantined=200)
    assert quarantine == (
        "quarantine: 200 of the 1,200 readings and payloads that arrived in the last 60 s "
        "were quarantined (16.7 %; the limit is 5 %)"
    )


def test_red_when_a_stream_clock_stops_while_readings_still_land() -> None:
    frozen = stream() | {"clock_still_ms": 95_000, "arrived_while_still": 1_234}
    (text,) = reasons(frozen)
    assert text.startswith("stream traffic: its clock (newest event time) has stood at 20")
    assert text.endswith("for 95 s while 1,234 readings arrived (the limit is 60 s)")
    # A stream that went silent is not a stopped clock: nothing arrives in the window.
    silent = frozen | {"recent": {"readings": 0}}
    assert reasons(silent) == []
    assert reasons(frozen | {"clock_still_ms": 50_000}) == []


def test_red_when_a_stream_cap_on_live_keys_quarantined_a_reading() -> None:
    """One reading kept from the rules is worth saying: no share, no minimum."""
    assert reasons(stream(capped=0)) == []
    capped = {**stream("tag_readings", capped=1), "max_live_keys": 200_000}
    assert reasons(capped) == [
        "stream tag_readings: 1 readings of new keys were quarantined in the last 60 s: a "
        "rule reading it holds state for max_live_keys = 200000 keys (the quarantine "
        "table names them)"
    ]


def test_red_when_a_part_is_down_or_cannot_land() -> None:
    stale = engine(stream(duplicates=900)) | {"updated_at_ms": NOW - 40_000}
    failing = {"updated_at_ms": NOW, "connected": False, "landing_failing_since_ms": NOW - 30_000}
    failing["last_error"] = "landing failed: [Errno 28] No space left on device"
    found = problems({"engine": stale, "ingest-0": failing, "ingest-1": None}, LIMITS, 15, NOW)
    assert [(p.subject, p.what) for p in found] == [
        ("engine", "down"),  # its old figures are not judged
        ("ingest-0", "broker"),
        ("ingest-0", "landing"),
    ]
    assert found[0].text == "engine is down: its last report is 40 s old"
    assert found[2].text.endswith(
        "for 30 s (nothing is acknowledged meanwhile): "
        "landing failed: [Errno 28] No space left on device"
    )


def test_the_demo_status_line_turns_red_with_the_reason(tmp_path: Path) -> None:
    config = Config(lakehouse=str(tmp_path))
    ingest = {"updated_at_ms": NOW, "connected": True, "readings": 50_735, "readings_per_s": 190}
    write_health(config.lakehouse, "ingest-0", ingest)
    write_health(config.lakehouse, "engine", engine(stream()))
    assert status_line(config, NOW) == (
        "ingest: 50735 readings landed, 0 quarantined, 190/s; health: ok"
    )
    write_health(config.lakehouse, "engine", engine(stream(readings=30, duplicates=50_705)))
    assert status_line(config, NOW).endswith(
        "190/s; health: RED: stream traffic: 50,705 of the 50,735 readings that arrived in "
        "the last 60 s were duplicates (99.9 %; the limit is 5 %)"
    )


def test_red_while_the_engine_refuses_a_change_of_the_rule_files() -> None:
    running = {"files": {"rules/traffic.sql": "3911f66dd4e9"}, "rejected": None}
    assert problems({"engine": engine(stream(), rules=running)}, LIMITS, 15, NOW) == []
    refused = {**running, "rejected": {"at_ms": NOW, "errors": ["a.sql:3:7: unknown column"]}}
    (problem,) = problems({"engine": engine(stream(), rules=refused)}, LIMITS, 15, NOW)
    assert problem.text == (
        "engine: the latest change of the rule files was refused (1 error(s), the first: "
        "a.sql:3:7: unknown column); it runs the last good rules"
    )
