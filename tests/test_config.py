"""`load_config`: every value checked against its field's type (and range), every problem
named with its file:line and `[section] key`, or its environment variable.

The fields come from the dataclasses themselves, so a field added later is covered here
without editing this file. The type oracle (`fits`) is written from the file format's
rules, not from the loader's code.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, NamedTuple, get_origin, get_type_hints

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lookout.cli import main
from lookout.config import (
    Config,
    ConfigError,
    StreamClock,
    StreamKeys,
    jvm_mebibytes,
    load_config,
)
from tests.examples import examples

ROOT = Path(__file__).resolve().parent.parent

# Config's plain fields and the one-key sections that hold them (README, lookout.toml).
PLAIN_FIELDS = {"lakehouse": ("lakehouse", "path")}


class Key(NamedTuple):
    """One key of the file, from the dataclasses: its section, name, type and default."""

    section: str
    name: str
    kind: Any
    default: Any

    @property
    def env_var(self) -> str:
        return f"LOOKOUT_{self.section.upper()}_{self.name.upper()}"


def config_keys() -> list[Key]:
    """Every key of the file, derived from Config's fields and type hints."""
    keys = []
    defaults = Config()
    for config_field in fields(Config):
        kind = get_type_hints(Config)[config_field.name]
        default = getattr(defaults, config_field.name)
        if is_dataclass(kind):
            hints = get_type_hints(kind)
            keys += [
                Key(config_field.name, f.name, hints[f.name], getattr(default, f.name))
                for f in fields(kind)
                if get_origin(hints[f.name]) is not Mapping  # per-name tables: tested below
            ]
        else:
            keys.append(Key(*PLAIN_FIELDS[config_field.name], kind, default))
    return keys


KEYS = config_keys()
SECTIONS = list(dict.fromkeys(key.section for key in KEYS))


def value_of(config: Config, key: Key) -> Any:
    """The value `config` holds for `key`."""
    for name, (section, key_name) in PLAIN_FIELDS.items():
        if (section, key_name) == (key.section, key.name):
            return getattr(config, name)
    return getattr(getattr(config, key.section), key.name)


def fits(value: Any, kind: Any) -> bool:
    """Whether a TOML value has the field's type (a bool is no integer; an integer is a
    number; inf and nan are no number a setting can use)."""
    if kind is bool:
        return type(value) is bool
    if kind is int:
        return type(value) is int
    if kind is float and type(value) is int:
        return abs(value) <= sys.float_info.max  # beyond it, no float holds it
    if kind is float:
        return type(value) is float and math.isfinite(value)
    if kind is str:
        return type(value) is str
    assert kind == tuple[str, ...], f"a field type this test does not know: {kind}"
    return type(value) is list and all(type(item) is str for item in value)


def toml(value: Any) -> str:
    """`value` written as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # inf, nan and 1e-05 are TOML as Python writes them
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # the text below has no DEL or surrogates
    if isinstance(value, list | tuple):
        return "[" + ", ".join(map(toml, value)) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{toml(k)} = {toml(v)}" for k, v in value.items()) + "}"


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cc", "Cs"]), max_size=8)
SCALARS = st.one_of(
    st.booleans(), st.integers(), st.floats(), TEXT, st.integers(-(10**400), 10**400)
)
TOML_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=2),
    max_leaves=5,
)


def config_text(key: Key, value: Any) -> tuple[str, int]:
    """A file setting `key` to `value` among every section, where every other section
    holding a key of the same name sets it to its default (the line must be found in the
    right section); and the line `key` is on."""
    lines = ["# a configuration written by the test", ""]
    target = 0
    for section in SECTIONS:
        lines.append(f"[{section}]")
        for other in KEYS:
            if other.section != section or other.name != key.name:
                continue
            if other == key:
                lines.append(f"{key.name} = {toml(value)}")
                target = len(lines)
            else:
                lines.append(f"{other.name} = {toml(other.default)}")
        lines.append("")
    return "\n".join(lines), target


def load_text(text: str) -> tuple[Path, Config | ConfigError]:
    """`load_config` over a file holding `text`: the path and the Config or the error."""
    folder = tempfile.mkdtemp(prefix="lookout-config-")
    path = Path(folder) / "lookout.toml"
    path.write_text(text, encoding="utf-8")
    try:
        return path, load_config(path)
    except ConfigError as err:
        return path, err
    finally:
        path.unlink()
        os.rmdir(folder)


@pytest.fixture(autouse=True)
def no_lookout_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test runner's own LOOKOUT_* variables must not change what is loaded."""
    for name in list(os.environ):
        if name.startswith("LOOKOUT_"):
            monkeypatch.delenv(name)


