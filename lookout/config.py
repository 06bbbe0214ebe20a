"""Configuration: one TOML file plus environment overrides.

The file is `lookout.toml` in the working directory (or the path in ``LOOKOUT_CONFIG``).
Any key can be overridden as ``LOOKOUT_<SECTION>_<KEY>`` (upper case), which is how
secrets such as the MQTT password reach the processes without being written down.
Every value is checked against its field's type hint and, where one is obvious, its
range; a wrong value, an unknown section or key and a TOML syntax error raise
`ConfigError`, which names the file and line (or the environment variable).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Collection, Mapping
from dataclasses import Field, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, get_type_hints

from rules.language.access import LIBRARY_MODULES, MAX_TABLE_BYTES, RulePolicy

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@dataclass(frozen=True)
class MqttConfig:
    """How to reach the broker."""

    host: str = "127.0.0.1"
    port: int = 1883
    username: str = ""
    password: str = field(default="", repr=False)
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = field(default="", repr=False)
    qos: int = 1
    # The installation's generated broker logins and client-id secret (lookout.mqtt_auth):
    # used for whatever username is left empty above.
    credentials_file: str = ".lookout/mqtt-credentials"


@dataclass(frozen=True)
class StreamClock:
    """How far a stream's timestamps may be from ingest's wall clock:
    `[ingest.streams.<name>]`, each key defaulting to `[ingest]`'s."""

    max_future_ms: int
    max_past_days: int


@dataclass(frozen=True)
class IngestConfig:
    """When a landing file is closed and what a payload may be."""

    flush_ms: int = 200
    flush_messages: int = 5000
    max_payload_bytes: int = 1_048_576
    # A reading or heartbeat stamped further ahead of ingest's clock than this is
    # quarantined: one bad clock would otherwise make its stream's later readings late.
    max_future_ms: int = 300_000
    max_past_days: int = 3650
    # Text fields (ids, `source`, `epoch`, STRING columns) and topics longer than this
    # are quarantined.
    max_string_chars: int = 256
    # Quarantine keeps this much of a rejected payload, with its full size and SHA-256.
    quarantine_payload_bytes: int = 4096
    # Where ingest lands (empty: <lakehouse>/_landing); s3://bucket/prefix for object
    # storage, reached as [s3] says.
    landing_url: str = ""
    # Prometheus metrics of `lookout ingest` at http://metrics_address:metrics_port/metrics
    # (0: none; several ingesters on one machine each need a port of their own).
    metrics_address: str = "127.0.0.1"
    metrics_port: int = 9811
    # [ingest.streams.<name>]: the clock limits of the streams that differ from the above.
    streams: Mapping[str, StreamClock] = field(default_factory=dict)


@dataclass(frozen=True)
class S3Config:
    """How to reach S3 or an S3-compatible server (MinIO, Ceph, moto) when the lakehouse
    or the landing is an `s3://` URL: one place that ingest, the engine (delta-rs and
    Spark) and the dashboard all read. Empty keys: AWS's usual chain (AWS_ACCESS_KEY_ID
    and AWS_SECRET_ACCESS_KEY, profiles, instance roles)."""

    endpoint: str = ""  # http(s)://host:port; empty for AWS itself
    region: str = "us-east-1"
    access_key: str = ""
    secret_key: str = field(default="", repr=False)


@dataclass(frozen=True)
class StreamKeys:
    """How many keys the rules reading a source stream may hold state for:
    `[engine.streams.<name>]`, defaulting to `[engine]`'s."""

    max_live_keys: int


