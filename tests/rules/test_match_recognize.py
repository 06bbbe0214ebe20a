"""MATCH_RECOGNIZE from rule text, against a brute force written from SQL:2016's row
pattern matching: from each start row, every string of pattern variables the pattern
generates, in preferment order (alternation: left option first; greedy quantifier: one
more iteration before stopping; reluctant: stopping first), each string mapped onto the
rows from the start; the match is the first string whose rows all satisfy their
variable's DEFINE (read over the mapping so far). A string longer than the rows left
whose rows so far all satisfy theirs means the start waits for rows that never come:
without WITHIN no further match is emitted; with WITHIN only rows up to the start's
time plus WITHIN may join, and the end of input closes every deadline. After a match
the search resumes past its last row or at the next row (AFTER MATCH SKIP).
"""

from __future__ import annotations

import operator
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.pattern_plan import (
    PatternAlt,
    PatternRepeat,
    PatternSeq,
    PatternVar,
    PatternWindow,
)
from engine.core.replay import run
from rules.language.access import RulePolicy
from rules.language.explain import explain
from rules.language.loader import analyse, load_rules
from tests.engine.test_determinism import disordered, drive
from tests.examples import examples
from tests.rules.helpers import check_text

STREAM = """CREATE STREAM md (station INT, speed INT, ts TIMESTAMP)
  ORDER BY ts SLACK 1 MINUTE SOURCE 'lookout/md';
"""
RULE = """CREATE STREAM out AS SELECT station, a_ts, last_ts, nb, total, k, cmax, ts
  FROM md MATCH_RECOGNIZE (
    PARTITION BY station ORDER BY ts
    MEASURES FIRST(A.ts) AS a_ts, LAST(ts) AS last_ts, count(B.*) AS nb,
             sum(speed) AS total, MATCH_NUMBER() AS k, max(C.speed) AS cmax
    ONE ROW PER MATCH AFTER MATCH SKIP {skip}
    PATTERN ({pattern}) {within}
    DEFINE A AS speed >= 2, B AS speed < A.speed AND count(B.*) <= 2,
           C AS speed <= 1 OR speed > LAST(B.speed)
  );
"""
# Each shape: the pattern's text, whether it needs WITHIN (an unbounded quantifier).
SHAPES = [
    ("A B C", False),
    ("A B+ C", True),
    ("A B{1,3} C?", False),
    ("A (B | C) | C", False),
    ("A B? C", False),
    ("A B D*? C", True),
    ("(A | B)+ C", True),
    ("A B{2,} C", True),
    ("(A B)+? C D?", True),
]


def holds(var: str, mapped: list[tuple[str, dict[str, Any]]]) -> bool:
    """RULE's DEFINE conditions in Python; the current row is the last one mapped."""
    row = mapped[-1][1]
    a = [r for v, r in mapped if v == "A"]
    b = [r for v, r in mapped if v == "B"]
    if var == "A":
        return bool(row["speed"] >= 2)
    if var == "B":  # count(B.*) counts the row being mapped
        return bool(a) and row["speed"] < a[-1]["speed"] and len(b) <= 2
    if var == "C":
        return row["speed"] <= 1 or (bool(b) and row["speed"] > b[-1]["speed"])
    return True  # D has no DEFINE


def strings(node: Any, cap: int) -> Iterator[tuple[str, ...]]:
    """The variable strings ``node`` generates, in preferment order; an unbounded
    quantifier iterates at most ``cap`` times (enough to run past the rows left)."""
    if isinstance(node, PatternVar):
        yield (node.name,)
    elif isinstance(node, PatternSeq):
        yield from seq(list(node.items), cap)
    elif isinstance(node, PatternAlt):
        for option in node.options:
            yield from strings(option, cap)
    else:
        high = cap if node.high is None else node.high
        yield from repeat(node, node.low, high, cap)


def seq(items: list[Any], cap: int) -> Iterator[tuple[str, ...]]:
    if not items:
        yield ()
        return
    for head in strings(items[0], cap):
        for tail in seq(items[1:], cap):
            yield head + tail