def test_every_config_field_is_a_section_or_a_known_plain_key() -> None:
    plain = [f.name for f in fields(Config) if not is_dataclass(get_type_hints(Config)[f.name])]
    assert set(plain) <= set(PLAIN_FIELDS), "say here (and in config.py) which key holds it"


def test_the_shipped_file_and_the_defaults_load_unchanged(tmp_path: Path) -> None:
    assert load_config(ROOT / "lookout.toml") == Config()
    assert load_config(tmp_path / "absent.toml") == Config()
    assert load_config(tmp_path / "absent.toml").engine.compact_every_seconds == 300.0


@pytest.mark.parametrize("key", KEYS, ids=lambda key: f"{key.section}.{key.name}")
def test_each_default_written_in_a_file_loads_as_the_default(key: Key) -> None:
    _, loaded = load_text(config_text(key, key.default)[0])
    assert loaded == Config()


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(KEYS), value=TOML_VALUES)
def test_a_value_of_the_wrong_type_names_file_line_key_value_and_what_was_expected(
    key: Key, value: Any
) -> None:
    text, line = config_text(key, value)
    path, loaded = load_text(text)
    # The right type loads as given, unless out of the key's range (refused like a wrong type).
    if fits(value, key.kind) and isinstance(loaded, Config):
        expected = getattr(key.kind, "__origin__", key.kind)(value)
        assert value_of(loaded, key) == expected
        assert type(value_of(loaded, key)) is getattr(key.kind, "__origin__", key.kind)
        return
    assert isinstance(loaded, ConfigError), f"{key.section}.{key.name} = {value!r} was accepted"
    message = str(loaded)
    assert message.startswith(f"{path}:{line}: [{key.section}] {key.name} = ")
    assert ": expected " in message
    assert len(message.splitlines()) == 1  # one problem, one line


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ("[engine]\ncompact_every_seconds = 0", True),  # 0: never compact
        ("[engine]\ntrigger_seconds = 0", True),
        ("[engine]\ncompact_every_seconds = -1", False),
        ("[engine]\nshuffle_partitions = 0", False),
        ("[engine]\ncompact_min_files = 0", False),
        ("[engine]\ntrigger_seconds = 1", True),  # an integer is a fine number
        ("[mqtt]\nport = 65535", True),
        ("[mqtt]\nport = 65536", False),
        ("[dashboard]\nport = 0", False),
        ("[mqtt]\nqos = 0", True),
        ("[mqtt]\nqos = 2", True),
        ("[mqtt]\nqos = 3", False),
        ("[mqtt]\nport = true", False),  # a bool is not an integer
        ("[ingest]\nflush_ms = 0", False),
        ("[ingest]\nflush_messages = 0", False),
        ("[ingest]\nmax_payload_bytes = 1", True),
        ("[dashboard]\nrefresh_seconds = 0.0", False),
        ("[lakehouse]\npath = ''", False),
        ("[rules]\npaths = []", False),
        ('[rules]\npaths = ["rules", "more"]', True),
        ("[engine]\ndriver_memory = '512m'", True),
        ("[engine]\ndriver_memory = '4G'", True),
        ("[engine]\ndriver_memory = '4 gigs'", False),
        ("[engine]\ndriver_memory = ''", False),
    ],
)
def test_ranges(text: str, accepted: bool) -> None:
    path, loaded = load_text(text)
    assert isinstance(loaded, Config) is accepted, loaded
    if not accepted:
        assert str(loaded).startswith(f"{path}:2: [")


