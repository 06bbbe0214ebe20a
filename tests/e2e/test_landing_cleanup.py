"""Landing files leave the landing folder once their batch is committed.

The landing source lists the whole landing folder in every batch, so it deletes a
committed batch's files, or moves them to `[engine] landing_archive`, and the folder
holds only the backlog. Readings go through a real mosquitto, the
real ingest and the engine in three rounds, each waited for in Delta, so each
lands in a batch of its own. A batch's files go when the next batch starts: the first
round's files must then be gone from the landing folder (and, with an archive, be in
it byte for byte), while every reading is in `readings_traffic` exactly once.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from rules.language.loader import load_rules
from tests.pipeline import delta_rows, publish, running_engine, running_ingest, table_rows, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.mqtt, pytest.mark.slow]

RULES = """
CREATE STREAM traffic (station INT, speed DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings';
"""
TOPIC = "lookout/traffic/4/readings"
ROUND = 20


def landed(folder: Path) -> dict[str, bytes]:
    """The landing files under `folder` (any depth), by name, with their bytes."""
    return {p.name: p.read_bytes() for p in folder.rglob("part-*.jsonl")}


@pytest.mark.parametrize("archive", [False, True], ids=["delete", "archive"])
def test_committed_landing_files_leave_the_landing_folder(
    spark, mosquitto, lookout_config, tmp_path, archive
):
    archive_dir = tmp_path / "landing-archive"
    engine = replace(lookout_config.engine, landing_archive=str(archive_dir) if archive else "")
    lookout_config = replace(lookout_config, engine=engine)
    rules_file = tmp_path / "traffic.sql"
    rules_file.write_text(RULES)
    rule_set = load_rules([rules_file])
    landing = Path(lookout_config.landing)
    now = int(time.time() * 1000)
    first_round: dict[str, bytes] = {}

    with (
        running_ingest(lookout_config, rule_set),
        running_engine(lookout_config, rule_set, spark) as job,
    ):
        for r in range(3):
            seqs = range(r * ROUND, (r + 1) * ROUND)
            readings = [
                {"station": 4, "speed": 20.0 + s, "ts": now + s, "source": "s4", "seq": s}
                for s in seqs
            ]
            publish(mosquitto, [(TOPIC, orjson.dumps(x)) for x in readings])
            wait_for(
                lambda n=(r + 1) * ROUND: len(delta_rows(lookout_config, "readings_traffic")) >= n,
                60,
                f"round {r + 1} in readings_traffic",
                engine=job,
            )
            if r == 0:
                first_round = landed(landing)
        assert first_round, "the first round must have landed as files"
        wait_for(
            lambda: not set(first_round) & set(landed(landing)),
            60,
            "the first round's landing files to leave the landing folder",
            engine=job,
        )

    stored = table_rows(spark, lookout_config, "readings_traffic")
    assert sorted(r["seq"] for r in stored) == list(range(3 * ROUND))
    if archive:
        archived = landed(archive_dir)
        assert {name: archived.get(name) for name in first_round} == first_round
    else:
        assert not archive_dir.exists()
