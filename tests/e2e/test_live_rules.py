"""A rule saved while the engine runs: applied without a restart, started warm.

The engine runs one rule (`kept`) over a first half of the readings, through a real
mosquitto and ingest. A rule file is then saved beside it, as the Rules editor saves
one: a new derived stream with a 30-second window and an alert on it. The engine's rule
watch checks the changed files and applies them to the running engine. The new stream's
table must then hold what `lookout replay` of all the rules gives over all the readings
(its windows were full at the deploy, and its past rows were written), its alerts only
those from the deploy on, and `kept` exactly the rows of an uninterrupted run. A second
save with an error is refused: the engine keeps running the last good rules and says
where the error is.
"""

from __future__ import annotations

import time

import pytest

from engine.spark.job import EngineJob
from lookout.rule_watch import watch_rules
from lookout.services import alert_specs
from tests.e2e.helpers import STREAM, messages, normalised, readings, replay
from tests.pipeline import delta_rows, publish, running_engine, running_ingest, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z
KEPT = (
    "CREATE STREAM kept AS SELECT station, ts, count(*) OVER "
    "(PARTITION BY station RANGE 1 MINUTE PRECEDING) AS n FROM traffic;\n"
)
ADDED = (
    "CREATE STREAM busy AS SELECT station, ts, max(speed) OVER "
    "(PARTITION BY station RANGE 30 SECONDS PRECEDING) AS top FROM traffic;\n"
    "CREATE ALERT fast SEVERITY warning AS SELECT station, ts, top FROM busy "
    "WHERE top > 40;\n"
)


def test_a_rule_saved_while_the_engine_runs_starts_warm_and_others_carry_on(
    spark, mosquitto, lookout_config, tmp_path, caplog
):
    first = readings(START, 0, 40)  # 20 s of readings
    second = readings(START + 30_000, 1_000, 40)
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "kept.sql").write_text(STREAM + KEPT)
    watch = watch_rules(lookout_config, [str(rules)], alert_specs)
    whole = replay(tmp_path, "whole", STREAM + KEPT + ADDED, first + second)
    caplog.set_level("INFO", logger="lookout.engine")
    with (
        running_ingest(lookout_config, watch.running),
        running_engine(lookout_config, watch.running, spark) as engine,
    ):
        engine.rules_status = watch.status
        publish(mosquitto, messages(first, START + 25_000))
        wait_for(lambda: len(delta_rows(lookout_config, "kept")) >= 120, 180, "kept", engine=engine)
        # A batch's tasks commit its rows before the batch ends and reports its figures.
        position = wait_for(lambda: watermark(engine), 30, "the stream's watermark")

        (rules / "added.sql").write_text(ADDED)
        saved = time.monotonic()
        wait_for(lambda: watch.poll(engine.apply) or "busy" in watch.running.plan.streams,
                 30, "the new rule applied")  # fmt: skip
        applied_s = time.monotonic() - saved
        # The warm start runs in the first batch after the deploy, once readings come.
        publish(mosquitto, messages(second, START + 200_000))
        wait_for(lambda: delta_rows(lookout_config, "busy"), 60, "busy's rows", engine=engine)
        first_output_s = time.monotonic() - saved
        wait_for(
            lambda: (
                len(delta_rows(lookout_config, "kept")) >= 240
                and len(delta_rows(lookout_config, "busy")) >= 240
            ),
            180,
            "every row of kept and busy",
            engine=engine,
        )
        # A save with an error: refused, the last good rules run on.
        (rules / "added.sql").write_text(ADDED.replace("top > 40", "nope > 40"))
        wait_for(lambda: watch.poll(engine.apply) or watch.rejected, 30, "the refusal")
        assert engine.health()["rules"]["rejected"]["errors"][0].startswith(
            f"{rules / 'added.sql'}:2:79: unknown column 'nope'"
        )
        assert engine.health()["rules"]["files"].keys() == {
            str(rules / "added.sql"),
            str(rules / "kept.sql"),
        }
        assert engine.failed() is None

    print(f"applied {applied_s:.1f} s after the save; first output after {first_output_s:.1f} s")
    stamps = {"ts"}

    def rows(name: str, columns: tuple[str, ...]) -> list[dict]:
        return [{k: r[k] for k in columns} for r in delta_rows(lookout_config, name)]

    assert normalised(rows("kept", ("station", "ts", "n")), stamps) == normalised(
        whole["kept"], stamps
    )
    # Warm: every row of the new stream, its past ones written at the deploy.
    assert normalised(rows("busy", ("station", "ts", "top")), stamps) == normalised(
        [{k: r[k] for k in ("station", "ts", "top")} for r in whole["busy"]], stamps
    )
    # Its alerts from the deploy on only (none for the past unless asked).
    got = sorted((r["key"], _ms(r["event_time"])) for r in delta_rows(lookout_config, "alerts"))
    expected = sorted(
        (f"station={a['station']}", _ms(a["ts"])) for a in whole["fast"] if _ms(a["ts"]) >= position
    )
    assert expected and len(expected) < len(whole["fast"]), "some alerts before, some after"
    assert got == expected
    said = [r.getMessage() for r in caplog.records if r.name == "lookout.engine"]
    assert any("busy (new)" in m and "warmed from" in m for m in said), said
    assert any("still running the last good rules" in m for m in said), said


def watermark(engine: EngineJob) -> int | None:
    """The traffic stream's watermark as the engine's health reports it (None before
    its first batch has ended)."""
    return next((s["watermark_ms"] for s in engine.health()["streams"]), None)


def _ms(value: object) -> int:
    """An alert's event time (a datetime from the table, text from replay) as epoch ms."""
    from datetime import datetime

    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() * 1000)