@dataclass(frozen=True)
class EngineConfig:
    """The Spark job's resources and pace."""

    master: str = "local[2]"
    # The driver JVM's heap; in local mode it runs the executors and their state stores
    # too. Spark's 1g default ran out at 20k readings/s, sending state to Python workers.
    driver_memory: str = "4g"
    # One state store task per partition per batch. On one machine one: the batch's
    # stateful task then gets the Python worker that ran the last one, pipelines in
    # memory (docs/runtime.md); a cluster wants about 2x its executor cores.
    shuffle_partitions: int = 1
    # A batch every so often when there are new landing files: a reading waits up to
    # this long before its batch starts.
    trigger_seconds: float = 0.5
    # Each batch appends a small file per table, and a table's appends slow down with
    # its files (engine/maintenance.py): compact every table this often (0: never), when
    # it holds at least this many files.
    compact_every_seconds: float = 300.0
    compact_min_files: int = 64
    # Landing files the engine has committed leave the landing folder, which its
    # source lists whole every batch (20,000 files: 0.45 s a batch): empty = deleted (their
    # readings are in Delta), a path = moved there, for an archive of the raw input.
    landing_archive: str = ""
    # Prometheus metrics of `lookout engine` at http://metrics_address:metrics_port/metrics
    # (0: none).
    metrics_address: str = "127.0.0.1"
    metrics_port: int = 9810
    # Each rule reading a source stream holds state for at most this many keys (its
    # PARTITION BY / GROUP BY values) at once: a reading of a new key beyond it is
    # quarantined, naming the stream, the cap and the key (0: no cap). Idle keys are
    # evicted, so this bounds the keys live at once, not the keys ever seen.
    max_live_keys: int = 500_000
    # [engine.streams.<name>]: the caps of the streams that differ from the above.
    streams: Mapping[str, StreamKeys] = field(default_factory=dict)
    # A new or edited rule starts with its windows filled from the stored readings
    # (engine/warm_start.py): their reach, plus this much more history, whose rows of the
    # rule's new derived streams are written (a window bounded by rows, not time, reaches
    # back this far). 0: windows of time only, nothing of the past written.
    backfill_minutes: float = 60.0
    # Also write the alerts a new rule would have raised over that history.
    backfill_alerts: bool = False
    # How often the engine looks for changed rule files (a change that passes the check
    # is applied without a restart; 0: never, rules load at start only).
    rules_poll_seconds: float = 1.0

    def live_key_caps(self, streams: Collection[str]) -> dict[str, int]:
        """Each of ``streams``' cap on live keys (streams without one left out)."""
        caps = {}
        for name in streams:
            own = self.streams.get(name)
            cap = own.max_live_keys if own is not None else self.max_live_keys
            if cap:
                caps[name] = cap
        return caps


@dataclass(frozen=True)
class DashboardConfig:
    """Where the Streamlit app listens, how often it refreshes, what its pages show."""

    address: str = "127.0.0.1"
    port: int = 8501
    refresh_seconds: float = 2.0
    congestion_rule: str = "congestion"  # alert keyed by station: colours it congested
    theft_rule: str = "larceny"  # alert keyed by door: the RFID page's theft alarms
    congested_minutes: float = 15.0
    silent_minutes: float = 5.0
    down_after_seconds: float = 15.0
    # Sign-in: the users of `users_file` (scrypt hashes, `lookout dashboard-user NAME`)
    # and `operator` with the password in LOOKOUT_DASHBOARD_PASSWORD. false: no sign-in,
    # which `lookout dashboard` accepts on a loopback address only.
    login: bool = True
    users_file: str = ".lookout/dashboard-users"


@dataclass(frozen=True)
class AlertmanagerConfig:
    """Where incidents are routed: an Alertmanager's v2 API, fed by `lookout notify`."""

    enabled: bool = True
    # `lookout demo` starts its own Alertmanager here when nothing listens yet.
    url: str = "http://127.0.0.1:9820"
    # The notifier reads the incidents table this often, and posts firing incidents
    # again every resend_seconds (Prometheus' resend delay); each says it ends 4
    # resends later, so Alertmanager resolves an incident whose notifier has gone.
    poll_seconds: float = 2.0
    resend_seconds: float = 60.0
    # A failed post is retried after poll_seconds, doubling up to this.
    max_backoff_seconds: float = 60.0
    timeout_seconds: float = 10.0
    # Each alert's link back (generatorURL); empty: the dashboard at [dashboard]'s address.
    dashboard_url: str = ""


@dataclass(frozen=True)
class HealthConfig:
    """When health turns red (`lookout.health.problems`): the share of a stream's
    arrivals in the last `window_seconds` that were late, duplicates or conflicts (of
    every payload, for quarantine), and how long a stream's clock may stand still while
    its readings keep arriving."""

    window_seconds: float = 60.0
    # A share counts only once this many such readings (or payloads) are in the window,
    # so a single late reading of a quiet stream is not an alarm.
    min_events: int = 10
    max_late_share: float = 0.05
    max_duplicate_share: float = 0.05
    max_conflict_share: float = 0.01
    max_quarantine_share: float = 0.05
    clock_stall_seconds: float = 60.0


