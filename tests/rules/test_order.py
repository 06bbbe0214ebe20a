"""A rule set means the same whatever the order of its files, of the paths naming them
and of the statements in them: names resolve across all of them."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.plan import Plan
from rules.language.cli import register
from rules.language.loader import RULES_DIR, check_paths, load_rules
from tests.examples import examples
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
    r = tmp_path / "r.sql"
    assert error.message == f"a cycle: 'b' ({r}:4:15), which reads 'a' ({r}:3:15), which reads 'b'"


def test_a_cycle_across_files_names_each_statement_of_it(tmp_path: Path) -> None:
    """a -> c -> b -> a over three files, beside the traffic stream and an alert reading
    a: reported once, at the FROM of the statement the check reaches last (b's)."""
    (tmp_path / "t.sql").write_text(TRAFFIC + ALERT.replace("fast", "a"))
    (tmp_path / "x.sql").write_text(
        "CREATE STREAM a AS SELECT station, ts, speed FROM c UNION ALL "
        "SELECT station, ts, speed FROM traffic;\n"
    )
    (tmp_path / "y.sql").write_text("CREATE STREAM b AS SELECT station, ts, speed FROM a;\n")
    (tmp_path / "z.sql").write_text("CREATE STREAM c AS SELECT station, ts, speed FROM b;\n")
    errors = check_paths([tmp_path])
    x, y, z = (tmp_path / f"{n}.sql" for n in "xyz")
    assert [(Path(e.file).name, e.line, e.col, e.message) for e in errors] == [
        (
            "y.sql",
            1,
            51,
            f"a cycle: 'b' ({y}:1:15), which reads 'a' ({x}:1:15), which reads 'c' "
            f"({z}:1:15), which reads 'b'",
        )
    ]


def _statements(text: str) -> list[str]:
    """A rule file's statements as texts, each with the comments above it (a statement
    ends at the line ending in ';'; no string or comment of the library has one)."""
    statements, lines = [], []
    for line in text.splitlines(keepends=True):
        lines.append(line)
        if line.rstrip().endswith(";"):
            statements.append("".join(lines))
            lines = []
    return statements


LIBRARY = [
    s for name in ("traffic.sql", "rfid.sql") for s in _statements((RULES_DIR / name).read_text())
]


def _plan_summary(plan: Plan) -> object:
    """What a plan is, positions and the order of independent queries aside: streams,
    each query (input, sink, key, definition digest) and each alert's incidents."""
    return (
        dict(plan.streams),
        {q.name: (q.input, q.sink, q.key, q.definition) for q in plan.queries},
        {
            i.alert: (i.observe, i.quiet_ms, i.pending_ms, i.keep_firing_ms, i.definition)
            for i in plan.incidents
        },
        sorted(stage.name for stage in plan.stages()),
    )


def _in_dependency_order(plan: Plan) -> bool:
    """Whether every query comes after all the queries writing the stream it reads."""
    return not any(
        later.sink.name == query.input
        for i, query in enumerate(plan.queries)
        for later in plan.queries[i + 1 :]
    )


@settings(max_examples=examples(50), deadline=None)
@given(
    order=st.permutations(range(len(LIBRARY))),
    files=st.lists(st.integers(0, 3), min_size=len(LIBRARY), max_size=len(LIBRARY)),
)
def test_the_library_split_and_shuffled_into_files_has_the_same_plan(
    order: list[int], files: list[int]
) -> None:
    """The library's statements in any order, spread over up to four files (each file
    keeping the drawn order), compile to the library's plan."""
    canonical = load_rules([RULES_DIR / "traffic.sql", RULES_DIR / "rfid.sql"]).plan
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for table in ("stations.csv", "doors.csv"):
            shutil.copy(RULES_DIR / table, root / table)
        texts: dict[int, str] = {}
        for index, file in zip(order, files, strict=True):
            texts[file] = texts.get(file, "") + LIBRARY[index]
        for file, text in texts.items():
            (root / f"part{file}.sql").write_text(text)
        shuffled = load_rules([root]).plan
    assert _plan_summary(shuffled) == _plan_summary(canonical)
    assert _in_dependency_order(shuffled)
