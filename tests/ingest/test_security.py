"""Ingest against a password-protected, TLS-only mosquitto on loopback, and what the
shipped broker refuses.

The test makes its own certificate authority, a server certificate for 127.0.0.1 and a
client certificate (with the `openssl` command line). The broker (the shipped
configuration: generated logins, ACLs, no anonymous clients) then accepts only TLS
connections that present a client certificate signed by that CA *and* a valid
username/password. Ingest gets all of it from environment variables
(`LOOKOUT_MQTT_*`), lands what a publisher sends, and writes the password nowhere: not
in its log, not in its health file.

On the plain shipped broker: a client without a login is refused, a publisher's login
cannot read `lookout/#`, and a client that takes the client id ingest used to have
(`lookout-ingest-<id>`) gets none of the messages queued for ingest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from ingest.subscriber import make_client
from lookout.broker import Broker, free_port, port_is_open
from lookout.config import ConfigError, MqttConfig
from lookout.mqtt_auth import INGEST, PUBLISHER, Login, load_or_create_credentials
from tests.ingest.helpers import IngestProcess, landed_keys, publish_all, traffic
from tests.waiting import wait_for

pytestmark = pytest.mark.mqtt


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
    """mosquitto with TLS (client certificate required) besides the shipped logins."""
    state = tmp_path_factory.mktemp("secure-broker")
    pki = state / "pki"
    pki.mkdir()
    _certificate(pki, "ca", "/CN=lookout test CA", None)
    _certificate(pki, "server", "/CN=127.0.0.1", pki, san="IP:127.0.0.1,DNS:localhost")
    _certificate(pki, "client", "/CN=lookout-ingest", pki)
    # These lines follow the shipped configuration's only listener, so they apply to it.
    secure = f"""
cafile {pki / "ca.crt"}
certfile {pki / "server.crt"}
keyfile {pki / "server.key"}
require_certificate true
"""
    broker = Broker("127.0.0.1", free_port(), state, extra_config=secure).start()
    yield broker, pki
    broker.stop()


def _tls(pki: Path, login: Login, password: str | None = None) -> dict[str, str]:
    """The environment that gives ingest `login` (or another password) and TLS."""
    return {
        "LOOKOUT_MQTT_USERNAME": login.username,
        "LOOKOUT_MQTT_PASSWORD": password or login.password,
        "LOOKOUT_MQTT_TLS_CA": str(pki / "ca.crt"),
        "LOOKOUT_MQTT_TLS_CERT": str(pki / "client.crt"),
        "LOOKOUT_MQTT_TLS_KEY": str(pki / "client.key"),
    }


@pytest.mark.slow
def test_ingest_connects_with_ca_client_certificate_and_password(
    tmp_path: Path, secure_broker: tuple[Broker, Path]
) -> None:
    broker, pki = secure_broker
    assert broker.credentials is not None
    ingest_login = broker.credentials.login(INGEST)
    env = _tls(pki, ingest_login)
    publisher_login = broker.credentials.login(PUBLISHER)
    credentials = MqttConfig(
        username=publisher_login.username,
        password=publisher_login.password,
        tls_ca=env["LOOKOUT_MQTT_TLS_CA"],
        tls_cert=env["LOOKOUT_MQTT_TLS_CERT"],
        tls_key=env["LOOKOUT_MQTT_TLS_KEY"],
    )
    lakehouse = tmp_path / "lakehouse"
    ingest = IngestProcess(broker, lakehouse, env=env).wait_subscribed()
    publish_all(
        broker,
        [("lookout/traffic/1/readings", traffic(seq)) for seq in range(100)],
        credentials,
    )
    wait_for(lambda: len(landed_keys(lakehouse / "_landing")) == 100, 20, "the readings")
    assert ingest.terminate() == 0

    for secret in (ingest_login.password, broker.credentials.secret):
        assert secret not in ingest.log.read_text()
        for record in (lakehouse / "_health").iterdir():
            assert secret not in record.read_text()
    assert ingest_login.password not in repr(credentials)
    assert broker.credentials.secret not in repr(broker.credentials)


@pytest.mark.slow
def test_a_wrong_password_is_refused_and_reported(
    tmp_path: Path, secure_broker: tuple[Broker, Path]
) -> None:
    broker, pki = secure_broker
    assert broker.credentials is not None
    env = _tls(pki, broker.credentials.login(INGEST), "not-the-password")
    ingest = IngestProcess(broker, tmp_path / "lakehouse", env=env)
    refusal = "broker refused the connection: Not authorized"
    wait_for(lambda: ingest.health.get("last_error") == refusal, 20, "the refusal")
    assert not ingest.health["subscribed"]
    assert ingest.terminate() == 0
    assert "not-the-password" not in ingest.log.read_text()


# ---- the shipped broker: logins and ACLs -------------------------------------------


def _client(broker: Broker, client_id: str, login: Login | None) -> mqtt.Client:
    """A persistent-session MQTT 3.1.1 client, as an intruder would write it."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
    if login is not None:
        client.username_pw_set(login.username, login.password)
    return client


