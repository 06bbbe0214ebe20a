"""The user rule store: a file is checked with the whole rule set as the engine loads it,
saved whole under a lock (two sessions cannot both add the same name), its name checked
by the store itself; renames, disabling and deletions keep the rule set valid; every
change is logged with its user."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lookout.config import Config, RulesConfig
from lookout.services import load_rule_set
from rules.language.access import DEFAULT_POLICY
from rules.store import RuleNameError, RuleStore

STREAMS = "CREATE STREAM s (x INT, ts TIMESTAMP) ORDER BY ts SLACK 1 SECOND SOURCE 'a/+/b';\n"
ALERT = "CREATE ALERT small SEVERITY info AS SELECT x, ts FROM {source} WHERE x < 1;\n"


@pytest.fixture
def store(tmp_path: Path) -> RuleStore:
    """A store `rules.d` beside a library `lib` declaring stream `s` in `zzz.sql`."""
    library = tmp_path / "lib"
    library.mkdir()
    (library / "zzz.sql").write_text(STREAMS)
    return RuleStore(tmp_path / "rules.d", (library,), DEFAULT_POLICY)


def test_an_early_file_may_read_a_stream_of_a_later_one(store: RuleStore) -> None:
    # `aaa.sql` comes before `zzz.sql` by name, and reads its stream.
    assert store.save("aaa", ALERT.format(source="s"), "alice") == []
    config = Config(
        rules=RulesConfig(paths=tuple(map(str, store.library)), user_path=str(store.folder))
    )
    rule_set = load_rule_set(config, None)  # what the engine and ingest load
    assert [q.sink.name for q in rule_set.plan.queries] == ["small"]


def test_an_edit_is_checked_with_the_whole_rule_set_and_nothing_written(
    store: RuleStore,
) -> None:
    assert store.check("alerts", ALERT.format(source="s")) == []
    errors = store.check("alerts", ALERT.format(source="t"))
    assert [(e.file, e.line) for e in errors] == [("alerts.sql", 1)]
    assert store.save("alerts", ALERT.format(source="t"), "alice") == errors
    assert not (store.folder / "alerts.sql").exists()
    assert store.save("alerts", ALERT.format(source="s"), "alice") == []
    assert (store.folder / "alerts.sql").read_text() == ALERT.format(source="s")
    assert sorted(p.name for p in store.folder.iterdir()) == [
        ".changes.jsonl",
        ".lock",
        "alerts.sql",
    ]  # no temporary file left behind


@pytest.mark.parametrize(
    "name", ["../escaped", "sub/file", "/tmp/abs", "a.sql", "", "..", "x" * 65, "zzz"]
)
def test_the_store_refuses_a_name_that_is_no_plain_file_name(store: RuleStore, name: str) -> None:
    with pytest.raises(RuleNameError):
        store.save(name, ALERT.format(source="s"), "alice")
    with pytest.raises(RuleNameError):
        store.check(name, ALERT.format(source="s"))
    assert not (store.folder.parent / "escaped.sql").exists()
    assert (store.library[0] / "zzz.sql").read_text() == STREAMS  # the library is untouched
    assert not store.folder.exists() or not list(store.folder.glob("*.sql"))


def test_two_concurrent_saves_of_one_name_cannot_both_succeed(store: RuleStore) -> None:
    text = "CREATE STREAM twice AS SELECT x, ts FROM s;\n"
    start = threading.Barrier(2)
    results: dict[str, list[object]] = {}

    def save(name: str) -> None:
        start.wait()
        results[name] = list(store.save(name, text, name))

    threads = [threading.Thread(target=save, args=(name,)) for name in ("one", "two")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(len(errors) for errors in results.values()) == [0, 1]
    (errors,) = [e for e in results.values() if e]
    assert "duplicate name 'twice': already defined at " in str(errors[0])
    assert len(store.names()) == 1


def test_rename_disable_enable_delete_keep_the_rule_set_valid(store: RuleStore) -> None:
    assert store.save("streams", "CREATE STREAM t AS SELECT x, ts FROM s;\n", "alice") == []
    assert store.save("alerts", ALERT.format(source="t"), "bob") == []
    # `alerts` reads `t`: without `streams.sql` the rule set would not load.
    (refused,) = store.disable("streams", "bob")
    assert refused.file == "alerts.sql" and "unknown stream 't'" in refused.message
    (refused,) = store.delete("streams", "bob")
    assert store.names() == ["alerts", "streams"]

    assert store.rename("alerts", "my_alerts", "carol") == []
    with pytest.raises(RuleNameError, match="already has a rule file named `streams`"):
        store.rename("my_alerts", "streams", "carol")
    assert store.disable("my_alerts", "carol") == []
    assert (store.names(), store.disabled()) == (["streams"], ["my_alerts"])
    assert store.text("my_alerts") == ALERT.format(source="t")
    assert store.enable("my_alerts", "dave") == []
    assert store.disable("my_alerts", "dave") == []
    assert store.delete("my_alerts", "erin") == []
    assert (store.names(), store.disabled()) == (["streams"], [])

    log = [(c.user, c.action, c.file, c.to) for c in store.changes()]
    assert log == [
        ("erin", "deleted", "my_alerts.sql.disabled", ""),
        ("dave", "disabled", "my_alerts.sql", ""),
        ("dave", "enabled", "my_alerts.sql", ""),
        ("carol", "disabled", "my_alerts.sql", ""),
        ("carol", "renamed", "alerts.sql", "my_alerts.sql"),
        ("bob", "created", "alerts.sql", ""),
        ("alice", "created", "streams.sql", ""),
    ]