@pytest.mark.parametrize(
    ("size", "mebibytes"),
    [("4g", 4096), ("512m", 512), ("1T", 1 << 20), ("2048k", 2), ("1048576", 1), ("3gb", 3072)],
)
def test_jvm_sizes_read_as_spark_writes_them(size: str, mebibytes: int) -> None:
    assert jvm_mebibytes(size) == mebibytes


def test_the_message_quotes_what_was_given_and_what_was_expected() -> None:
    path, loaded = load_text('# pace\n[engine]\n\ncompact_every_seconds = "300"\n')
    assert str(loaded) == (
        f'{path}:4: [engine] compact_every_seconds = "300": expected a number of 0 or more'
    )


def test_a_secret_is_never_quoted() -> None:
    _, loaded = load_text('[mqtt]\npassword = ["hunter2"]\n')
    assert "hunter2" not in str(loaded) and "[mqtt] password = (hidden)" in str(loaded)


def test_every_problem_is_reported_at_once() -> None:
    path, loaded = load_text("[mqtt]\nport = 'x'\nqos = 7\n[engin]\n")
    assert str(loaded).splitlines() == [
        f"{path}:4: unknown section [engin]; did you mean [engine]?",
        f'{path}:2: [mqtt] port = "x": expected an integer from 1 to 65535',
        f"{path}:3: [mqtt] qos = 7: expected an integer (0, 1 or 2)",
    ]


# -- environment overrides ---------------------------------------------------------


def other_valid(key: Key) -> Any:
    """A valid value other than the default (every range here is open upwards)."""
    if key.kind is bool:
        return not key.default
    if (key.section, key.name) == ("engine", "driver_memory"):
        return "2" + key.default  # a JVM memory size
    if key.kind is str:
        return key.default + "x"
    if key.kind == tuple[str, ...]:
        return (*key.default, "x")
    return key.default * 2 if key.default else key.default + 1


def env_text(value: Any) -> str:
    return ",".join(value) if isinstance(value, tuple) else str(value)


@pytest.mark.parametrize("key", KEYS, ids=lambda key: key.env_var)
def test_an_environment_variable_overrides_the_file(
    key: Key, monkeypatch: pytest.MonkeyPatch
) -> None:
    wanted = other_valid(key)
    monkeypatch.setenv(key.env_var, env_text(wanted))
    _, loaded = load_text(config_text(key, key.default)[0])
    assert isinstance(loaded, Config), loaded
    assert value_of(loaded, key) == wanted


NOT_A_NUMBER = st.from_regex(r"[A-Za-z]{1,8}", fullmatch=True)  # inf and nan are refused too
NUMERIC_KEYS = [key for key in KEYS if key.kind in (int, float, bool)]


@settings(max_examples=examples(100))
@given(key=st.sampled_from(NUMERIC_KEYS), text=NOT_A_NUMBER | st.just("2.5") | st.just(""))
def test_a_wrong_environment_value_names_the_variable(key: Key, text: str) -> None:
    if key.kind is bool and text.lower() in {"true", "false", "yes", "no", "on", "off"}:
        return
    if key.kind is float and text == "2.5":
        return
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv(key.env_var, text)
        _, loaded = load_text("")
    assert isinstance(loaded, ConfigError), f"{key.env_var}={text} was accepted"
    assert str(loaded).startswith(f"{key.env_var}={text}: expected ")