@dataclass(frozen=True)
class RulesConfig:
    """Where the rules are, and what they may reach beyond their folders' own files
    (`rules.language.access`)."""

    # The rule library: loaded, never written by the dashboard.
    paths: tuple[str, ...] = ("rules",)
    # The users' rule store: the folder the dashboard's Rules page writes, loaded with
    # the library once it exists.
    user_path: str = "rules.d"
    # Modules (and packages) aggregates may be imported from besides the rule folders.
    python_modules: tuple[str, ...] = LIBRARY_MODULES
    # The largest reference table (CSV file, or a Delta table's data files) read.
    max_table_bytes: int = MAX_TABLE_BYTES


@dataclass(frozen=True)
class Config:
    """The whole configuration of one Lookout installation."""

    lakehouse: str = "./lakehouse"
    rules: RulesConfig = RulesConfig()
    mqtt: MqttConfig = MqttConfig()
    ingest: IngestConfig = IngestConfig()
    engine: EngineConfig = EngineConfig()
    dashboard: DashboardConfig = DashboardConfig()
    health: HealthConfig = HealthConfig()
    s3: S3Config = S3Config()
    alertmanager: AlertmanagerConfig = AlertmanagerConfig()

    @property
    def landing(self) -> str:
        """Where ingest lands readings for the Spark job: `ingest.landing_url` (e.g. an
        `s3://` prefix) when set, else `_landing` inside the lakehouse."""
        if self.ingest.landing_url:
            return self.ingest.landing_url
        return f"{self.lakehouse.rstrip('/')}/_landing"

    def table(self, name: str) -> str:
        """Location of the Delta table `name` in the lakehouse."""
        return f"{self.lakehouse.rstrip('/')}/{name}"

    @property
    def rule_paths(self) -> tuple[str, ...]:
        """The rule set the engine and ingest load: the library's folders and the user
        rule store (when it exists yet)."""
        store = (self.rules.user_path,) if Path(self.rules.user_path).is_dir() else ()
        return (*self.rules.paths, *store)

    @property
    def rule_policy(self) -> RulePolicy:
        """What the rules may reach besides their own folders: the allowed Python
        modules, Delta tables in the lakehouse, tables up to the configured size."""
        return RulePolicy(self.rules.python_modules, (self.lakehouse,), self.rules.max_table_bytes)


class ConfigError(ValueError):
    """The configuration cannot be used. Each line of the message is one problem and says
    where it is: ``file:line: [section] key = value: expected ...``, or the environment
    variable that set the value."""


# Config's plain fields each live in a one-key section of the file.
_PLAIN_FIELDS: dict[str, tuple[str, str]] = {
    "lakehouse": ("lakehouse", "path"),
}

# What a field of each supported type must hold, as the messages say it.
_EXPECTED: dict[Any, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    tuple[str, ...]: "a list of strings",
}
# A bool from the environment; any other word is refused rather than read as false.
_ENV_TRUE = {"1", "true", "yes", "on"}
_ENV_FALSE = {"0", "false", "no", "off"}


class _Limit(NamedTuple):
    """The values of a field's type that can work, beyond the type itself."""

    allows: Callable[[Any], bool]
    text: str  # completes "expected an integer ...", "expected a number ..."


_PORT = _Limit(lambda port: 1 <= port <= 65535, "from 1 to 65535")
_POSITIVE = _Limit(lambda number: number > 0, "greater than 0")
_NOT_NEGATIVE = _Limit(lambda number: number >= 0, "of 0 or more")
_NOT_EMPTY = _Limit(lambda value: len(value) > 0, "that is not empty")
_JVM_SIZE_PATTERN = re.compile(r"\s*(\d+)\s*([kmgt]?)b?\s*", re.IGNORECASE)
_JVM_SIZE = _Limit(
    lambda value: _JVM_SIZE_PATTERN.fullmatch(value) is not None,
    "like 4g or 512m (a JVM memory size)",
)


