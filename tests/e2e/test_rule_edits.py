"""Rules edited between two engine runs: an unchanged rule resumes its state, an edited
one's state is dropped and filled again from the stored readings, a removed one's state
is deleted, and the engine says so at start.

The engine runs three running counts per station over a first half of the readings and
stops. Its rules are then edited, as the dashboard's editor saves them: `kept` only
moves down its file under a comment, `edited` gains a WHERE clause that keeps every
reading, `gone` is removed. The second run, on the same lakehouse, must give for
`kept` what `lookout replay` gives over all the readings (its counts go on), and for
`edited` too: its state was built by another rule, so it is dropped, and the warm
start counts the stored readings of the first half again under the new rule (without
it, the counts would restart at 1); the engine query's state must hold no evaluator of
`gone` any more.
"""

from __future__ import annotations

import pickle

import pytest

from engine.core.state import JOURNAL
from engine.spark.processor import ENTRIES
from engine.spark.step import unpack_value
from rules.language.loader import load_rules
from tests.e2e.helpers import STREAM, messages, normalised, readings, replay
from tests.pipeline import (
    delta_rows,
    no_batch_running,
    publish,
    running_engine,
    running_ingest,
    table_rows,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]

COUNT = "count(*) OVER (PARTITION BY station RANGE UNBOUNDED PRECEDING) AS n FROM traffic"
FIRST = (
    STREAM
    + f"CREATE STREAM kept AS SELECT station, ts, {COUNT};\n"
    + f"CREATE STREAM edited AS SELECT station, ts, {COUNT};\n"
    + f"CREATE STREAM gone AS SELECT station, ts, {COUNT};\n"
)
SECOND = (
    STREAM
    + f"CREATE STREAM edited AS SELECT station, ts, {COUNT} WHERE speed >= 0;\n"
    + "\n-- moved, reformatted: still the same rule\nCREATE STREAM kept AS\n"
    + f"  SELECT station, ts,\n         {COUNT};\n"
)
START = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def live(spark, config, name: str) -> list[dict]:
    return [{k: r[k] for k in ("station", "ts", "n")} for r in table_rows(spark, config, name)]


def test_an_edited_rule_restarts_and_an_unchanged_one_resumes(
    spark, mosquitto, lookout_config, tmp_path, caplog
):
    first = readings(START, 0, 20)
    second = readings(START + 70_000, 1_000, 20)
    whole = replay(tmp_path, "whole", FIRST, first + second)
    after = replay(tmp_path, "after", SECOND, second)
    # Started cold, it would count from 1 again.
    assert max(r["n"] for r in after["edited"]) < max(r["n"] for r in whole["edited"])

    for rules, rows, heartbeat, want in (
        (FIRST, first, START + 60_000, {"kept": 60, "edited": 60, "gone": 60}),
        (SECOND, second, START + 200_000, {"kept": 120, "edited": 120}),
    ):
        (tmp_path / "rules.sql").write_text(rules)
        rule_set = load_rules([tmp_path / "rules.sql"])
        caplog.clear()
        with (
            running_ingest(lookout_config, rule_set),
            running_engine(lookout_config, rule_set, spark) as engine,
        ):
            publish(mosquitto, messages(rows, heartbeat))
            for name, count in want.items():
                wait_for(
                    lambda s=name, n=count: len(delta_rows(lookout_config, s)) >= n,
                    180,
                    f"{count} rows of {name}",
                    engine=engine,
                )
            wait_for(lambda: no_batch_running(engine), 60, "the batch's state", engine=engine)

    # The second start said which rules start afresh.
    said = [r.getMessage() for r in caplog.records if r.name == "lookout.engine"]
    assert any("'edited' has been edited" in m for m in said), said
    assert any("'gone' is no longer in the rules" in m for m in said), said
    assert not [m for m in said if "kept" in m]
    stamps = {"ts"}
    assert normalised(live(spark, lookout_config, "kept"), stamps) == normalised(
        whole["kept"], stamps
    )
    assert normalised(live(spark, lookout_config, "edited"), stamps) == normalised(
        whole["edited"], stamps
    ), "its windows full again at the restart: its counts go on"

    # The state store, read back with Spark's state reader: each stage's saved state,
    # in its own entries or in the journal of the batches since the last fold.
    rows = (
        spark.read.format("statestore")
        .option("stateVarName", ENTRIES)
        .load(lookout_config.table("_checkpoints/engine"))
        .collect()
    )
    keys = [
        tuple(row["user_map_key"][f] for f in ("kind", "name", "key", "number")) for row in rows
    ]
    stored = {key for key in keys if key[0] in ("head", "cstate")}
    journal = sorted(
        ((key[3], row) for key, row in zip(keys, rows, strict=True) if key[0] == JOURNAL),
        key=lambda entry: entry[0],
    )
    for _, row in journal:
        for key, value in pickle.loads(unpack_value(row["user_map_value"]["data"])).items():
            (stored.add if value is not None else stored.discard)(key)
    assert {key[1] for key in stored if key[0] in ("head", "cstate")} == {"kept", "edited"}
