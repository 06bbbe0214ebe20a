"""``SLACK 0``: an ordered stream. A reading older than the latest reading (or heartbeat)
that arrived before it is late; one at the latest timestamp is on time, and ties are
processed in (ts, source, seq) order like any others. Checked against a brute force of
that rule, from rule text through the pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.replay import run
from rules.language.loader import load_rules
from tests.examples import examples

RULES = """CREATE STREAM s (k INT, id INT, ts TIMESTAMP) ORDER BY ts SLACK 0 SECONDS SOURCE 'x';
CREATE STREAM out AS SELECT id, ts, count(*) OVER (ROWS UNBOUNDED PRECEDING) AS n FROM s;
"""


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    items=st.lists(
        st.tuples(st.integers(0, 6).map(lambda t: t * 1000), st.sampled_from(["a", "b"])),
        max_size=25,
    )
)
def test_an_ordered_stream_takes_readings_at_or_after_the_latest(
    tmp_path: Path, items: list[tuple[int, str]]
) -> None:
    (tmp_path / "r.sql").write_text(RULES)
    plan = load_rules([tmp_path / "r.sql"]).plan
    readings: list[dict[str, Any]] = [
        {"k": 1, "id": i, "ts": ts, "source": src, "seq": i} for i, (ts, src) in enumerate(items)
    ]
    result = run(plan, [("s", dict(r)) for r in readings])
    on_time, latest = [], None
    for r in readings:
        if latest is None or r["ts"] >= latest:
            on_time.append(r)
        latest = r["ts"] if latest is None else max(latest, r["ts"])
    ordered = sorted(on_time, key=lambda r: (r["ts"], r["source"], r["seq"]))
    assert [(o.row["id"], o.row["n"]) for o in result.outputs] == [
        (r["id"], n) for n, r in enumerate(ordered, start=1)
    ]
    late = {r["id"] for r in readings} - {r["id"] for r in on_time}
    assert sorted(x.row["id"] for x in result.late) == sorted(late)


def test_the_docs_timeline(tmp_path: Path) -> None:
    """docs/rules.md's SLACK 0 picture: r3 ties with the latest (on time) and goes before
    r2 (source a before b); r4 is older than the latest (late)."""
    (tmp_path / "r.sql").write_text(RULES)
    plan = load_rules([tmp_path / "r.sql"]).plan
    arrivals = [(1, 1000, "a"), (2, 2000, "b"), (3, 2000, "a"), (4, 1000, "a"), (5, 3000, "a")]
    result = run(
        plan,
        [("s", {"k": 1, "id": i, "ts": ts, "source": src, "seq": i}) for i, ts, src in arrivals],
    )
    assert [(o.row["id"], o.row["n"]) for o in result.outputs] == [(1, 1), (3, 2), (2, 3), (5, 4)]
    assert [x.row["id"] for x in result.late] == [4]