def _connect(client: mqtt.Client, broker: Broker) -> str:
    """Connect and wait for the CONNACK; its reason code as text."""
    answers: list[str] = []
    client.on_connect = lambda _c, _u, _f, reason, _p: answers.append(str(reason))
    client.connect(broker.host, broker.port)
    client.loop_start()
    wait_for(lambda: answers, 10, "the CONNACK")
    return answers[0]


def test_a_client_without_a_login_is_refused(broker: Broker) -> None:
    client = _client(broker, "anonymous", None)
    assert _connect(client, broker) == "Not authorized"
    client.loop_stop()
    refused = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="guess")
    refused.username_pw_set("lookout-ingest", "password")
    assert _connect(refused, broker) == "Not authorized"
    refused.loop_stop()


def test_only_ingest_may_read_and_only_publishers_may_write(broker: Broker) -> None:
    """mosquitto 2.0 grants any subscription and checks the ACL on each message it would
    deliver: a publisher's login subscribed to `lookout/#` receives nothing."""
    assert broker.credentials is not None
    received: dict[str, list[bytes]] = {PUBLISHER: [], INGEST: []}
    clients = []
    for role in (PUBLISHER, INGEST):
        client = _client(broker, f"reader-{role}", broker.credentials.login(role))
        subscribed = threading.Event()
        client.on_subscribe = lambda *_: subscribed.set()  # noqa: B023 - used at once
        client.on_message = lambda _c, _u, message, role=role: received[role].append(
            message.payload
        )
        assert _connect(client, broker) == "Success"
        client.subscribe("lookout/#", qos=1)
        assert subscribed.wait(10)
        clients.append(client)
    clients[1].publish("lookout/traffic/1/readings", b"from ingest", qos=1).wait_for_publish(10)
    publish_all(broker, [("lookout/traffic/1/readings", b"from a publisher")])
    wait_for(lambda: received[INGEST], 10, "the publisher's message")
    time.sleep(0.5)
    assert received == {PUBLISHER: [], INGEST: [b"from a publisher"]}
    for client in clients:
        client.disconnect()
        client.loop_stop()


