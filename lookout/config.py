"""Configuration: one TOML file plus environment overrides.

The file is `lookout.toml` in the working directory (or the path in ``LOOKOUT_CONFIG``).
Any key can be overridden as ``LOOKOUT_<SECTION>_<KEY>`` (upper case), which is how
secrets such as the MQTT password reach the processes without being written down.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


@dataclass(frozen=True)
class IngestConfig:
    """When a landing file is closed and what a payload may be."""

    flush_ms: int = 200
    flush_messages: int = 5000
    max_payload_bytes: int = 1_048_576
    max_clock_distance_days: int = 3650
    # Where ingest lands (empty: <lakehouse>/_landing); s3://bucket/prefix for object
    # storage, reached as [s3] says.
    landing_url: str = ""


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
class EngineConfig:
    """The Spark job's resources and pace."""

    master: str = "local[2]"
    # One state store task per partition per batch: as many as local[2]'s cores, so a
    # batch is one wave of tasks (a cluster wants about 2x its executor cores).
    shuffle_partitions: int = 2
    # An expiration alarm needs two rules batches after its readings land (Spark's
    # timers fire on the previous batch's watermark); at 0.5 s they run nearly back to
    # back. Alarm latency median 2.5 s at 1 s / 4 partitions -> 1.4-1.8 s (docs/runtime.md).
    trigger_seconds: float = 0.5
    # Each batch appends a small file per table, and a table's appends slow down with
    # its files (engine/maintenance.py): compact every table this often (0: never), when
    # it holds at least this many files.
    compact_every_seconds: float = 300.0
    compact_min_files: int = 64


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


@dataclass(frozen=True)
class Config:
    """The whole configuration of one Lookout installation."""

    lakehouse: str = "./lakehouse"
    rule_paths: tuple[str, ...] = ("rules",)
    mqtt: MqttConfig = MqttConfig()
    ingest: IngestConfig = IngestConfig()
    engine: EngineConfig = EngineConfig()
    dashboard: DashboardConfig = DashboardConfig()
    s3: S3Config = S3Config()

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


# The S3 settings were `[ingest] s3_*` while only ingest's landing used them.
_MOVED_S3_KEYS = {f"s3_{name}": name for name in S3Config.__dataclass_fields__}


def _refuse_moved_s3_keys(ingest: dict[str, Any]) -> None:
    """Name the new place of an S3 setting still given the old way (file or environment)."""
    for old, new in _MOVED_S3_KEYS.items():
        variable = f"LOOKOUT_INGEST_{old.upper()}"
        given = f"[ingest] {old}" if old in ingest else variable if variable in os.environ else ""
        if given:
            raise ValueError(
                f"{given} has moved to [s3] {new} (environment: LOOKOUT_S3_{new.upper()}): "
                "ingest, the engine and the dashboard now share one [s3] section"
            )


def _coerce(value: str, like: Any) -> Any:
    """Parse an environment string into the type of the default it overrides."""
    if isinstance(like, bool):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    if isinstance(like, int):
        return int(value)
    if isinstance(like, float):
        return float(value)
    if isinstance(like, tuple):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def _section(cls: type, raw: dict[str, Any], env_prefix: str) -> Any:
    defaults = cls()
    values: dict[str, Any] = {}
    for name in cls.__dataclass_fields__:
        value = raw.get(name, getattr(defaults, name))
        env = os.environ.get(f"{env_prefix}_{name.upper()}")
        values[name] = _coerce(env, getattr(defaults, name)) if env is not None else value
    unknown = set(raw) - set(cls.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown keys in [{env_prefix[8:].lower()}]: {sorted(unknown)}")
    return cls(**values)


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Read the configuration file (missing file = defaults) and apply environment overrides."""
    path = Path(path or os.environ.get("LOOKOUT_CONFIG", "lookout.toml"))
    raw: dict[str, Any] = tomllib.loads(path.read_text()) if path.exists() else {}
    _refuse_moved_s3_keys(raw.get("ingest", {}))
    lakehouse = os.environ.get(
        "LOOKOUT_LAKEHOUSE_PATH", raw.get("lakehouse", {}).get("path", Config.lakehouse)
    )
    rules_raw = raw.get("rules", {}).get("paths", list(Config.rule_paths))
    rules_env = os.environ.get("LOOKOUT_RULES_PATHS")
    rule_paths = _coerce(rules_env, ()) if rules_env else tuple(rules_raw)
    return Config(
        lakehouse=lakehouse,
        rule_paths=rule_paths,
        mqtt=_section(MqttConfig, raw.get("mqtt", {}), "LOOKOUT_MQTT"),
        ingest=_section(IngestConfig, raw.get("ingest", {}), "LOOKOUT_INGEST"),
        engine=_section(EngineConfig, raw.get("engine", {}), "LOOKOUT_ENGINE"),
        dashboard=_section(DashboardConfig, raw.get("dashboard", {}), "LOOKOUT_DASHBOARD"),
        s3=_section(S3Config, raw.get("s3", {}), "LOOKOUT_S3"),
    )
