"""The engine's structure: one streaming query reads the landing files and nothing else,
so no derived stream crosses a Delta table between two queries on its way to an alert.

With the whole rule library loaded (traffic and RFID: derived streams feeding alerts,
reference tables, several connected parts), the engine runs exactly one query; its only
source is the landing source; and every stage an alert depends on runs inside that
query's stateful step (the pipeline of the alert's connected part).
"""

from __future__ import annotations

import pytest

from engine.core.pipeline import Pipeline
from engine.spark.job import EngineJob
from ingest.landing import LandingWriter
from lookout.services import alert_specs
from rules.language.loader import RULES_DIR, load_rules
from tests.waiting import wait_for

pytestmark = [pytest.mark.spark]


def test_one_query_from_the_landing_files_to_every_alert(spark, lookout_config) -> None:
    rule_set = load_rules([RULES_DIR / "traffic.sql", RULES_DIR / "rfid.sql"])
    plan = rule_set.plan
    job = EngineJob(lookout_config, plan, alert_specs(rule_set), spark=spark)
    job.start()
    try:
        assert [q.name for q in spark.streams.active] == ["engine"]
        ((query, _),) = job.queries
        writer = LandingWriter(lookout_config.landing, "t")
        writer.add_heartbeat("traffic", {"source": "gw", "ts": 1_767_225_600_000}, 0)
        writer.flush()
        wait_for(
            lambda: any(p["numInputRows"] for p in query.recentProgress),
            180,
            "a batch of the landed heartbeat",
            engine=job,
        )
        sources = {s["description"] for p in query.recentProgress for s in p["sources"]}
        # Its one source is a Python data source (the landing source), never a Delta
        # table's.
        (source,) = sources
        assert "PythonMicroBatchStream" in source and "delta" not in source.lower(), source
    finally:
        job.stop()
    # Every stage an alert depends on is in the pipeline of its connected part.
    producers = {q.sink.name: q.input for q in plan.queries}
    for component in job.components:
        inside = {stage.name for _, stage in Pipeline(plan, component.sources).stages}
        inside |= {q.sink.name for _, s in Pipeline(plan, component.sources).stages
                   for q in s.downstream}  # fmt: skip
        for name in inside:
            feeder = producers.get(name)
            while feeder in producers:
                assert feeder in inside, f"{name} reads {feeder}, evaluated elsewhere"
                feeder = producers[feeder]
