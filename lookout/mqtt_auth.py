"""The installation's MQTT logins: a generated username and password per role, and the
secret that makes ingest's client id unguessable, kept in one file only its owner reads.

Roles, and what the broker's ACL (`broker_auth_files`) lets each do:

    ingest      read  lookout/#                          (the only reader)
    publisher   write lookout/+/+/readings, lookout/+/+/heartbeat   (simulators, gateways)

Anonymous clients are refused. Ingest's client id is `lookout-ingest-<id>-<digest>`, the
digest an HMAC of the ingester id under the installation's secret: stable across
restarts (its persistent session, and the messages queued in it, survive), and not
guessable by another local client that would otherwise take the session over and
acknowledge what was queued for ingest.

The file (`[mqtt] credentials_file`, default `.lookout/mqtt-credentials`) is JSON, made
on first use with mode 0600 (its folder 0700 when made here) and refused when anyone
but its owner may read it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from lookout.config import ConfigError, MqttConfig

INGEST = "ingest"
PUBLISHER = "publisher"
ROLES = (INGEST, PUBLISHER)

#: What each role may do, as mosquitto's acl_file says it.
ROLE_ACL = {
    INGEST: ("topic read lookout/#",),
    PUBLISHER: ("topic write lookout/+/+/readings", "topic write lookout/+/+/heartbeat"),
}

#: mosquitto 2's password hash: PBKDF2-HMAC-SHA512, 12 bytes of salt, 101 iterations.
_HASH_ITERATIONS = 101


@dataclass(frozen=True)
class Login:
    """One role's username and password."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class Credentials:
    """The logins of every role and the client-id secret, as read from `path`."""

    path: Path
    logins: Mapping[str, Login]
    secret: str = field(repr=False)

    def login(self, role: str) -> Login:
        """The login of `role` (one of ROLES)."""
        return self.logins[role]

    def ingest_client_id(self, ingester_id: str) -> str:
        """Ingest's MQTT client id: the same for every start of this ingester of this
        installation, and guessable by no one without the secret."""
        digest = hmac.new(self.secret.encode(), ingester_id.encode(), hashlib.sha256)
        return f"lookout-ingest-{ingester_id}-{digest.hexdigest()[:24]}"

    def mqtt_config(self, mqtt: MqttConfig, role: str) -> MqttConfig:
        """`mqtt` with `role`'s login, unless `mqtt` names a username of its own."""
        if mqtt.username:
            return mqtt
        login = self.login(role)
        return replace(mqtt, username=login.username, password=login.password)


def _new_credentials(path: Path) -> Credentials:
    logins = {
        role: Login(f"lookout-{role}-{secrets.token_hex(3)}", secrets.token_urlsafe(24))
        for role in ROLES
    }
    return Credentials(path, logins, secrets.token_hex(32))


def _encode(credentials: Credentials) -> bytes:
    logins = {
        role: {"username": login.username, "password": login.password}
        for role, login in credentials.logins.items()
    }
    return json.dumps({"logins": logins, "client_id_secret": credentials.secret}, indent=2).encode()


def load_credentials(path: str | os.PathLike[str]) -> Credentials | None:
    """The credentials kept at `path`, or None when there is no such file.

    Raises ConfigError when the file can be read by others than its owner, or does not
    hold every role's login.
    """
    file = Path(path)
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{file}: holds MQTT passwords but others may read it (mode {mode & 0o777:o}); "
            f"make it private: chmod 600 {file}"
        )
    try:
        data = json.loads(file.read_bytes())
        logins = {
            role: Login(data["logins"][role]["username"], data["logins"][role]["password"])
            for role in ROLES
        }
        return Credentials(file, logins, data["client_id_secret"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"{file}: is not a Lookout MQTT credentials file ({type(err).__name__}: {err}); "
            "move it aside and a new one is made"
        ) from None


def load_or_create_credentials(path: str | os.PathLike[str]) -> Credentials:
    """The credentials at `path`, made (new logins, a new secret) when there are none.

    The file is written under a temporary name with mode 0600 and linked into place, so
    two processes starting at once end up with the same credentials, and no reader
    ever sees half a file.
    """
    file = Path(path)
    found = load_credentials(file)
    if found is not None:
        return found
    if not file.parent.exists():
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    credentials = _new_credentials(file)
    tmp = file.with_name(f".{file.name}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(_encode(credentials))
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):  # another process made one first
            os.link(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)
    found = load_credentials(file)
    assert found is not None
    return found


def mosquitto_password_hash(password: str) -> str:
    """A password_file entry's hash as mosquitto 2 writes it (`mosquitto_passwd`)."""
    salt = secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, _HASH_ITERATIONS)
    encoded = (base64.b64encode(salt).decode(), base64.b64encode(digest).decode())
    return f"$7${_HASH_ITERATIONS}${encoded[0]}${encoded[1]}"


def broker_auth_files(credentials: Credentials, folder: Path) -> tuple[Path, Path]:
    """Write mosquitto's password_file and acl_file for `credentials` into `folder`
    (mode 0600 each); returns their paths."""
    passwords = folder / "passwords"
    acl = folder / "acl"
    lines = [f"{login.username}:{mosquitto_password_hash(login.password)}" for login in
             credentials.logins.values()]  # fmt: skip
    rules = ["# Only ingest reads lookout/#; only publishers write readings and heartbeats."]
    for role, login in credentials.logins.items():
        rules += ["", f"user {login.username}", *ROLE_ACL[role]]
    for target, text in ((passwords, lines), (acl, rules)):
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write("\n".join(text) + "\n")
        os.chmod(target, 0o600)  # O_CREAT's mode applies only to a new file
    return passwords, acl