def repeat(node: PatternRepeat, low: int, high: int, cap: int) -> Iterator[tuple[str, ...]]:
    """Iterations left between ``low`` and ``high``: one more first if greedy."""
    more = high > 0
    if not node.greedy and low <= 0:
        yield ()
    if more:
        for head in strings(node.item, cap):
            for tail in repeat(node, low - 1, high - 1, cap):
                yield head + tail
    if node.greedy and low <= 0:
        yield ()


def valid(word: tuple[str, ...], rows: list[dict[str, Any]]) -> bool:
    """Whether the first rows of ``word`` (as many as there are rows) satisfy theirs."""
    mapped = list(zip(word, rows, strict=False))
    return all(holds(mapped[i][0], mapped[: i + 1]) for i in range(len(mapped)))


@dataclass
class Oracle:
    pattern: Any
    within: int | None
    past: bool

    def matches(self, rows: list[dict[str, Any]]) -> list[tuple]:
        """One partition's matches over all its rows (ordered), as RULE's columns."""
        out: list[tuple] = []
        start = 0
        while start < len(rows):
            left = rows[start:]
            if self.within is not None:
                deadline = left[0]["ts"] + self.within
                left = [r for r in left if r["ts"] <= deadline]
            found: tuple[str, ...] | None = None
            for word in strings(self.pattern, len(left) + 1):
                if len(word) <= len(left) and valid(word, left):
                    found = word
                    break
                if len(word) > len(left) and self.within is None and valid(word, left):
                    return out  # waits for a row that never comes
            if found is None:
                start += 1
                continue
            mapped = list(zip(found, left, strict=False))
            out.append(measures(mapped, len(out) + 1))
            start += len(found) if self.past else 1
        return out


def measures(mapped: list[tuple[str, dict[str, Any]]], number: int) -> tuple:
    """RULE's columns of a match (without its event time)."""
    a = [r for v, r in mapped if v == "A"]
    c = [r["speed"] for v, r in mapped if v == "C"]
    return (
        mapped[0][1]["station"],
        a[0]["ts"] if a else None,
        mapped[-1][1]["ts"],
        sum(v == "B" for v, _ in mapped),
        sum(r["speed"] for _, r in mapped),
        number,
        max(c) if c else None,
    )


def compile_rule(tmp_path: Path, pattern: str, skip: str, within: int | None) -> Any:
    text = RULE.format(
        pattern=pattern, skip=skip, within=f"WITHIN {within} MILLISECONDS" if within else ""
    )
    (tmp_path / "r.sql").write_text(STREAM + text)
    return load_rules([tmp_path / "r.sql"]).plan


readings = st.lists(
    st.tuples(st.integers(0, 15), st.integers(0, 1), st.integers(0, 3)), max_size=14
)


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    raw=readings,
    shape=st.sampled_from(SHAPES),
    skip=st.sampled_from(["PAST LAST ROW", "TO NEXT ROW"]),
    within=st.integers(1, 8),
    use_within=st.booleans(),
    shuffle=st.randoms(use_true_random=False),
)
def test_matches_equal_the_brute_force(
    tmp_path: Path,
    raw: list[tuple[int, int, int]],
    shape: tuple[str, bool],
    skip: str,
    within: int,
    use_within: bool,
    shuffle: random.Random,
) -> None:
    pattern, needs_within = shape
    bound = within if use_within or needs_within else None
    plan = compile_rule(tmp_path, pattern, skip, bound)
    window = plan.queries[0].window
    assert isinstance(window, PatternWindow)
    rows = [
        {"station": k, "speed": v, "ts": ts, "source": "s", "seq": i}
        for i, (ts, k, v) in enumerate(sorted(raw))
    ]
    arrival = list(rows)
    shuffle.shuffle(arrival)  # within the slack: the engine orders them
    outputs = [o for o in run(plan, [("md", dict(r)) for r in arrival]).outputs]
    by_match = operator.itemgetter(0, 5)  # station, MATCH_NUMBER
    got = sorted((tuple(o.row[c] for c in list(o.row)[:-1]) for o in outputs), key=by_match)
    oracle = Oracle(window.pattern, bound, skip == "PAST LAST ROW")
    expected = sorted(
        (m for k in (0, 1) for m in oracle.matches([r for r in rows if r["station"] == k])),
        key=by_match,
    )
    assert got == expected
    for o in outputs:
        # Final at its last row, or later when a more preferred match could go on.
        assert o.ts == o.row["ts"] >= o.row["last_ts"]
        if pattern == "A B C":
            assert o.ts == o.row["last_ts"]


