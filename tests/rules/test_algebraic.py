"""CREATE AGGREGATE ... ALGEBRAIC reaches the plan (AggCall.algebraic) and gives a row
slide the pane optimisation (ESL §5.1); undeclared, the same UDA runs unpaned."""

from __future__ import annotations

from pathlib import Path

from engine.core.evaluator import KeyedEvaluator
from engine.core.windows.extents import ExtentOperator, PaneExtentOperator
from engine.core.windows.over import OverOperator
from engine.core.windows.panes import PaneOperator
from rules.language.loader import load_rules
from tests.rules.helpers import FIXTURES, TRAFFIC, check_text

QUERY = (
    "CREATE STREAM out AS SELECT ts, total(speed) OVER (ROWS 3 PRECEDING SLIDE 2) AS t "
    "FROM traffic;"
)


def declare(target: str, algebraic: bool) -> str:
    return (
        f"CREATE AGGREGATE total(x DOUBLE) RETURNS DOUBLE LANGUAGE PYTHON AS '{target}'"
        f"{' ALGEBRAIC' if algebraic else ''};\n"
    )


def outputs(tmp_path: Path, algebraic: bool) -> tuple[type, list[float]]:
    (tmp_path / "r.sql").write_text(
        TRAFFIC + declare("tests.rules.uda_fixtures:MergingSum", algebraic) + QUERY
    )
    stage = load_rules([tmp_path / "r.sql"], FIXTURES).plan.stages()[0]
    assert stage.query.window.aggregates[0].algebraic is algebraic  # type: ignore[union-attr]
    ev = KeyedEvaluator(stage)
    for i in range(8):
        row = {"station": 1, "lane": 1, "speed": float(i), "length": 4.0, "ts": i}
        ev.insert({**row, "source": "", "seq": i})
    return type(ev.operator), [o.row["t"] for o in ev.advance(100)]


def test_declared_algebraic_runs_on_panes(tmp_path: Path) -> None:
    paned, got = outputs(tmp_path, algebraic=True)
    plain, expected = outputs(tmp_path, algebraic=False)
    assert (paned, plain) == (PaneOperator, OverOperator)
    # Yields at rows 2, 4, 6, 8: sums of the last (up to) four speeds.
    assert got == expected == [1.0, 6.0, 14.0, 22.0]


def test_algebraic_needs_merge(tmp_path: Path) -> None:
    text = TRAFFIC + declare("tests.rules.uda_fixtures:NoMerge", algebraic=True)
    path, errors = check_text(tmp_path, text)
    assert [str(e) for e in errors] == [
        f"{path}:3:68: 'tests.rules.uda_fixtures:NoMerge' is declared ALGEBRAIC but has no "
        "merge: an algebraic aggregate is an IncrementalAggregate whose partials merge "
        "(ESL §5.1)"
    ]


def test_declared_algebraic_extents_run_on_panes(tmp_path: Path) -> None:
    query = (
        "CREATE STREAM out AS SELECT window_end, total(speed) AS t "
        "FROM traffic [RANGE 4 MILLISECONDS SLIDE 2 MILLISECONDS];"
    )
    got = {}
    for algebraic in (True, False):
        target = "tests.rules.uda_fixtures:MergingSum"
        (tmp_path / "r.sql").write_text(TRAFFIC + declare(target, algebraic) + query)
        ev = KeyedEvaluator(load_rules([tmp_path / "r.sql"], FIXTURES).plan.stages()[0])
        for i in range(8):
            row = {"station": 1, "lane": 1, "speed": float(i), "length": 4.0, "ts": i}
            ev.insert({**row, "source": "", "seq": i})
        got[algebraic] = (type(ev.operator), [(o.ts, o.row["t"]) for o in ev.advance(100)])
    assert got[True][0] is PaneExtentOperator and got[False][0] is ExtentOperator
    # Extents [e - 4, e) for e = 2, 4, ..., 10: sums of the speeds (= ts) inside.
    assert got[True][1] == got[False][1] == [(2, 1.0), (4, 6.0), (6, 14.0), (8, 22.0), (10, 13.0)]