def test_the_briefs_example(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOKOUT_ENGINE_SHUFFLE_PARTITIONS", "two")
    _, loaded = load_text("")
    assert (
        str(loaded) == "LOOKOUT_ENGINE_SHUFFLE_PARTITIONS=two: expected an integer greater than 0"
    )


# -- unknown sections and keys, syntax ----------------------------------------------


def test_an_unknown_section_is_refused_with_a_suggestion() -> None:
    path, loaded = load_text("[engine]\nmaster = 'local[2]'\n\n[engin]\nshuffle_partitions = 4\n")
    assert str(loaded) == f"{path}:4: unknown section [engin]; did you mean [engine]?"


def test_an_unknown_key_is_refused_with_a_suggestion_or_the_known_keys() -> None:
    path, loaded = load_text("[mqtt]\nport = 1\n[engine]\nshuffle_partitons = 4\nzzz = 1\n")
    first, second = str(loaded).splitlines()
    assert (
        first
        == f"{path}:4: unknown key [engine] shuffle_partitons; did you mean shuffle_partitions?"
    )
    assert second.startswith(f"{path}:5: unknown key [engine] zzz (known: ")
    assert all(key.name in second for key in KEYS if key.section == "engine")


def test_a_value_outside_any_section_is_refused() -> None:
    path, loaded = load_text('lakehouse = "./x"\n')
    assert str(loaded) == (
        f"{path}:1: lakehouse is set outside a section: expected a [lakehouse] section"
    )


def test_a_toml_syntax_error_names_the_file_line_and_column() -> None:
    path, loaded = load_text("[engine]\nmaster = 'local[2]'\nshuffle_partitions = \n")
    assert isinstance(loaded, ConfigError)
    assert str(loaded).startswith(f"{path}:3:22: ")
    assert "TOML" in str(loaded)


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"^{tmp_path}: cannot be read"):
        load_config(tmp_path)  # a folder
    (tmp_path / "latin1.toml").write_bytes(b"# caf\xe9\n")
    with pytest.raises(ConfigError, match="is not UTF-8"):
        load_config(tmp_path / "latin1.toml")


# -- how the commands show it ------------------------------------------------------


def test_lookout_prints_the_problem_without_a_traceback_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "lookout.toml"
    bad.write_text("[engine]\ncompact_every_seconds = '300'\n")
    monkeypatch.setenv("LOOKOUT_CONFIG", str(bad))  # main() sets it; undone after the test
    assert main(["--config", str(bad), "ingest"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "lookout ingest: the configuration cannot be used:",
        f'{bad}:2: [engine] compact_every_seconds = "300": expected a number of 0 or more',
    ]


@pytest.mark.parametrize(
    "command",
    [[sys.executable, "-m", "lookout.cli", "dashboard"], [sys.executable, "-m", "ingest"]],
    ids=["lookout dashboard", "python -m ingest"],
)
def test_the_commands_exit_2_with_the_message(tmp_path: Path, command: list[str]) -> None:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "LOOKOUT_DASHBOARD_PORT": "http"}
    done = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "LOOKOUT_DASHBOARD_PORT=http: expected an integer from 1 to 65535" in done.stderr
    assert "Traceback" not in done.stderr


# -- per-stream tables ------------------------------------------------------------------


def test_a_stream_may_override_the_clock_limits() -> None:
    _, loaded = load_text(
        "[ingest]\nmax_past_days = 30\n\n"
        "[ingest.streams.traffic]\nmax_future_ms = 3600000\n\n"
        "[ingest.streams.tag_readings]\nmax_past_days = 2\n"
    )
    assert isinstance(loaded, Config)
    assert loaded.ingest.streams == {
        "traffic": StreamClock(max_future_ms=3_600_000, max_past_days=30),
        "tag_readings": StreamClock(max_future_ms=300_000, max_past_days=2),
    }


def test_a_stream_table_inherits_the_environment_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOKOUT_INGEST_MAX_FUTURE_MS", "1000")
    _, loaded = load_text("[ingest.streams.traffic]\nmax_past_days = 3\n")
    assert isinstance(loaded, Config)
    assert loaded.ingest.streams["traffic"] == StreamClock(max_future_ms=1000, max_past_days=3)


