"""The engine says at start which rules start afresh: the ones edited or removed since
it last started on the lakehouse, and no others."""

from __future__ import annotations

from pathlib import Path

from engine.spark.rule_changes import record_rule_changes
from lookout.config import Config
from rules.language.loader import load_rules
from tests.rules.helpers import TRAFFIC

RULES = {
    "speed": "CREATE STREAM speed AS SELECT station, ts, "
    "avg(speed) OVER (PARTITION BY station ROWS 3 PRECEDING) AS v FROM traffic;",
    "volume": "CREATE STREAM volume AS SELECT station, ts, "
    "count(*) OVER (PARTITION BY station RANGE 1 MINUTE PRECEDING) AS n FROM traffic;",
    "slow": "CREATE ALERT slow SEVERITY warning AS SELECT station, ts, v FROM speed WHERE v < 5;",
}


def changes(tmp_path: Path, config: Config, rules: dict[str, str]) -> list[str]:
    path = tmp_path / "rules.sql"
    path.write_text(TRAFFIC + "\n".join(rules.values()))
    return record_rule_changes(config, load_rules([path]).plan)


def test_edited_and_removed_rules_are_named_once(tmp_path: Path) -> None:
    config = Config(lakehouse=str(tmp_path / "lake"))
    assert changes(tmp_path, config, RULES) == [], "a new lakehouse has nothing to resume"
    # Laid out anew: nothing changes.
    relaid = {
        name: f"-- {name}\n\n" + text.replace(" AS ", "\n   AS ") for name, text in RULES.items()
    }
    assert changes(tmp_path, config, relaid) == []
    edited = {**RULES, "speed": RULES["speed"].replace("ROWS 3", "ROWS 4")}
    del edited["volume"]
    said = changes(tmp_path, config, edited)
    assert len(said) == 2
    assert "'speed' has been edited" in said[0] and "'volume' is no longer" in said[1]
    # Said once: the next start compares with this one's rules.
    assert changes(tmp_path, config, edited) == []
    # Added again, it was removed meanwhile: nothing of it is resumed, nothing to say.
    assert changes(tmp_path, config, {**edited, "volume": RULES["volume"]}) == []


def test_a_record_cut_short_or_not_a_record_is_read_as_none(tmp_path: Path) -> None:
    config = Config(lakehouse=str(tmp_path / "lake"))
    changes(tmp_path, config, RULES)
    record = tmp_path / "lake/_checkpoints/RULES.json"
    record.write_bytes(record.read_bytes()[:20])
    assert changes(tmp_path, config, {"speed": RULES["speed"]}) == []
    (said,) = changes(tmp_path, config, {})
    assert "'speed' is no longer in the rules" in said
    # JSON, but not a record of stages: read as none too, and replaced by one.
    record.write_bytes(b"[1, 2]")
    assert changes(tmp_path, config, RULES) == []
    assert changes(tmp_path, config, {}) != []
