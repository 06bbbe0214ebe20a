"""One `[s3]` section for every part, and health records on an S3 lakehouse (a real S3
server, moto's, on 127.0.0.1; the bucket read back with boto3)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyspark
import pytest

from engine.spark.session import hadoop_version, s3a_settings
from lookout.config import load_config
from lookout.health import health_parts, read_health, write_health
from tests.s3server import SECRET, S3Server


def test_health_records_are_whole_objects_in_the_bucket(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    lakehouse = s3.url("lake")
    write_health(lakehouse, "engine", {"updated_at_ms": 1}, s3.settings())
    write_health(lakehouse, "engine", {"updated_at_ms": 2}, s3.settings())
    write_health(lakehouse, "ingest-0", {"subscribed": True}, s3.settings())

    assert {k: orjson.loads(v) for k, v in s3.objects("lake/").items()} == {
        "lake/_health/engine.json": {"updated_at_ms": 2},
        "lake/_health/ingest-0.json": {"subscribed": True},
    }
    assert read_health(lakehouse, "engine", s3.settings()) == {"updated_at_ms": 2}
    assert read_health(lakehouse, "ingest-1", s3.settings()) is None
    assert health_parts(lakehouse, s3.settings()) == ["engine", "ingest-0"]
    assert list(tmp_path.iterdir()) == []  # no local folder named `s3:`


def test_local_health_records_are_files_replaced_whole(tmp_path: Path) -> None:
    lakehouse = str(tmp_path / "lakehouse")
    assert health_parts(lakehouse) == [] and read_health(lakehouse, "engine") is None
    write_health(lakehouse, "engine", {"updated_at_ms": 1})
    write_health(lakehouse, "engine", {"updated_at_ms": 2})
    folder = tmp_path / "lakehouse" / "_health"
    assert [p.name for p in folder.iterdir()] == ["engine.json"]  # no temporary left
    assert orjson.loads((folder / "engine.json").read_bytes()) == {"updated_at_ms": 2}
    assert health_parts(lakehouse) == ["engine"]


def test_one_s3_section_from_the_file_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "lookout.toml"
    toml.write_text('[s3]\nendpoint = "http://minio:9000"\nregion = "eu-west-1"\n')
    monkeypatch.setenv("LOOKOUT_S3_ACCESS_KEY", "key")
    monkeypatch.setenv("LOOKOUT_S3_SECRET_KEY", SECRET)
    s3 = load_config(toml).s3
    assert (s3.endpoint, s3.region, s3.access_key, s3.secret_key) == (
        "http://minio:9000", "eu-west-1", "key", SECRET,
    )  # fmt: skip
    assert SECRET not in repr(load_config(toml))


@pytest.mark.parametrize(
    ("toml", "env", "message"),
    [
        ('[ingest]\ns3_endpoint = "http://x:9000"\n', {}, "[ingest] s3_endpoint has moved to "
         "[s3] endpoint (environment: LOOKOUT_S3_ENDPOINT)"),
        ("", {"LOOKOUT_INGEST_S3_SECRET_KEY": "k"}, "LOOKOUT_INGEST_S3_SECRET_KEY has moved to "
         "[s3] secret_key (environment: LOOKOUT_S3_SECRET_KEY)"),
    ],
)  # fmt: skip
def test_the_old_ingest_s3_keys_are_refused_with_their_new_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, env: dict, message: str
) -> None:
    path = tmp_path / "lookout.toml"
    path.write_text(toml)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as error:
        load_config(path)
    # From the file, the message says where: the file and the key's line.
    assert str(error.value).startswith(f"{path}:2: {message}" if toml else message)


def test_spark_reaches_s3_through_s3a_without_the_keys_on_its_command_line(
    s3: S3Server,
) -> None:
    # Settings only (no Spark started): the e2e test runs them against the server.
    jars = Path(pyspark.__file__).parent / "jars"
    assert (jars / f"hadoop-client-api-{hadoop_version()}.jar").exists()
    settings = s3a_settings(s3.settings())
    assert settings["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert settings["spark.hadoop.fs.s3a.endpoint"] == s3.endpoint
    assert settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert SECRET not in str(settings) and "access.key" not in str(settings)
