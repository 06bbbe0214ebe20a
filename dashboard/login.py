"""Sign-in: every page runs only for a signed-in user, whose name the Rules page's changes
and the acknowledgements record.

The accounts are the users file's (`[dashboard] users_file`, scrypt hashes written by
`lookout dashboard-user NAME`) and `operator`, whose password is the environment's
`LOOKOUT_DASHBOARD_PASSWORD` when set (never a file's; an `operator` of the users
file takes precedence). With neither, nobody can sign
in and the page says how to add an account. `[dashboard] login = false` turns sign-in
off (for a local demo); changes are then recorded as made by `anonymous`.

A sign-in lasts for the browser tab's session: reloading the page asks again.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from pathlib import Path

import streamlit as st

from dashboard.data import DataError
from dashboard.settings import settings
from lookout.config import DashboardConfig
from lookout.passwords import OPERATOR, PASSWORD_VARIABLE, read_users, verify_password

ANONYMOUS = "anonymous"
_USER = "signed_in_user"


def _valid(name: str, password: str, users_file: Path) -> bool:
    """Whether `password` is `name`'s, by the users file or the environment's password."""
    hashed = read_users(users_file).get(name)
    if hashed is not None:
        return verify_password(password, hashed)
    expected = os.environ.get(PASSWORD_VARIABLE, "")
    if name != OPERATOR or not expected:
        return False
    # Digests of equal length, compared in constant time.
    digest = hashlib.sha256(password.encode()).digest()
    return hmac.compare_digest(digest, hashlib.sha256(expected.encode()).digest())


def current_user() -> str:
    """Who is signed in (`anonymous` when sign-in is off)."""
    return str(st.session_state.get(_USER, ANONYMOUS))


def _sign_out() -> None:
    st.session_state.pop(_USER, None)


def _settings() -> DashboardConfig:
    try:
        return settings()
    except DataError as exc:  # no configuration, no way to know who may sign in
        st.error(f"{exc}.")
        st.stop()


def signed_in() -> bool:
    """Whether a user is signed in (or sign-in is off)."""
    return not _settings().login or _USER in st.session_state


def require_login() -> None:
    """Return when a user is signed in (or sign-in is off); otherwise draw the sign-in
    form and end this run of the page."""
    config = _settings()
    if not config.login:
        return
    if _USER in st.session_state:
        st.sidebar.caption(f"Signed in as **{st.session_state[_USER]}**")
        st.sidebar.button("Sign out", key="sign_out", on_click=_sign_out)
        return
    users_file = Path(config.users_file)
    if not read_users(users_file) and not os.environ.get(PASSWORD_VARIABLE):
        st.error(
            "Nobody can sign in yet: add an account with `lookout dashboard-user NAME` "
            f"(it goes to `{users_file}`), or set {PASSWORD_VARIABLE} for the user "
            f"`{OPERATOR}`. For a dashboard only this machine can reach, sign-in can be "
            "turned off with `[dashboard] login = false` (LOOKOUT_DASHBOARD_LOGIN=false)."
        )
        st.stop()
    with st.form("sign_in"):
        name = st.text_input("User", key="sign_in_user")
        password = st.text_input("Password", type="password", key="sign_in_password")
        submitted = st.form_submit_button("Sign in")
    if submitted:
        if _valid(name, password, users_file):
            st.session_state[_USER] = name
            st.rerun()
        time.sleep(1)  # slows down guessing
        st.error("Wrong user name or password.")
    st.stop()