def test_a_wrong_stream_table_names_file_line_and_key() -> None:
    path, loaded = load_text(
        "[ingest.streams.traffic]\nmax_future_ms = -1\nmax_futur_ms = 5\nflush_ms = 1\n"
    )
    assert str(loaded).splitlines() == [
        f"{path}:2: [ingest.streams.traffic] max_future_ms = -1: expected an integer of 0 or more",
        f"{path}:3: unknown key [ingest.streams.traffic] max_futur_ms; did you mean max_future_ms?",
        f"{path}:4: unknown key [ingest.streams.traffic] flush_ms (known: max_future_ms, "
        "max_past_days)",
    ]
    path, loaded = load_text("[ingest]\nstreams = 3\n")
    assert str(loaded) == (f"{path}:2: [ingest] streams must be tables, [ingest.streams.<name>]")


def test_a_stream_may_have_its_own_cap_on_live_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOKOUT_ENGINE_MAX_LIVE_KEYS", "5000")
    _, loaded = load_text(
        "[engine.streams.traffic]\nmax_live_keys = 0\n\n"
        "[engine.streams.tag_readings]\nmax_live_keys = 200000\n"
    )
    assert isinstance(loaded, Config)
    assert loaded.engine.streams == {
        "traffic": StreamKeys(max_live_keys=0),
        "tag_readings": StreamKeys(max_live_keys=200_000),
    }
    caps = loaded.engine.live_key_caps(["traffic", "tag_readings", "positions"])
    assert caps == {"tag_readings": 200_000, "positions": 5000}  # 0: no cap
    assert Config().engine.live_key_caps(["traffic"]) == {"traffic": 500_000}
    path, loaded = load_text("[engine.streams.traffic]\nmax_live_keys = -1\n")
    assert str(loaded) == (
        f"{path}:2: [engine.streams.traffic] max_live_keys = -1: expected an integer of 0 or more"
    )


def test_the_engine_refuses_a_cap_for_a_stream_the_rules_do_not_declare() -> None:
    from engine.spark.job import EngineJob
    from rules.language.loader import load_rules

    _, loaded = load_text("[engine.streams.trafic]\nmax_live_keys = 1\n")
    assert isinstance(loaded, Config)
    with pytest.raises(ConfigError, match=r"\[engine.streams.trafic\]: the rules declare no"):
        EngineJob(loaded, load_rules([str(ROOT / "rules")]).plan, {}, spark=object())  # type: ignore[arg-type]


def test_the_old_clock_distance_key_says_what_replaced_it(monkeypatch: pytest.MonkeyPatch) -> None:
    path, loaded = load_text("[ingest]\nmax_clock_distance_days = 30\n")
    assert str(loaded) == (
        f"{path}:2: [ingest] max_clock_distance_days is replaced by two keys: max_past_days "
        "(how old a timestamp may be, in days) and max_future_ms (how far ahead of ingest's "
        "clock, in milliseconds)"
    )
    monkeypatch.setenv("LOOKOUT_INGEST_MAX_CLOCK_DISTANCE_DAYS", "30")
    _, loaded = load_text("")
    assert str(loaded).startswith("LOOKOUT_INGEST_MAX_CLOCK_DISTANCE_DAYS is replaced by")


def test_ingest_refuses_a_table_for_a_stream_the_rules_do_not_declare() -> None:
    from ingest.service import build_ingester
    from rules.language.loader import load_rules

    _, loaded = load_text("[ingest.streams.trafic]\nmax_future_ms = 1\n")
    assert isinstance(loaded, Config)
    with pytest.raises(ConfigError, match=r"\[ingest.streams.trafic\]: the rules declare no"):
        build_ingester(loaded, load_rules([str(ROOT / "rules")]))
