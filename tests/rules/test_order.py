"""A rule set means the same whatever the order of its files, of the paths naming them
and of the statements in them: names resolve across all of them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rules.language.cli import register
from rules.language.loader import check_paths, load_rules
from tests.rules.helpers import TRAFFIC

ALERT = "CREATE ALERT slow SEVERITY info AS SELECT station, ts, speed FROM fast WHERE speed < 40;\n"
FAST = "CREATE STREAM fast AS SELECT station, ts, speed FROM traffic WHERE speed > 30;\n"


def test_a_file_may_read_a_stream_declared_in_a_later_file(tmp_path: Path) -> None:
    (tmp_path / "aaa.sql").write_text(ALERT)
    (tmp_path / "mmm.sql").write_text(FAST)
    (tmp_path / "zzz.sql").write_text(TRAFFIC)
    rule_set = load_rules([tmp_path])
    assert [q.sink.name for q in rule_set.plan.queries] == ["fast", "slow"]


def test_a_statement_may_read_one_further_down_its_file(tmp_path: Path) -> None:
    (tmp_path / "r.sql").write_text(ALERT + FAST + TRAFFIC)
    assert check_paths([tmp_path]) == []


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lookout")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_the_order_of_the_paths_does_not_matter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine, library = tmp_path / "myfolder", tmp_path / "rules"
    mine.mkdir()
    library.mkdir()
    (mine / "my_alerts.sql").write_text(ALERT + "CREATE STREAM x AS SELECT nope FROM traffic;\n")
    (library / "traffic.sql").write_text(TRAFFIC + FAST)
    forward = check_paths([library, mine])
    assert [(Path(e.file).name, e.line, e.col) for e in forward] == [("my_alerts.sql", 2, 27)]
    assert check_paths([mine, library]) == forward

    (mine / "my_alerts.sql").write_text(ALERT)
    assert _run(["rules", "check", str(mine), str(library)]) == 0
    one = capsys.readouterr()
    assert _run(["rules", "check", str(library), str(mine)]) == 0
    assert capsys.readouterr() == one == ("ok: 2 rule files\n", "")


def test_a_file_named_twice_is_read_once(tmp_path: Path) -> None:
    (tmp_path / "r.sql").write_text(TRAFFIC)
    assert check_paths([tmp_path, tmp_path / "r.sql", tmp_path / "." / "r.sql"]) == []


def test_a_cycle_is_an_error_at_the_statement_closing_it(tmp_path: Path) -> None:
    (tmp_path / "r.sql").write_text(
        TRAFFIC
        + "CREATE STREAM a AS SELECT station, ts FROM b;\n"
        + "CREATE STREAM b AS SELECT station, ts FROM a;\n"
    )
    (error,) = check_paths([tmp_path])
    assert (error.line, error.col) == (4, 44)
    assert (
        error.message
        == "'a' reads, directly or through other streams, what this statement defines: a cycle"
    )
