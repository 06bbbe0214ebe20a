"""`lookout rules status` and `deploy`: each rule file's version on disk beside the one the
engine's health record says it runs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lookout.config import Config, RulesConfig
from lookout.health import write_health
from lookout.rule_status import PENDING, REFUSED, REMOVED, RUNNING, deploy, print_status, status
from lookout.rule_watch import version
from tests.rules.helpers import TRAFFIC

SLOW = (
    "CREATE STREAM speed AS SELECT station, ts, avg(speed) OVER "
    "(PARTITION BY station ROWS 3 PRECEDING) AS v FROM traffic;\n"
)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    library = tmp_path / "library"
    library.mkdir()
    (library / "traffic.sql").write_text(TRAFFIC)
    rules = RulesConfig(paths=(str(library),), user_path=str(tmp_path / "store"))
    return Config(lakehouse=str(tmp_path / "lake"), rules=rules)


def engine_runs(config: Config, files: dict[str, str], rejected: list[str] | None = None) -> None:
    now = int(time.time() * 1000)
    rules = {
        "files": files,
        "loaded_at_ms": now,
        "rejected": None if rejected is None else {"at_ms": now, "errors": rejected},
    }
    record = {"updated_at_ms": now, "started_at_ms": now, "ready": True, "rules": rules}
    write_health(config.lakehouse, "engine", record)


def states(config: Config) -> dict[str, str]:
    return {Path(f.file).name: f.state for f in status(config)[0]}


def test_running_pending_refused_and_removed(
    config: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    library = tmp_path / "library" / "traffic.sql"
    assert print_status(config) == 1, "no engine"
    assert "no running engine" in capsys.readouterr().out
    engine_runs(config, {str(library): version(TRAFFIC), "/gone/old.sql": "0123"})
    assert states(config) == {"traffic.sql": RUNNING, "old.sql": REMOVED}
    assert print_status(config) == 0
    mine = tmp_path / "mine.sql"
    mine.write_text(SLOW)
    assert deploy(config, [mine], wait_s=0) == 0
    assert (tmp_path / "store" / "mine.sql").read_text() == SLOW
    assert states(config)["mine.sql"] == PENDING
    engine_runs(config, {str(library): version(TRAFFIC)}, rejected=["mine.sql:1:8: oops"])
    assert states(config)["mine.sql"] == REFUSED
    assert print_status(config) == 1
    assert "mine.sql:1:8: oops" in capsys.readouterr().out


def test_deploy_refuses_a_file_with_errors(
    config: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.sql"
    bad.write_text(SLOW.replace("avg(speed)", "avg(nope)"))
    assert deploy(config, [bad], wait_s=0) == 1
    assert "bad.sql:1:" in capsys.readouterr().err
    assert not (tmp_path / "store" / "bad.sql").exists()