@pytest.mark.slow
def test_a_client_taking_the_old_ingest_client_id_gets_nothing(
    tmp_path: Path, broker: Broker
) -> None:
    """Before: any local client that connected as `lookout-ingest-0` took ingest's
    session and acknowledged the 101 messages queued in it; none landed."""
    assert broker.credentials is not None
    lakehouse = tmp_path / "lakehouse"
    IngestProcess(broker, lakehouse).wait_subscribed().terminate()  # its session exists
    messages = [("lookout/traffic/1/readings", traffic(seq)) for seq in range(101)]
    publish_all(broker, messages)  # queued for ingest, away

    taken: list[bytes] = []
    for login in (None, broker.credentials.login(PUBLISHER)):
        intruder = _client(broker, "lookout-ingest-0", login)
        intruder.on_message = lambda _c, _u, message: taken.append(message.payload)
        if _connect(intruder, broker) == "Success":
            intruder.subscribe("lookout/#", qos=1)
        time.sleep(1)
        intruder.disconnect()
        intruder.loop_stop()
    assert taken == []

    ingest = IngestProcess(broker, lakehouse).wait_subscribed()
    wait_for(lambda: len(landed_keys(lakehouse / "_landing")) == 101, 20, "every reading")
    assert ingest.terminate() == 0
    assert "lookout-ingest-0\n" not in ingest.log.read_text()


def test_the_client_id_is_stable_and_unguessable(tmp_path: Path) -> None:
    mine = load_or_create_credentials(tmp_path / "a" / "mqtt-credentials")
    again = load_or_create_credentials(tmp_path / "a" / "mqtt-credentials")
    other = load_or_create_credentials(tmp_path / "b" / "mqtt-credentials")
    assert mine.ingest_client_id("0") == again.ingest_client_id("0")
    assert mine.ingest_client_id("0") != other.ingest_client_id("0")
    assert mine.ingest_client_id("0") != mine.ingest_client_id("1")
    assert mine.ingest_client_id("0").startswith("lookout-ingest-0-")
    assert (tmp_path / "a" / "mqtt-credentials").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700


def test_a_credentials_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mqtt-credentials"
    load_or_create_credentials(path)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"others may read it \(mode 644\).* chmod 600"):
        load_or_create_credentials(path)


def test_a_password_sent_unencrypted_off_this_machine_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    login = MqttConfig(username="u", password="p")
    for host, warned in [("127.0.0.1", False), ("localhost", False), ("::1", False),
                         ("10.1.2.3", True), ("broker.example", True)]:  # fmt: skip
        caplog.clear()
        make_client(replace(login, host=host), "c", True)
        assert ("unencrypted" in caplog.text) == warned, host
    caplog.clear()
    _certificate(tmp_path, "ca", "/CN=lookout test CA", None)
    make_client(replace(login, host="10.1.2.3", tls_ca=str(tmp_path / "ca.crt")), "c", True)
    assert "unencrypted" not in caplog.text


@pytest.mark.slow
def test_lookout_broker_makes_the_logins_on_first_run_and_reuses_them(tmp_path: Path) -> None:
    """`lookout broker` (and `lookout demo`, which starts the same broker) in a fresh
    folder: the credentials file is made private, the broker refuses anonymous clients
    and accepts the publisher login; a second run keeps the same logins."""
    port = free_port()
    env = {**os.environ, "LOOKOUT_MQTT_PORT": str(port), "LOOKOUT_CONFIG": "absent.toml"}
    env.pop("LOOKOUT_MQTT_CREDENTIALS_FILE", None)
    path = tmp_path / ".lookout" / "mqtt-credentials"
    logins = []
    for _ in range(2):
        process = subprocess.Popen(
            [sys.executable, "-m", "lookout.cli", "broker"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(lambda: port_is_open("127.0.0.1", port), 20, "the broker")
            credentials = load_or_create_credentials(path)
            logins.append(credentials.logins)
            broker = Broker("127.0.0.1", port, tmp_path, credentials=credentials)
            anonymous = _client(broker, "anonymous", None)
            assert _connect(anonymous, broker) == "Not authorized"
            anonymous.loop_stop()
            publisher = _client(broker, "gateway", credentials.login(PUBLISHER))
            assert _connect(publisher, broker) == "Success"
            publisher.disconnect()
            publisher.loop_stop()
        finally:
            process.terminate()
            assert process.wait(20) == 0, process.stdout.read() if process.stdout else ""
    assert path.stat().st_mode & 0o777 == 0o600
    assert logins[0] == logins[1]