def jvm_mebibytes(size: str) -> int:
    """A JVM memory size as Spark's settings write it (`4g`, `512m`, `1t`; bytes when
    bare) in MiB, rounded down."""
    match = _JVM_SIZE_PATTERN.fullmatch(size)
    if match is None:
        raise ValueError(f"not a JVM memory size: {size!r} (expected e.g. 4g or 512m)")
    shift = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[match.group(2).lower()]
    return int(match.group(1)) << shift >> 20


# Ranges where a value outside cannot work (how each field is used decides); a field
# not listed is checked for its type only.
_LIMITS: dict[tuple[str, str], _Limit] = {
    ("lakehouse", "path"): _NOT_EMPTY,
    ("rules", "paths"): _NOT_EMPTY,
    ("rules", "user_path"): _NOT_EMPTY,
    ("rules", "max_table_bytes"): _POSITIVE,
    ("mqtt", "host"): _NOT_EMPTY,
    ("alertmanager", "url"): _NOT_EMPTY,
    ("alertmanager", "poll_seconds"): _POSITIVE,
    ("alertmanager", "resend_seconds"): _POSITIVE,
    ("alertmanager", "max_backoff_seconds"): _POSITIVE,
    ("alertmanager", "timeout_seconds"): _POSITIVE,
    ("mqtt", "port"): _PORT,
    ("mqtt", "qos"): _Limit(lambda qos: qos in (0, 1, 2), "(0, 1 or 2)"),
    # 0 ms or 0 messages would make the landing loop spin without ever waiting.
    ("ingest", "flush_ms"): _POSITIVE,
    ("ingest", "flush_messages"): _POSITIVE,
    ("ingest", "max_payload_bytes"): _POSITIVE,
    ("ingest", "max_future_ms"): _NOT_NEGATIVE,  # 0: nothing ahead of ingest's clock
    ("ingest", "max_past_days"): _POSITIVE,  # 0 would quarantine every reading
    ("ingest", "max_string_chars"): _POSITIVE,
    ("ingest", "quarantine_payload_bytes"): _POSITIVE,
    ("engine", "master"): _NOT_EMPTY,
    ("engine", "driver_memory"): _JVM_SIZE,
    ("engine", "shuffle_partitions"): _POSITIVE,
    ("engine", "trigger_seconds"): _NOT_NEGATIVE,  # 0: Spark's "next batch at once"
    ("engine", "compact_every_seconds"): _NOT_NEGATIVE,  # 0: never compact
    ("engine", "compact_min_files"): _POSITIVE,
    ("engine", "max_live_keys"): _NOT_NEGATIVE,  # 0: no cap
    ("engine", "backfill_minutes"): _NOT_NEGATIVE,
    ("engine", "rules_poll_seconds"): _NOT_NEGATIVE,
    ("ingest", "metrics_address"): _NOT_EMPTY,
    ("ingest", "metrics_port"): _Limit(lambda port: 0 <= port <= 65535, "(0: none, or a port)"),
    ("engine", "metrics_address"): _NOT_EMPTY,
    ("engine", "metrics_port"): _Limit(lambda port: 0 <= port <= 65535, "(0: none, or a port)"),
    ("dashboard", "address"): _NOT_EMPTY,
    ("dashboard", "port"): _PORT,
    ("dashboard", "refresh_seconds"): _POSITIVE,
    ("dashboard", "congested_minutes"): _POSITIVE,
    ("dashboard", "silent_minutes"): _POSITIVE,
    ("dashboard", "down_after_seconds"): _POSITIVE,
    ("dashboard", "users_file"): _NOT_EMPTY,
    ("health", "window_seconds"): _POSITIVE,
    ("health", "min_events"): _POSITIVE,
    ("health", "max_late_share"): _NOT_NEGATIVE,
    ("health", "max_duplicate_share"): _NOT_NEGATIVE,
    ("health", "max_conflict_share"): _NOT_NEGATIVE,
    ("health", "max_quarantine_share"): _NOT_NEGATIVE,
    ("health", "clock_stall_seconds"): _POSITIVE,
}