def test_a_match_waiting_for_a_row_is_final_at_its_deadline(tmp_path: Path) -> None:
    """``A B{1,3} C?`` wants a third B (or a C) after A B B: with WITHIN the match is
    final at its start's deadline, its event time; its last row is earlier."""
    plan = compile_rule(tmp_path, "A B{1,3} C?", "PAST LAST ROW", 3)
    rows = [
        {"station": 0, "speed": v, "ts": ts, "source": "s", "seq": ts}
        for ts, v in ((0, 3), (1, 2), (2, 1))
    ]
    (out,) = run(plan, [("md", r) for r in rows]).outputs
    assert (out.ts, out.row["last_ts"], out.row["nb"]) == (3, 2, 2)


ERRORS = [
    ("PATTERN (A | )", "syntax error: unexpected ')'"),
    ("PATTERN (A B-)", "syntax error: '-' is not a quantifier"),
    ("PATTERN (A*) WITHIN 1 SECOND", "this pattern can match no rows at all"),
    ("PATTERN (A B+)", "needs WITHIN"),
    ("PATTERN (A B{3,2})", "a quantifier {n,m} needs"),
    ("PATTERN (A (B?)+) WITHIN 1 SECOND", "a quantified part of the pattern must match a row"),
    ("PATTERN (A B) DEFINE X AS speed > 1", "DEFINE of 'X', which is not in PATTERN"),
    ("PATTERN (A B) DEFINE A AS Z.speed > 1", "unknown pattern variable 'Z'"),
    ("PATTERN (A B) DEFINE A AS speed", "needs a true/false condition"),
    ("PATTERN (A B) DEFINE A AS FIRST(speed + 1) > 2", "FIRST here takes one column"),
]


@pytest.mark.parametrize(("clauses", "message"), ERRORS)
def test_malformed_patterns_are_located(tmp_path: Path, clauses: str, message: str) -> None:
    text = (
        STREAM
        + "CREATE STREAM out AS SELECT station, ts FROM md MATCH_RECOGNIZE (\n"
        + "  PARTITION BY station ORDER BY ts MEASURES LAST(A.speed) AS s\n"
        + f"  {clauses}\n);\n"
    )
    path, errors = check_text(tmp_path, text)
    assert errors, clauses
    assert message in errors[0].message
    assert errors[0].line == 5 and str(errors[0]).startswith(f"{path}:5:")


def test_an_alert_on_matches_says_how_it_resolves(tmp_path: Path) -> None:
    rule = (
        "CREATE ALERT drops SEVERITY warning AS SELECT station, ts FROM md MATCH_RECOGNIZE (\n"
        "  PARTITION BY station ORDER BY ts MEASURES LAST(A.speed) AS s PATTERN (A B)\n"
        "  DEFINE B AS speed < A.speed);\n"
    )
    _, errors = check_text(tmp_path, STREAM + rule)
    assert [e.message for e in errors] == [
        "alert 'drops' reports from a window, so a row its WHERE drops does not mean its "
        "condition stopped: say how its incidents resolve (RESOLVE WHEN condition on its "
        "input rows, or RESOLVE AFTER a quiet interval)"
    ]
    resolved = rule.replace("SEVERITY warning", "SEVERITY warning RESOLVE AFTER 1 MINUTE")
    assert check_text(tmp_path, STREAM + resolved)[1] == []


