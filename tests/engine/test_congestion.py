"""The congestion rule end to end in the core (plan -> evaluator -> replay)."""

from __future__ import annotations

from engine.core.plan import SinkKind
from engine.core.replay import run
from tests.engine.helpers import MINUTE, congestion_plan

SECOND = 1_000
T0 = 1_700_000_040_000  # a whole minute of the epoch, so slots are [T0 + m min, T0 + (m+1) min)


def reading(station: int, minute: int, speed: float, seq: int, second: int = 30) -> tuple:
    """A traffic reading at ``second`` past minute ``minute`` after T0."""
    ts = T0 + minute * MINUTE + second * SECOND
    row = {"station": station, "lane": 1, "speed": speed, "length": 4.0, "ts": ts}
    return "traffic", {**row, "source": f"loop-{station}", "seq": seq}


def test_plan_fuses_the_alert_into_the_window_stage() -> None:
    (stage,) = congestion_plan().stages()
    assert stage.input == "traffic"
    assert stage.key == ("station",)
    assert [q.sink.name for q in stage.downstream] == ["congestion"]
    assert stage.downstream[0].sink.kind is SinkKind.ALERT


def test_congestion_fires_when_the_15_minute_average_drops_below_15() -> None:
    # Station 7: one reading per minute, 30 m/s for minutes 0-9, 5 m/s for minutes 10-19.
    # At minute 19 the frame [19:30 - 15 min, 19:30] holds minutes 4..19 (lower bound
    # included): (6 * 30 + 10 * 5) / 16 = 14.375 < 15. At minute 18: 255 / 16 = 15.94.
    # Station 8 stays at 30 m/s. Its readings arrive interleaved, 1 s out of order.
    readings = []
    for m in range(20):
        readings.append(reading(7, m, 30.0 if m < 10 else 5.0, seq=m))
        readings.append(reading(8, m, 30.0, seq=m, second=31))
    readings[::2], readings[1::2] = readings[1::2], readings[::2]
    result = run(congestion_plan(), readings)
    assert result.late == []
    speeds = [o for o in result.outputs if o.sink == "station_speed"]
    assert len(speeds) == 40  # one reading per 1-minute slot: every reading is a yield tuple
    alerts = [o for o in result.outputs if o.sink == "congestion"]
    assert [(a.ts, a.row) for a in alerts] == [
        (
            T0 + 19 * MINUTE + 30 * SECOND,
            {"station": 7, "ts": T0 + 19 * MINUTE + 30 * SECOND, "avg_speed": 14.375},
        )
    ]


def test_only_the_last_reading_of_each_minute_is_kept() -> None:
    readings = [reading(7, 0, 10.0, 0, second=5), reading(7, 0, 20.0, 1, second=50)]
    readings.append(reading(7, 1, 60.0, 2, second=0))
    outputs = [o for o in run(congestion_plan(), readings).outputs if o.sink == "station_speed"]
    assert [(o.ts - T0, o.row["avg_speed"]) for o in outputs] == [
        (50 * SECOND, 15.0),
        (MINUTE, 30.0),
    ]


def test_late_reading_is_set_aside_and_changes_nothing() -> None:
    # Slack is 2 s: after a reading at 0:30, the watermark is 0:28. 0:28 is on time
    # (exactly the slack behind), 0:27 is late.
    on_time = reading(7, 0, 10.0, 1, second=28)
    late = reading(7, 0, 99.0, 2, second=27)
    result = run(congestion_plan(), [reading(7, 0, 20.0, 0), on_time, late])
    assert [(r.stream, r.row["seq"], r.lateness_ms) for r in result.late] == [
        ("traffic", 2, 1 * SECOND)
    ]
    (out,) = [o for o in result.outputs if o.sink == "station_speed"]
    assert out.row["avg_speed"] == 15.0