class _Setting(NamedTuple):
    """One key of the configuration file and what it must hold."""

    section: str
    key: str
    kind: Any  # the field's type hint, one of _EXPECTED's
    limit: _Limit | None
    secret: bool  # repr=False on its field: its value never appears in a message

    @property
    def env_var(self) -> str:
        """The environment variable that overrides this key."""
        return f"LOOKOUT_{self.section.upper()}_{self.key.upper()}"

    @property
    def expected(self) -> str:
        """What a value must be, e.g. "an integer from 1 to 65535"."""
        limit = f" {self.limit.text}" if self.limit else ""
        return f"{_EXPECTED[self.kind]}{limit}"

    def show(self, value: Any) -> str:
        """`value` as the message quotes it: TOML-like, secrets hidden."""
        return "(hidden)" if self.secret else json.dumps(value, default=str)


class _Section(NamedTuple):
    """One section of the file: the Config field it fills and its keys."""

    name: str
    config_field: str
    cls: type | None  # the section's dataclass; None for a plain field's one-key section
    settings: tuple[_Setting, ...]


def _setting(section: str, key: str, owner: type, field_: Field[Any], kind: Any) -> _Setting:
    """The file's `[section] key` for the dataclass field `field_` of `owner`."""
    if kind not in _EXPECTED:
        readable = ", ".join(map(str, _EXPECTED))
        raise TypeError(f"{owner.__name__}.{field_.name}: load_config reads only {readable}")
    return _Setting(section, key, kind, _LIMITS.get((section, key)), not field_.repr)


def _sections() -> dict[str, _Section]:
    """Every section the file may hold, derived from Config's fields and type hints."""
    sections: dict[str, _Section] = {}
    config_hints = get_type_hints(Config)
    for config_field in fields(Config):
        kind = config_hints[config_field.name]
        if isinstance(kind, type) and is_dataclass(kind):
            hints = get_type_hints(kind)
            settings = tuple(
                _setting(config_field.name, f.name, kind, f, hints[f.name])
                for f in fields(kind)
                if (config_field.name, f.name) not in _PER_NAME
            )
            sections[config_field.name] = _Section(
                config_field.name, config_field.name, kind, settings
            )
        else:
            if config_field.name not in _PLAIN_FIELDS:
                raise TypeError(
                    f"Config.{config_field.name}: say in _PLAIN_FIELDS which key holds it"
                )
            name, key = _PLAIN_FIELDS[config_field.name]
            setting = _setting(name, key, Config, config_field, kind)
            sections[name] = _Section(name, config_field.name, None, (setting,))
    keys = {(setting.section, setting.key) for s in sections.values() for setting in s.settings}
    for (section, key), cls in _PER_NAME.items():
        if not {(section, name) for name in cls.__dataclass_fields__} <= keys:
            raise TypeError(f"[{section}.{key}.<name>] may only override [{section}]'s keys")
    if _LIMITS.keys() - keys:
        raise TypeError(f"_LIMITS names keys no section has: {sorted(_LIMITS.keys() - keys)}")
    return sections


# Sub-tables of a section, one per named thing, each overriding some of the section's
# own keys for that thing: `[ingest.streams.<stream>]`. Read from the file only.
_PER_NAME: dict[tuple[str, str], type[DataclassInstance]] = {
    ("ingest", "streams"): StreamClock,
    ("engine", "streams"): StreamKeys,
}

_SECTIONS = _sections()


def _from_toml(value: Any, kind: Any) -> Any:
    """`value` as tomllib read it, as a field of type `kind` holds it; ValueError if it is
    not one. A bool is not an integer here (Python says it is); an integer is a number."""
    if kind is bool and isinstance(value, bool):
        return value
    if isinstance(value, bool):
        raise ValueError(value)
    if kind is int and isinstance(value, int):
        return value
    if kind is float and isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    if (
        kind == tuple[str, ...]
        and isinstance(value, list)
        and all(isinstance(item, str) for item in value)
    ):
        return tuple(value)
    raise ValueError(value)


def _from_env(text: str, kind: Any) -> Any:
    """An environment variable's text as a field of type `kind` holds it; ValueError if it
    is not one. A list is comma-separated."""
    if kind is bool:
        word = text.strip().lower()
        if word not in _ENV_TRUE | _ENV_FALSE:
            raise ValueError(text)
        return word in _ENV_TRUE
    if kind is int:
        return int(text)
    if kind is float:
        number = float(text)
        if not math.isfinite(number):
            raise ValueError(text)
        return number
    if kind == tuple[str, ...]:
        return tuple(part.strip() for part in text.split(",") if part.strip())
    return text


