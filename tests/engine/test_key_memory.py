"""What a key costs the pipeline's memory: nothing once it has gone idle, and, while it
waits, no copy per key of the values many keys share.

The RFID library's `missed_shipping` holds a tag for 30 minutes after each reading and
its incidents observe the shipping door's readings: a live engine sees hundreds of new
tags a second, so a few bytes left per tag are hundreds of megabytes a day.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from engine.core.columnar.expiry import NewestExpiryRunner
from engine.core.pipeline import HEARTBEAT, Pipeline
from engine.core.plan import Plan, StreamSchema
from engine.core.replay import arrival_table
from engine.core.state import MemoryStore, StateKey
from rules.language.loader import load_rules

RFID = Path(__file__).resolve().parents[2] / "rules" / "rfid.sql"
MINUTE = 60_000


class Discarding(MemoryStore):
    """A store that keeps nothing: what is measured is the pipeline's own memory."""

    def put(self, key: StateKey, value: bytes) -> None:
        pass

    def write(self, changes: Sequence[tuple[StateKey, bytes | None]]) -> None:
        pass


def _plan() -> Plan:
    return load_rules([RFID]).plan


def _schema(plan: Plan) -> StreamSchema:
    return next(s for s in plan.sources() if s.name == "tag_readings")


def _readings(plan: Plan, tags: range, t0: int) -> dict[str, Any]:
    """Each tag read at the receiving door and, a second later, at the shipping door
    (which settles it: no alert), one tag every 10 ms."""
    rows = []
    for n in tags:
        at = t0 + 10 * (n - tags.start)
        tag = f"CASE-{n:07d}"
        rows.append({"tagid": tag, "tagtype": "case", "door": "1", "ts": at})
        rows.append({"tagid": tag, "tagtype": "case", "door": "4", "ts": at + 1000})
    rows.sort(key=lambda r: r["ts"])
    return {"tag_readings": arrival_table(_schema(plan), rows)}


def _heartbeat(plan: Plan, at: int) -> dict[str, Any]:
    row = {"tagid": None, "tagtype": None, "door": None, "ts": at}
    table = arrival_table(_schema(plan), [row])
    return {
        "tag_readings": table.set_column(
            table.schema.get_field_index(HEARTBEAT), HEARTBEAT, [[True]]
        )
    }


def _round(pipeline: Pipeline, plan: Plan, tags: range, t0: int) -> int:
    """Read ``tags``, then let an hour pass: every tag settled, expired and idle."""
    pipeline.process(_readings(plan, tags, t0))
    pipeline.save()
    end = t0 + 10 * len(tags) + 60 * MINUTE
    pipeline.process(_heartbeat(plan, end))
    pipeline.save()
    return end


@pytest.mark.slow
def test_keys_gone_idle_leave_no_memory_behind() -> None:
    """After 20,000 more tags have come and gone, the pipeline holds no more objects
    than after the first 20,000 (a set of every key ever idle once kept a string a tag).
    Objects, not bytes: a dict keeps its table's size after its keys leave."""
    plan = _plan()
    pipeline = Pipeline(plan, store=Discarding())
    t = _round(pipeline, plan, range(0, 20_000), 1_000_000)
    assert pipeline.live_keys()["missed_shipping"] == 0
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        _round(pipeline, plan, range(20_000, 40_000), t + MINUTE)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert pipeline.live_keys()["missed_shipping"] == 0
    assert pipeline.live_keys()["missed_shipping!incidents"] == 0
    grown = sum(stat.count_diff for stat in after.compare_to(before, "filename"))
    assert grown < 1_000, f"{grown} more objects after 20,000 tags came and went"


def test_waiting_tags_share_their_repeated_values() -> None:
    """The newest reading each waiting tag keeps holds one string object per distinct
    door and tag type across the tags, not one per tag (the reading's source is not
    kept: nothing after a stage's sort reads it)."""
    plan = _plan()
    pipeline = Pipeline(plan, store=Discarding())
    schema = _schema(plan)
    rows = [
        {
            "tagid": f"CASE-{n:05d}",
            "tagtype": "case",
            "door": "1",
            "ts": 1_000_000 + 10 * n,
            "source": "door-1",
            "epoch": "e1",
        }
        for n in range(3_000)
    ]
    for start in (0, 1_000, 2_000):  # three batches and a heartbeat: four advances
        pipeline.process({"tag_readings": arrival_table(schema, rows[start : start + 1_000])})
    pipeline.process(_heartbeat(plan, 1_000_000 + 10 * 3_000 + MINUTE))
    runner = next(
        r
        for r in pipeline.runners.values()
        if isinstance(r, NewestExpiryRunner) and r.stage.name == "missed_shipping"
    )
    kept = [state for state in runner.states.values() if state is not None]
    assert len(kept) == 3_000
    names = runner.layouts[0].names
    assert "source" not in names
    for column in ("tagtype", "door"):
        at = names.index(column)
        assert len({id(k[at]) for k in kept}) <= 4, column  # one per advance at most
    assert len({id(k[names.index("tagid")]) for k in kept}) == 3_000
