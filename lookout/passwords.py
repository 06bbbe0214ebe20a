"""Dashboard accounts: a users file of `name:hash` lines, the hash made with the standard
library's scrypt (a memory-hard key derivation function) and a random salt, so the file
never holds a password. `lookout dashboard-user NAME` writes it; the dashboard reads it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import tempfile
from pathlib import Path

OPERATOR = "operator"
"""The account whose password is the environment's PASSWORD_VARIABLE (when set)."""
PASSWORD_VARIABLE = "LOOKOUT_DASHBOARD_PASSWORD"

# scrypt's cost: 16 MiB of memory and ~50 ms per check, as Python's docs suggest.
_N, _R, _P = 2**14, 8, 1
_SCHEME = "scrypt"


def _derive(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 << 20, dklen=32)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def hash_password(password: str) -> str:
    """`scrypt$n$r$p$salt$key` for `password`, with a new random salt."""
    salt = secrets.token_bytes(16)
    return f"{_SCHEME}${_N}${_R}${_P}${_b64(salt)}${_b64(_derive(password, salt, _N, _R, _P))}"


def verify_password(password: str, hashed: str) -> bool:
    """Whether `password` is the one `hashed` was made from (False for a malformed hash)."""
    try:
        scheme, n, r, p, salt, key = hashed.split("$")
        if scheme != _SCHEME:
            return False
        derived = _derive(password, base64.b64decode(salt), int(n), int(r), int(p))
        return hmac.compare_digest(derived, base64.b64decode(key))
    except ValueError:
        return False


def read_users(path: Path) -> dict[str, str]:
    """User name -> password hash, from the users file (none when there is no file)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    return dict(line.split(":", 1) for line in lines if ":" in line)


def set_user(path: Path, name: str, password: str | None) -> None:
    """Give `name` the password `password` in the users file (None: remove `name`). The
    file is replaced whole and readable by its owner only."""
    if not name or ":" in name or name != name.strip():
        raise ValueError(f"{name!r} is not a user name (no ':', no leading or trailing blanks)")
    users = read_users(path)
    if password is None:
        users.pop(name, None)
    else:
        users[name] = hash_password(password)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.writelines(f"{user}:{hashed}\n" for user, hashed in users.items())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