def _valid(setting: _Setting, value: Any, convert: Callable[[Any, Any], Any]) -> Any:
    """`value` converted to the setting's type; ValueError if it is not one or out of range."""
    try:
        converted = convert(value, setting.kind)
    except OverflowError as exc:  # an integer too large for a float
        raise ValueError(value) from exc
    if setting.limit and not setting.limit.allows(converted):
        raise ValueError(value)
    return converted


_HEADER = re.compile(r"\s*\[\s*([\w.-]+)\s*\]\s*(?:#.*)?$")


class _File(NamedTuple):
    """The configuration file's path and text, to say where a problem is."""

    path: Path
    text: str

    def line_of(self, section: str | None, key: str | None) -> int | None:
        """The line (from 1) setting `key =` inside `[section]` (section None: before any
        header), or opening `[section]` when key is None. tomllib gives no positions, so
        this scans the text, and answers only when exactly one line matches rather than
        risk pointing at the wrong one."""
        assignment = re.compile(rf"\s*{re.escape(key)}\s*=") if key else None
        current: str | None = None
        matches = []
        for number, line in enumerate(self.text.splitlines(), start=1):
            if line.lstrip().startswith("["):
                header = _HEADER.match(line)
                current = header.group(1) if header else "["  # a header the scan does not follow
                if key is None and current == section:
                    matches.append(number)
            elif assignment and current == section and assignment.match(line):
                matches.append(number)
        return matches[0] if len(matches) == 1 else None

    def where(self, section: str | None, key: str | None = None) -> str:
        """`path:line` of a key or section header, or just the path if the line is not clear."""
        line = self.line_of(section, key)
        return f"{self.path}:{line}" if line else str(self.path)


def _did_you_mean(word: str, known: Collection[str], form: str = "{}") -> str:
    """A "did you mean" for a close match among `known`, else the list of them."""
    close = difflib.get_close_matches(word, known, n=1)
    if close:
        return f"; did you mean {form.format(close[0])}?"
    return f" (known: {', '.join(form.format(name) for name in sorted(known))})"


def _read_section(
    section: _Section, table: dict[str, Any], file: _File, problems: list[str]
) -> dict[str, Any]:
    """The values the file's `table` and the environment set for `section`'s keys (an
    environment variable wins). Every wrong or unknown key goes to `problems` instead."""
    values: dict[str, Any] = {}
    for setting in section.settings:
        if setting.key in table:
            given = table[setting.key]
            try:
                values[setting.key] = _valid(setting, given, _from_toml)
            except ValueError:
                problems.append(
                    f"{file.where(section.name, setting.key)}: [{section.name}] {setting.key} = "
                    f"{setting.show(given)}: expected {setting.expected}"
                )
        text = os.environ.get(setting.env_var)
        if text is not None:
            try:
                values[setting.key] = _valid(setting, text, _from_env)
            except ValueError:
                shown = "(hidden)" if setting.secret else text
                problems.append(f"{setting.env_var}={shown}: expected {setting.expected}")
    keys = [setting.key for setting in section.settings]
    for key in table:
        if (section.name, key) in _PER_NAME:
            values[key] = _read_per_name(section, key, table[key], values, file, problems)
        elif section.name == "ingest" and key in _RETIRED_INGEST_KEYS:
            problems.append(f"{file.where(section.name, key)}: {_retired(f'[ingest] {key}', key)}")
        elif key not in keys:
            problems.append(
                f"{file.where(section.name, key)}: unknown key [{section.name}] {key}"
                + _did_you_mean(key, keys)
            )
    return values


