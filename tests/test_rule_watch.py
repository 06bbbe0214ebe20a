"""The engine's rule watch: a changed rule set that passes the check is applied once, one
that fails is refused with its errors located, and a change that alters no rule applies
nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine.alerts import AlertSpec
from engine.core.plan import Plan
from lookout.config import Config, EngineConfig
from lookout.rule_watch import RuleWatch, stage_definitions, version, watch_rules
from lookout.services import alert_specs
from rules.language.loader import RuleCheckError
from tests.rules.helpers import TRAFFIC

SPEED = (
    "CREATE STREAM speed AS SELECT station, ts, "
    "avg(speed) OVER (PARTITION BY station ROWS 3 PRECEDING) AS v FROM traffic;\n"
)
SLOW = "CREATE ALERT slow SEVERITY warning AS SELECT station, ts, v FROM speed WHERE v < 5;\n"


class Engine:
    """What the watch hands rule sets to."""

    def __init__(self) -> None:
        self.applied: list[set[str]] = []

    def apply(self, plan: Plan, alerts: dict[str, AlertSpec]) -> None:
        self.applied.append(set(stage_definitions(plan)))


def watching(folder: Path, every_s: float) -> RuleWatch:
    config = Config(engine=EngineConfig(rules_poll_seconds=every_s))
    return watch_rules(config, [str(folder)], alert_specs)


def poll(watch: RuleWatch, engine: Engine) -> None:
    time.sleep(0.02)  # past the poll interval, and a new modification time
    watch.poll(engine.apply)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "traffic.sql").write_text(TRAFFIC + SPEED)
    return rules


def test_a_rule_set_that_passes_is_applied_once(folder: Path) -> None:
    watch = watch_rules(
        Config(engine=EngineConfig(rules_poll_seconds=0.01)), [str(folder)], alert_specs
    )
    engine = Engine()
    poll(watch, engine)
    assert engine.applied == [], "nothing changed"
    (folder / "alerts.sql").write_text(SLOW)
    poll(watch, engine)
    assert engine.applied == [{"speed", "slow!incidents"}]
    assert watch.status()["files"] == {
        str(folder / "alerts.sql"): version(SLOW),
        str(folder / "traffic.sql"): version(TRAFFIC + SPEED),
    }
    poll(watch, engine)
    assert len(engine.applied) == 1, "applied once"
    # A comment: the files changed, no rule did.
    (folder / "alerts.sql").write_text("-- why\n" + SLOW)
    poll(watch, engine)
    assert len(engine.applied) == 1
    assert watch.status()["files"][str(folder / "alerts.sql")] == version("-- why\n" + SLOW)


def test_a_rule_set_with_an_error_is_refused_and_the_last_good_one_runs(folder: Path) -> None:
    watch = watch_rules(
        Config(engine=EngineConfig(rules_poll_seconds=0.01)), [str(folder)], alert_specs
    )
    engine = Engine()
    (folder / "alerts.sql").write_text(SLOW.replace("v < 5", "nope < 5"))
    poll(watch, engine)
    assert engine.applied == []
    rejected = watch.status()["rejected"]
    assert rejected is not None
    (error,) = rejected["errors"]
    assert error.startswith(f"{folder / 'alerts.sql'}:1:") and "nope" in error
    assert set(watch.status()["files"]) == {str(folder / "traffic.sql")}, "the last good"
    # Fixed: applied, and the refusal is over.
    (folder / "alerts.sql").write_text(SLOW)
    poll(watch, engine)
    assert len(engine.applied) == 1 and watch.status()["rejected"] is None


def test_polling_off_and_an_engine_that_cannot_start(folder: Path) -> None:
    watch = watch_rules(
        Config(engine=EngineConfig(rules_poll_seconds=0)), [str(folder)], alert_specs
    )
    engine = Engine()
    (folder / "alerts.sql").write_text(SLOW)
    poll(watch, engine)
    assert engine.applied == []
    (folder / "traffic.sql").write_text("CREATE STREAM nope;")
    with pytest.raises(RuleCheckError):
        watch_rules(Config(), [str(folder)], alert_specs)


def test_a_poll_at_once_reads_a_change_before_the_interval(folder: Path) -> None:
    """A standby taking over reads the files the moment it runs, not a poll later."""
    watch = watching(folder, 3600.0)
    engine = Engine()
    (folder / "alerts.sql").write_text(SLOW)
    watch.poll(engine.apply)
    assert engine.applied == [], "not due for an hour"
    watch.poll(engine.apply, at_once=True)
    assert engine.applied == [{"speed", "slow!incidents"}]
