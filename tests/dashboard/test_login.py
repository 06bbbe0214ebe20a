"""Sign-in: no page runs before a user signs in (an account of the users file, scrypt
hashed, or `operator` with the environment's password); what a user does is recorded
under their name; sign-in can be off only on a loopback address."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from streamlit.testing.v1 import AppTest

from dashboard.testing import APP
from lookout.config import Config, DashboardConfig
from lookout.passwords import read_users, set_user, verify_password
from lookout.services import run_dashboard
from tests.dashboard.helpers import texts


@pytest.fixture
def sign_in_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOKOUT_DASHBOARD_LOGIN", "true")


def sign_in(app: AppTest, user: str, password: str) -> AppTest:
    app.text_input(key="sign_in_user").input(user)
    app.text_input(key="sign_in_password").input(password)
    return next(b for b in app.button if b.label == "Sign in").click().run()


def test_no_page_runs_before_signing_in(
    lakehouse: Path, sign_in_on: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOKOUT_DASHBOARD_PASSWORD", "correct horse")
    app = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not app.metric and not app.dataframe  # no alert, no count
    assert [i.label for i in app.text_input] == ["User", "Password"]
    app.switch_page("views/rules.py").run()
    assert "congestion" not in texts(app) and not app.dataframe  # no rule either

    sign_in(app, "operator", "wrong horse")
    assert "Wrong user name or password." in texts(app)
    assert not app.dataframe
    sign_in(app, "someone", "correct horse")  # the variable is operator's password only
    assert "Wrong user name or password." in texts(app)

    sign_in(app, "operator", "correct horse")
    assert not app.error
    assert "Signed in as **operator**" in texts(app)
    assert app.dataframe[0].value.set_index("rule").loc["larceny", "kind"] == "alert"


def test_without_any_account_nobody_gets_in_and_the_page_says_how_to_add_one(
    lakehouse: Path, sign_in_on: None
) -> None:
    app = AppTest.from_file(str(APP), default_timeout=60).run()
    (error,) = [e.value for e in app.error]
    assert "Nobody can sign in yet" in error and "lookout dashboard-user NAME" in error
    assert not app.text_input and not app.metric


def test_a_users_file_holds_hashes_and_its_users_sign_in(
    lakehouse: Path, rule_store: Path, tmp_path: Path, sign_in_on: None
) -> None:
    users = tmp_path / "dashboard-users"  # where the conftest points the dashboard
    set_user(users, "alice", "s3cret words")
    set_user(users, "bob", "other words")
    assert "s3cret" not in users.read_text() and users.stat().st_mode & 0o077 == 0
    assert verify_password("s3cret words", read_users(users)["alice"])
    assert not verify_password("s3cret word", read_users(users)["alice"])
    set_user(users, "bob", None)
    assert list(read_users(users)) == ["alice"]

    app = AppTest.from_file(str(APP), default_timeout=60).run()
    sign_in(app, "bob", "other words")
    assert "Wrong user name or password." in texts(app)
    sign_in(app, "alice", "s3cret words")
    assert "Signed in as **alice**" in texts(app)

    # Her acknowledgement and her saved rule carry her name.
    choices = app.multiselect(key="ack_ids")
    choices.select(choices.options[0])
    next(b for b in app.button if b.label == "Acknowledge").click().run()
    acks = DeltaTable(str(lakehouse / "alert_acks")).to_pyarrow_table().to_pylist()
    assert [a["acked_by"] for a in acks] == ["alice"]
    app.switch_page("views/rules.py").run()
    app.text_input(key="rule_name::(new file)").input("mine")
    app.text_area(key="rule_text::(new file)").input(
        "CREATE ALERT crawl SEVERITY info AS SELECT station, ts FROM traffic WHERE speed < 1;\n"
    )
    app.button(key="rule_save").click().run()
    assert (rule_store / "mine.sql").exists()
    change = app.dataframe[-1].value.iloc[0]
    assert (change["user"], change["action"], change["file"]) == ("alice", "created", "mine.sql")


def test_sign_in_may_be_off_only_on_a_loopback_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exposed = Config(dashboard=DashboardConfig(address="0.0.0.0", login=False))
    assert run_dashboard(exposed) == 2  # refused before anything starts
    assert "sign-in is off" in capsys.readouterr().err


def test_the_demo_keeps_sign_in_on_with_a_new_password_for_its_operator(
    tmp_path: Path,
) -> None:
    from lookout.demo import dashboard_sign_in

    config = Config(dashboard=DashboardConfig(users_file=str(tmp_path / "users")))
    env, how = dashboard_sign_in(config, {"PATH": "/usr/bin"})
    password = env.pop("LOOKOUT_DASHBOARD_PASSWORD")
    assert env == {"PATH": "/usr/bin"} and len(password) >= 16
    assert how == f"sign in as operator with the password {password} (new for this demo)"
    again = dashboard_sign_in(config, {})[0]
    assert again["LOOKOUT_DASHBOARD_PASSWORD"] != password  # new each run

    own = {"LOOKOUT_DASHBOARD_PASSWORD": "mine"}
    assert dashboard_sign_in(config, own) == (own, "sign in with your dashboard account")
    set_user(tmp_path / "users", "alice", "hers")
    assert dashboard_sign_in(config, {}) == ({}, "sign in with your dashboard account")
    off = Config(dashboard=DashboardConfig(login=False))
    assert dashboard_sign_in(off, {}) == ({}, "sign-in is off ([dashboard] login = false)")