def _read_per_name(
    section: _Section,
    key: str,
    tables: Any,
    section_values: dict[str, Any],
    file: _File,
    problems: list[str],
) -> dict[str, Any]:
    """`[section.key.<name>]` tables: per name, the section's own values (file, then
    environment, then default) overridden by that table's. Wrong keys and values go to
    `problems`."""
    cls = _PER_NAME[(section.name, key)]
    names = list(cls.__dataclass_fields__)
    settings = {s.key: s for s in section.settings if s.key in names}
    assert section.cls is not None
    defaults = section.cls()
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        problems.append(
            f"{file.where(section.name, key)}: [{section.name}] {key} must be tables, "
            f"[{section.name}.{key}.<name>]"
        )
        return {}
    per_name = {}
    for name, table in tables.items():
        where = f"{section.name}.{key}.{name}"
        overrides = {}
        for setting_key, given in table.items():
            setting = settings.get(setting_key)
            if setting is None:
                problems.append(
                    f"{file.where(where, setting_key)}: unknown key [{where}] {setting_key}"
                    + _did_you_mean(setting_key, names)
                )
                continue
            try:
                overrides[setting_key] = _valid(setting, given, _from_toml)
            except ValueError:
                problems.append(
                    f"{file.where(where, setting_key)}: [{where}] {setting_key} = "
                    f"{setting.show(given)}: expected {setting.expected}"
                )
        inherited = {n: section_values.get(n, getattr(defaults, n)) for n in names}
        per_name[name] = cls(**{**inherited, **overrides})
    return per_name


# Keys `[ingest]` once had, and what replaced each. The S3 settings were `[ingest] s3_*`
# while only ingest's landing used them.
_RETIRED_INGEST_KEYS = {
    **{
        f"s3_{name}": (
            f"has moved to [s3] {name} (environment: LOOKOUT_S3_{name.upper()}): "
            "ingest, the engine and the dashboard now share one [s3] section"
        )
        for name in S3Config.__dataclass_fields__
    },
    "max_clock_distance_days": (
        "is replaced by two keys: max_past_days (how old a timestamp may be, in days) and "
        "max_future_ms (how far ahead of ingest's clock, in milliseconds)"
    ),
}


def _retired(given: str, old_key: str) -> str:
    """What replaced a retired `[ingest]` key given (`given`: the key or variable)."""
    return f"{given} {_RETIRED_INGEST_KEYS[old_key]}"


def _top_level_problems(raw: dict[str, Any], file: _File) -> list[str]:
    """Unknown sections, and values set outside any section."""
    problems = []
    for name, value in raw.items():
        if isinstance(value, dict):
            if name not in _SECTIONS:
                suggestion = _did_you_mean(name, _SECTIONS, "[{}]")
                problems.append(f"{file.where(name)}: unknown section [{name}]{suggestion}")
        elif name in _SECTIONS:
            where = file.where(None, name)
            problems.append(
                f"{where}: {name} is set outside a section: expected a [{name}] section"
            )
        else:
            suggestion = _did_you_mean(name, _SECTIONS, "[{}]")
            problems.append(
                f"{file.where(None, name)}: unknown key {name} outside any section{suggestion}"
            )
    return problems


def _parse(file: _File) -> dict[str, Any]:
    """The file's TOML; a syntax error becomes a ConfigError saying `path:line:column:`."""
    try:
        return tomllib.loads(file.text)
    except tomllib.TOMLDecodeError as exc:
        position = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", str(exc))
        if position:
            message, line, column = position.groups()
            raise ConfigError(f"{file.path}:{line}:{column}: {message} (TOML syntax)") from exc
        raise ConfigError(f"{file.path}: {exc} (TOML syntax)") from exc


def _read_file(path: Path) -> _File:
    """The file's text; empty (all defaults) when there is no file."""
    try:
        return _File(path, path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return _File(path, "")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Read the configuration file (missing file = defaults) and apply environment overrides.

    Raises ConfigError naming every unknown section or key, wrong value (its file and
    line, or its environment variable, and what was expected) and TOML syntax error.
    """
    file = _read_file(Path(path or os.environ.get("LOOKOUT_CONFIG", "lookout.toml")))
    raw = _parse(file)
    problems = _top_level_problems(raw, file)
    problems += [
        _retired(variable, old)
        for old in _RETIRED_INGEST_KEYS
        if (variable := f"LOOKOUT_INGEST_{old.upper()}") in os.environ
    ]
    sections: dict[str, Any] = {}
    for section in _SECTIONS.values():
        table = raw.get(section.name)
        values = _read_section(section, table if isinstance(table, dict) else {}, file, problems)
        if section.cls is not None:
            sections[section.config_field] = section.cls(**values)
        elif values:
            sections[section.config_field] = values[section.settings[0].key]
    if problems:
        raise ConfigError("\n".join(problems))
    return Config(**sections)
