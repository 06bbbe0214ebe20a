"""MATCH_RECOGNIZE against Flink SQL's, on the same random streams.

Flink runs in its own virtualenv (`benchmarks/flink_setup.sh` makes `.flink-venv`;
`benchmarks/flink_patterns.py` drives it): one JVM runs every query of this module over
one stream of 150 partitions with many exact ties (Flink orders by ``rt, n``, Lookout by
(ts, source, seq) with seq = n). Without the virtualenv those tests are skipped; the
Lookout side of each documented difference runs everywhere.

The shapes compared (quantifiers ``+ * ? {n} {n,m} {n,}``, greedy and reluctant, WITHIN,
AFTER MATCH SKIP PAST LAST ROW and TO NEXT ROW) use conditions under which no row can be
mapped to a quantified variable and to the variable after it (B: ``1 <= speed <
A.speed``, C: ``speed = 0``): there SQL:2016's preferment order and Flink's NFA find the
same matches. Where they can, they differ, and Lookout keeps SQL:2016 (docs/rules.md,
*Lookout and Flink*):

* **WITHIN d**: Flink drops a partial match once ``ts - first >= d``, so its last row is
  less than d after its first; Lookout's is at most d after it (inclusive, like every
  time bound of the language). Flink's ``WITHIN d`` is Lookout's ``WITHIN d - 1 ms``,
  which the comparison uses; the stream's timestamps (a 500 ms grid, some 1 ms later)
  put matches exactly on that bound.
* **Preferment**: for ``A B? C`` over rows a row satisfying both B and C, SQL:2016's
  greedy ``?`` prefers mapping it to B (``A B C``); Flink emits ``A C``, the first way
  to complete. Greedy ``A{1,2}`` likewise backtracks to ``A B C`` in SQL:2016 and not
  in Flink.
* **Shapes Flink refuses**: alternation (``CEP doesn't support branching patterns``), a
  greedy quantifier last (``A B+``), an optional after a greedy part (``A B{1,3} C?``).
  Lookout runs them; tests/rules/test_match_recognize.py holds them to a brute force
  written from SQL:2016's definition.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from flink_patterns import patterns
from flink_peer import flink_python

from engine.core.replay import run
from rules.language.loader import load_rules

FLINK = flink_python()
needs_flink = pytest.mark.skipif(
    not FLINK.is_file(),
    reason=f"no Flink virtualenv at {FLINK} (make it with `bash benchmarks/flink_setup.sh`)",
)

STREAM = """CREATE STREAM md (station INT, speed INT, n INT, ts TIMESTAMP)
  ORDER BY ts SLACK 1 MINUTE SOURCE 'lookout/md';
