"""Ingest against a password-protected, TLS-only mosquitto on loopback.

The test makes its own certificate authority, a server certificate for 127.0.0.1 and a
client certificate (with the `openssl` command line), and a mosquitto password file. The
broker then accepts only TLS connections that present a client certificate signed by
that CA *and* a valid username/password. Ingest gets all of it from environment
variables (`LOOKOUT_MQTT_*`), lands what a publisher sends, and writes the password
nowhere: not in its log, not in its health file.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lookout.broker import Broker, free_port
from lookout.config import MqttConfig
from tests.ingest.helpers import IngestProcess, landed_keys, publish_all, traffic
from tests.waiting import wait_for

pytestmark = pytest.mark.mqtt

USER, PASSWORD = "lookout-ingest", "s3cret-pw-Zq81"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _certificate(folder: Path, name: str, subject: str, ca: Path | None, san: str = "") -> None:
    """A P-256 key and a one-day certificate: self-signed when `ca` is None."""
    key, crt = folder / f"{name}.key", folder / f"{name}.crt"
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    if ca is None:
        _openssl("req", "-x509", *new_key, "-keyout", str(key), "-out", str(crt),
                 "-days", "1", "-subj", subject)  # fmt: skip
        return
    csr = folder / f"{name}.csr"
    _openssl("req", *new_key, "-keyout", str(key), "-out", str(csr), "-subj", subject)
    extensions = folder / f"{name}.ext"
    extensions.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca / "ca.crt"),
             "-CAkey", str(ca / "ca.key"), "-CAcreateserial", "-out", str(crt),
             "-days", "1", "-extfile", str(extensions))  # fmt: skip


@pytest.fixture
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, Path]]:
    """mosquitto with TLS (client certificate required) and a password file."""
    state = tmp_path_factory.mktemp("secure-broker")
    pki = state / "pki"
    pki.mkdir()
    _certificate(pki, "ca", "/CN=lookout test CA", None)
    _certificate(pki, "server", "/CN=127.0.0.1", pki, san="IP:127.0.0.1,DNS:localhost")
    _certificate(pki, "client", f"/CN={USER}", pki)
    passwords = state / "passwords"
    subprocess.run(
        ["mosquitto_passwd", "-c", "-b", str(passwords), USER, PASSWORD],
        check=True,
        capture_output=True,
    )
    # These lines follow the shipped configuration's only listener, so they apply to it.
    secure = f"""
cafile {pki / "ca.crt"}
certfile {pki / "server.crt"}
keyfile {pki / "server.key"}
require_certificate true
password_file {passwords}
allow_anonymous false
"""
    broker = Broker("127.0.0.1", free_port(), state, extra_config=secure).start()
    yield broker, pki
    broker.stop()


def test_ingest_connects_with_ca_client_certificate_and_password(
    tmp_path: Path, secure_broker: tuple[Broker, Path]
) -> None:
    broker, pki = secure_broker
    credentials = MqttConfig(
        username=USER,
        password=PASSWORD,
        tls_ca=str(pki / "ca.crt"),
        tls_cert=str(pki / "client.crt"),
        tls_key=str(pki / "client.key"),
    )
    env = {
        "LOOKOUT_MQTT_USERNAME": USER,
        "LOOKOUT_MQTT_PASSWORD": PASSWORD,
        "LOOKOUT_MQTT_TLS_CA": credentials.tls_ca,
        "LOOKOUT_MQTT_TLS_CERT": credentials.tls_cert,
        "LOOKOUT_MQTT_TLS_KEY": credentials.tls_key,
    }
    lakehouse = tmp_path / "lakehouse"
    ingest = IngestProcess(broker, lakehouse, env=env).wait_subscribed()
    publish_all(
        broker,
        [("lookout/traffic/1/readings", traffic(seq)) for seq in range(100)],
        credentials,
    )
    wait_for(lambda: len(landed_keys(lakehouse / "_landing")) == 100, 20, "the readings")
    assert ingest.terminate() == 0

    assert PASSWORD not in ingest.log.read_text()
    for record in (lakehouse / "_health").iterdir():
        assert PASSWORD not in record.read_text()
    assert PASSWORD not in repr(credentials)


def test_a_wrong_password_is_refused_and_reported(
    tmp_path: Path, secure_broker: tuple[Broker, Path]
) -> None:
    broker, pki = secure_broker
    env = {
        "LOOKOUT_MQTT_USERNAME": USER,
        "LOOKOUT_MQTT_PASSWORD": "not-the-password",
        "LOOKOUT_MQTT_TLS_CA": str(pki / "ca.crt"),
        "LOOKOUT_MQTT_TLS_CERT": str(pki / "client.crt"),
        "LOOKOUT_MQTT_TLS_KEY": str(pki / "client.key"),
    }
    ingest = IngestProcess(broker, tmp_path / "lakehouse", env=env)
    refusal = "broker refused the connection: Not authorized"
    wait_for(lambda: ingest.health.get("last_error") == refusal, 20, "the refusal")
    assert not ingest.health["subscribed"]
    assert ingest.terminate() == 0
    assert "not-the-password" not in ingest.log.read_text()