TRAFFIC_RULE = """CREATE STREAM traffic (station INT, lane INT, speed DOUBLE, length DOUBLE,
  ts TIMESTAMP) ORDER BY ts SLACK 20 MILLISECONDS SOURCE 'lookout/traffic';
CREATE STREAM out AS SELECT station, ts, n, top FROM traffic MATCH_RECOGNIZE (
  PARTITION BY station ORDER BY ts MEASURES count(*) AS n, max(speed) AS top
  AFTER MATCH SKIP {skip} PATTERN (A (B | C)+ C?) WITHIN 30 MILLISECONDS
  DEFINE A AS speed >= 20, B AS speed < LAST(A.speed), C AS speed > FIRST(B.speed));
"""


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    data=disordered(),
    skip=st.sampled_from(["PAST LAST ROW", "TO NEXT ROW"]),
    schedule=st.lists(st.integers(0, 3), min_size=50, max_size=50),
    restore_at=st.sets(st.integers(0, 49), max_size=5),
)
def test_batching_disorder_and_restarts_do_not_change_matches(
    tmp_path: Path, data: tuple, skip: str, schedule: list[int], restore_at: set[int]
) -> None:
    in_order, shuffled = data
    (tmp_path / "r.sql").write_text(TRAFFIC_RULE.format(skip=skip))
    plan = load_rules([tmp_path / "r.sql"]).plan
    (stage,) = plan.stages()
    once = drive(stage, shuffled, [0] * len(shuffled), set())
    assert drive(stage, shuffled, schedule, set()) == once
    assert drive(stage, shuffled, schedule, restore_at) == once
    expected = run(plan, [("traffic", r) for r in in_order]).outputs
    assert run(plan, [("traffic", r) for r in shuffled], batch=3).outputs == expected


def test_explain_describes_the_pattern(tmp_path: Path) -> None:
    (tmp_path / "r.sql").write_text(
        STREAM + RULE.format(pattern="A B+ C", skip="TO NEXT ROW", within="WITHIN 2 SECONDS")
    )
    _, catalog, _, _, errors = analyse([tmp_path / "r.sql"], RulePolicy())
    assert errors == []
    text = explain(catalog, "out") or ""
    assert "variables: A, B, C" in text
    assert "at most 2 seconds after its first" in text
    assert "a row of B ->" in text and "try " in text


@pytest.mark.parametrize(("pattern", "last"), [("A B D*? C", 2), ("A B D* C", 4)])
def test_reluctant_stops_at_the_first_way_greedy_at_the_last(
    tmp_path: Path, pattern: str, last: int
) -> None:
    plan = compile_rule(tmp_path, pattern, "PAST LAST ROW", 8)
    rows = [
        {"station": 0, "speed": v, "ts": ts, "source": "s", "seq": ts}
        for ts, v in ((0, 3), (1, 2), (2, 0), (3, 0), (4, 0))
    ]
    window = plan.queries[0].window
    (expected,) = Oracle(window.pattern, 8, True).matches(rows)
    (out,) = run(plan, [("md", r) for r in rows]).outputs
    assert out.row["last_ts"] == expected[2] == last


def test_the_docs_timelines(tmp_path: Path) -> None:
    """docs/rules.md's pictures: speed_drops over 30 28 25 20 22 18 15 (one match, at
    minute 3; the second waits for its D), and A B+ C over 5 4 3 9 (emitted at the 9)."""
    drops = """CREATE STREAM out AS SELECT station, ts, from_speed, to_speed
  FROM md MATCH_RECOGNIZE (
    PARTITION BY station ORDER BY ts
    MEASURES FIRST(A.speed) AS from_speed, LAST(D.speed) AS to_speed
    ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
    PATTERN (A B C D) WITHIN 5 MINUTES
    DEFINE B AS speed < A.speed, C AS speed < B.speed, D AS speed < C.speed);
"""
    plus = """CREATE STREAM out AS SELECT station, ts, nb FROM md MATCH_RECOGNIZE (
    PARTITION BY station ORDER BY ts MEASURES count(B.*) AS nb
    PATTERN (A B+ C) WITHIN 1 MINUTE
    DEFINE B AS speed < A.speed, C AS speed > A.speed);
"""
    cases = [
        (drops, [30, 28, 25, 20, 22, 18, 15], 60_000, [(3 * 60_000, 30, 20)]),
        (plus, [5, 4, 3, 9], 10_000, [(30_000, 2)]),
    ]
    for rule, speeds, step, want in cases:
        (tmp_path / "r.sql").write_text(STREAM + rule)
        plan = load_rules([tmp_path / "r.sql"]).plan
        rows = [
            {"station": 1, "speed": v, "ts": i * step, "source": "s", "seq": i}
            for i, v in enumerate(speeds)
        ]
        outputs = run(plan, [("md", r) for r in rows], end_at=6 * 60_000 + 1).outputs
        assert [tuple(o.row.values())[1:] for o in outputs] == want