"""
COLUMNS = ["station", "first_n", "last_n", "nb", "total"]
# {order}, {skip}, {pattern}, {within}, {define}: Lookout's text and Flink's differ only
# in ORDER BY (Flink's time attribute rt, then n) and in how WITHIN is written.
BODY = """PARTITION BY station ORDER BY {order}
    MEASURES FIRST(n) AS first_n, LAST(n) AS last_n, count(B.speed) AS nb,
             sum(speed) AS total
    ONE ROW PER MATCH AFTER MATCH SKIP {skip}
    PATTERN ({pattern}) {within}
    DEFINE {define}"""
APART = "A AS speed >= 2, B AS speed < A.speed AND speed >= 1, C AS speed = 0"
OVERLAPPING = "A AS speed >= 2, B AS speed < A.speed, C AS speed <= 1"
# (pattern, whether it needs WITHIN: an unbounded quantifier)
SHAPES = [
    ("A B C", False),
    ("A B+ C", True),
    ("A B+? C", True),
    ("A B* C", True),
    ("A B*? C", True),
    ("A B? C", False),
    ("A B{1,3} C", False),
    ("A B{2,} C", True),
    ("A{2} B C", False),
]
SKIPS = ["PAST LAST ROW", "TO NEXT ROW"]
WITHIN_MS = 2000


def random_stream(seed: int, partitions: int = 150) -> list[tuple[int, int, int, int]]:
    """(station, speed, n, ts) rows: up to 12 a station on a 500 ms grid, some 1 ms
    later, so ties are many and matches fall on the WITHIN bound."""
    rng = random.Random(seed)
    rows = []
    for station in range(partitions):
        for _ in range(rng.randint(0, 12)):
            ts = rng.randint(0, 11) * 500 + rng.choice([0, 0, 1])
            rows.append((station, rng.randint(0, 3), len(rows), 1_000_000 + ts))
    return rows


def cases() -> dict[str, tuple[str, str, int | None]]:
    """Every compared query by name: (pattern, skip, Flink's WITHIN in ms or None)."""
    out: dict[str, tuple[str, str, int | None]] = {}
    for pattern, needs_within in SHAPES:
        for skip in SKIPS:
            for within in [WITHIN_MS] if needs_within else [None, WITHIN_MS]:
                out[f"{pattern} / {skip} / WITHIN {within}"] = (pattern, skip, within)
    return out


def flink_sql(pattern: str, skip: str, within_ms: int | None, define: str = APART) -> str:
    within = "" if within_ms is None else f"WITHIN INTERVAL '{within_ms / 1000}' SECOND"
    body = BODY.format(order="rt, n", skip=skip, pattern=pattern, within=within, define=define)
    return f"SELECT {', '.join(COLUMNS)} FROM md MATCH_RECOGNIZE ({body})"


def lookout(
    tmp_path: Path,
    rows: list[tuple[int, int, int, int]],
    pattern: str,
    skip: str,
    within_ms: int | None,
    define: str = APART,
) -> list[tuple]:
    """Lookout's matches (the COLUMNS), sorted; ``within_ms`` is Lookout's own bound."""
    within = "" if within_ms is None else f"WITHIN {within_ms} MILLISECONDS"
    body = BODY.format(order="ts", skip=skip, pattern=pattern, within=within, define=define)
    rule = f"CREATE STREAM out AS SELECT {', '.join(COLUMNS)}, ts FROM md MATCH_RECOGNIZE ({body});"
    (tmp_path / "r.sql").write_text(STREAM + rule + "\n")
    plan = load_rules([tmp_path / "r.sql"]).plan
    readings = [
        {"station": k, "speed": v, "n": n, "ts": ts, "source": "s", "seq": n}
        for k, v, n, ts in reversed(rows)  # any arrival order within the slack
    ]
    outputs = run(plan, [("md", r) for r in readings]).outputs
    return sorted(tuple(o.row[c] for c in COLUMNS) for o in outputs if o.sink == "out")


# The documented differences: a stream each, Lookout's rows (SQL:2016) and Flink's.
# Rows (station, speed, n, ts): A = speed >= 2, B = below A, C = speed <= 1.
DIFFERENCES: dict[str, dict[str, Any]] = {
    "WITHIN is inclusive": {
        "rows": [
            *[(0, 3, 0, 0), (0, 2, 1, 2000), (0, 0, 2, 4000)],
            *[(1, 3, 3, 0), (1, 2, 4, 2000), (1, 0, 5, 3999)],
        ],
        "query": ("A B C", "PAST LAST ROW", 4000),
        # Lookout's WITHIN 4 SECONDS keeps a match whose last row is 4 s after its first.
        "lookout": [(0, 0, 2, 1, 5), (1, 3, 5, 1, 5)],
        "flink": [(1, 3, 5, 1, 5)],
    },
    "greedy ? prefers B": {
        "rows": [(0, 3, 0, 0), (0, 1, 1, 1000), (0, 0, 2, 2000)],
        "query": ("A B? C", "PAST LAST ROW", None),
        # 1 satisfies B and C: SQL:2016 maps it to B (A B C), Flink ends at once (A C).
        "lookout": [(0, 0, 2, 1, 4)],
        "flink": [(0, 0, 1, 0, 4)],
    },
    "greedy {1,2} backtracks": {
        "rows": [(0, 3, 0, 0), (0, 2, 1, 1000), (0, 1, 2, 2000), (0, 2, 3, 3000)],
        "query": ("A{1,2} B C", "PAST LAST ROW", None),
        # A A B C (3 2 1 2) fails at the fourth row (2 is no C); SQL:2016 backtracks to
        # the less preferred A B C (3 2 1); Flink's greedy A{1,2} kept 2 as an A only.
        "lookout": [(0, 0, 2, 1, 6)],
        "flink": [],
    },
}
REFUSED = {  # shapes Flink cannot express, with what it says
    "(A | B) C": "branching patterns",
    "A B+": "Greedy quantifiers are not allowed as the last element",
    "A B{1,3} C?": "Optional pattern cannot be preceded by greedy pattern",
}


@pytest.mark.parametrize("name", list(DIFFERENCES))
def test_lookouts_side_of_each_difference(tmp_path: Path, name: str) -> None:
    """What Lookout gives where Flink differs: SQL:2016's match, and WITHIN inclusive."""
    case = DIFFERENCES[name]
    pattern, skip, within = case["query"]
    got = lookout(tmp_path, case["rows"], pattern, skip, within, OVERLAPPING)
    assert got == case["lookout"]


Shift = tuple[int, int]  # what a difference's stations and ids were moved by


@pytest.fixture(scope="module")
def flink_results() -> tuple[dict[str, dict[str, list]], dict[str, Shift]]:
    """Every query of this module in one Flink run (one JVM start, ~30 s): the random
    stream, then each difference's rows moved to stations and ids of their own."""
    rows = random_stream(7)
    queries = {
        name: f"SELECT * FROM ({flink_sql(*case)}) WHERE station < 10000"
        for name, case in cases().items()
    }
    shifts: dict[str, Shift] = {}
    for i, (name, case) in enumerate(DIFFERENCES.items()):
        shift = (10_000 * (i + 1), len(rows))
        rows += [(k + shift[0], v, n + shift[1], ts) for k, v, n, ts in case["rows"]]
        sql = flink_sql(*case["query"], define=OVERLAPPING)
        lo, hi = shift[0], shift[0] + 10_000
        queries[name] = f"SELECT * FROM ({sql}) WHERE station >= {lo} AND station < {hi}"
        shifts[name] = shift
    for pattern in REFUSED:
        queries[pattern] = flink_sql(pattern, "PAST LAST ROW", WITHIN_MS, OVERLAPPING)
    return patterns(rows, queries, FLINK), shifts


Results = tuple[dict[str, dict[str, list]], dict[str, Shift]]


@pytest.mark.slow
@needs_flink
def test_matches_equal_flinks(tmp_path: Path, flink_results: Results) -> None:
    """Every shape and skip, with and without WITHIN (Flink's d as Lookout's d - 1 ms)."""
    results, _ = flink_results
    rows = random_stream(7)
    for name, (pattern, skip, within) in cases().items():
        flink = results[name]
        assert "rows" in flink, (name, flink)
        want = sorted(tuple(r) for r in flink["rows"])
        assert want, name  # every query finds matches to compare
        ours = lookout(tmp_path, rows, pattern, skip, None if within is None else within - 1)
        assert ours == want, name


@pytest.mark.slow
@needs_flink
def test_flinks_side_of_each_difference(flink_results: Results) -> None:
    """Flink's answers where Lookout keeps SQL:2016 (module docstring), and the shapes
    Flink refuses."""
    results, shifts = flink_results
    for name, case in DIFFERENCES.items():
        ks, ns = shifts[name]
        got = sorted(
            (k - ks, first - ns, last - ns, nb, total)
            for k, first, last, nb, total in results[name]["rows"]
        )
        assert got == case["flink"], name
    for pattern, reason in REFUSED.items():
        assert reason in results[pattern].get("error", ""), pattern
