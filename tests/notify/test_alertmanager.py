"""Incidents routed through a real Alertmanager (Debian's, on loopback) to a real webhook
receiver on loopback, with the notifier reading an incidents table written by delta-rs
as the engine leaves it (no Spark)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engine import tables
from engine.alerts import incident_id
from lookout import cli
from lookout.alertmanager import (
    Alertmanager,
    AlertmanagerError,
    WebhookLog,
    create_silence,
    expire_silence,
    list_silences,
    request,
    rfc3339,
    silencing,
)
from lookout.broker import free_port
from lookout.config import AlertmanagerConfig, Config
from lookout.notify import Notifier, incident_url, key_labels, to_alert
from tests.alertmanager import GROUP_INTERVAL
from tests.waiting import wait_for

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, in ms
_batches = itertools.count()


def config_for(tmp_path: Path, manager: Alertmanager) -> Config:
    return Config(
        lakehouse=str(tmp_path / "lakehouse"),
        alertmanager=AlertmanagerConfig(
            url=manager.url, poll_seconds=0.2, resend_seconds=1.0, max_backoff_seconds=4.0
        ),
    )


def incident(station: int, opened_s: int, resolved_s: int | None = None) -> dict[str, Any]:
    """An incidents-table row of the `congestion` rule, as the engine writes it."""
    key = f"station={station}"
    opened = T0 + opened_s * 1000
    return {
        "incident_id": incident_id("congestion", key, opened),
        "rule": "congestion",
        "key": key,
        "severity": "warning",
        "message": f"station {station} slow",
        "opened_at": opened,
        "last_report_at": opened,
        "resolved_at": None if resolved_s is None else T0 + resolved_s * 1000,
        "reports": 1,
    }


def write_incidents(config: Config, rows: list[dict[str, Any]]) -> None:
    """Merge `rows` (each incident's latest state) into the table as the engine's batches
    do (`engine.tables.merge_files`, by incident id)."""
    location = config.table("incidents")
    tables.ensure_table(location, tables.INCIDENTS)
    data = tables.ms_table(rows, tables.INCIDENTS)
    batch = next(_batches)
    files = [tables.write_data_file("incidents", location, data)]
    assert tables.merge_files(
        location, tables.INCIDENTS, files, *tables.MERGED["incidents"], "test-engine", batch
    )


def notified(webhook: WebhookLog) -> list[tuple[str, str, float]]:
    """(station, status, arrival) of every alert in every notification so far."""
    return [
        (alert["labels"]["station"], alert["status"], note["received_at"])
        for note in webhook.snapshot()
        for alert in note["alerts"]
    ]


def has(webhook: WebhookLog, *wanted: tuple[str, str]) -> bool:
    seen = {(station, status) for station, status, _ in notified(webhook)}
    return set(wanted) <= seen


@pytest.fixture
def notifier_thread(tmp_path: Path, alertmanager: Alertmanager) -> Iterator[Config]:
    config = config_for(tmp_path, alertmanager)
    stop = threading.Event()
    thread = threading.Thread(target=Notifier(config).run, args=(stop,), daemon=True)
    thread.start()
    yield config
    stop.set()
    thread.join(timeout=10)


@pytest.mark.slow
def test_firing_and_resolved_arrive_as_prometheus_would_post_them(
    notifier_thread: Config, webhook: WebhookLog
) -> None:
    config = notifier_thread
    write_incidents(config, [incident(3, 0)])
    wait_for(lambda: has(webhook, ("3", "firing")), 20, "the firing notification")
    alert = webhook.snapshot()[0]["alerts"][0]
    assert alert["labels"] == {"alertname": "congestion", "severity": "warning", "station": "3"}
    assert alert["annotations"]["message"] == "station 3 slow"
    assert alert["annotations"]["incident_id"] == incident(3, 0)["incident_id"]
    assert alert["startsAt"].startswith("2026-01-01T00:00:00")
    assert alert["generatorURL"].startswith("http://127.0.0.1:8501/?incident=")

    write_incidents(config, [incident(3, 0, resolved_s=120)])
    wait_for(lambda: has(webhook, ("3", "resolved")), 20, "the resolved notification")
    resolved = [a for n in webhook.snapshot() for a in n["alerts"] if a["status"] == "resolved"]
    assert resolved[0]["endsAt"].startswith("2026-01-01T00:02:00")


@pytest.mark.slow
def test_every_notification_arrives_after_an_alertmanager_outage_and_none_twice(
    tmp_path: Path, notifier_thread: Config, alertmanager: Alertmanager, webhook: WebhookLog
) -> None:
    """Alertmanager is stopped for 30 s while station 3 resolves and station 7 opens;
    station 5 fires throughout. Once it is back every notification arrives, and each
    (incident, status) exactly once: Alertmanager's notification log, kept over its
    restart, dedups the notifier's resends."""
    config = notifier_thread
    write_incidents(config, [incident(3, 0), incident(5, 10)])
    wait_for(lambda: has(webhook, ("3", "firing"), ("5", "firing")), 20, "the first firings")

    alertmanager.stop()
    write_incidents(config, [incident(3, 0, resolved_s=60), incident(5, 10), incident(7, 70)])
    time.sleep(30)
    assert not has(webhook, ("3", "resolved"))
    alertmanager.start()

    wait_for(
        lambda: has(webhook, ("3", "resolved"), ("7", "firing")),
        30,
        "the notifications held back by the outage",
    )
    time.sleep(3 * GROUP_INTERVAL)  # time for any duplicate to show
    counts = Counter((station, status) for station, status, _ in notified(webhook))
    assert counts == {
        ("3", "firing"): 1,
        ("5", "firing"): 1,
        ("3", "resolved"): 1,
        ("7", "firing"): 1,
    }


@pytest.mark.slow
def test_a_restarted_notifier_still_resolves_what_it_announced(
    tmp_path: Path, alertmanager: Alertmanager, webhook: WebhookLog
) -> None:
    """What was announced is durable: a new notifier process delivers the resolution."""
    config = config_for(tmp_path, alertmanager)
    write_incidents(config, [incident(3, 0)])
    assert Notifier(config).poll()
    write_incidents(config, [incident(3, 0, resolved_s=60)])
    restarted = Notifier(config)
    assert restarted.announced == {incident(3, 0)["incident_id"]}
    assert restarted.poll()
    assert restarted.announced == set()
    wait_for(lambda: has(webhook, ("3", "firing"), ("3", "resolved")), 20, "both notifications")


def test_polls_fail_fast_and_are_retried_while_alertmanager_is_down(tmp_path: Path) -> None:
    config = Config(
        lakehouse=str(tmp_path / "lakehouse"),
        alertmanager=AlertmanagerConfig(url=f"http://127.0.0.1:{free_port()}", poll_seconds=0.5),
    )
    write_incidents(config, [incident(3, 0)])
    notifier = Notifier(config)
    started = time.monotonic()
    assert not notifier.poll()
    assert time.monotonic() - started < 2
    notifier.failures = 3
    assert notifier.delay() == 4.0
    # Announced before the post that failed: a crash now would still resolve it later.
    assert Notifier(config).announced == {incident(3, 0)["incident_id"]}


def test_key_labels() -> None:
    assert key_labels("station=3, lane=1") == {"station": "3", "lane": "1"}
    assert key_labels("door=north, side=a, b") == {"door": "north", "side": "a, b"}
    assert key_labels("") == {}


def test_silences_from_the_cli(
    notifier_thread: Config, alertmanager: Alertmanager, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lookout silence add/list/expire` go through Alertmanager's API; a silenced
    incident shows as suppressed there."""
    config = notifier_thread
    url = ["--url", alertmanager.url]
    add = ["alertname=congestion", "station=3", "--duration", "1h", "--comment", "roadworks"]
    assert cli.main(["silence", "add", *url, *add, "--author", "ops"]) == 0
    silence = capsys.readouterr().out.strip().split()[-1]
    write_incidents(config, [incident(3, 0), incident(7, 0)])

    def states() -> dict[str, str]:
        alerts = request(alertmanager.url, "GET", "/api/v2/alerts")
        return {a["labels"]["station"]: a["status"]["state"] for a in alerts}

    wait_for(lambda: states() == {"3": "suppressed", "7": "active"}, 20, "the silence to apply")
    assert cli.main(["silence", "list", *url]) == 0
    listing = capsys.readouterr().out
    assert silence in listing and "station=3" in listing and "roadworks" in listing
    assert cli.main(["silence", "expire", *url, silence]) == 0
    wait_for(lambda: states() == {"3": "active", "7": "active"}, 20, "the silence to end")


def test_the_incident_link_names_it_on_the_dashboards_first_page() -> None:
    assert incident_url("https://ops.example/lookout/", "ab12") == (
        "https://ops.example/lookout/?incident=ab12"
    )
    assert incident_url("http://h:1", "a b&c") == "http://h:1/?incident=a+b%26c"
    config = Config(alertmanager=AlertmanagerConfig(dashboard_url="https://ops.example"))
    row = {**incident(3, 0), "opened_at": datetime.fromtimestamp(T0 / 1000, UTC)}
    alert = to_alert(row, datetime.now(UTC), config)
    assert alert["generatorURL"] == f"https://ops.example/?incident={row['incident_id']}"


def matcher(name: str, value: str, regex: bool = False, equal: bool = True) -> dict[str, Any]:
    return {"name": name, "value": value, "isRegex": regex, "isEqual": equal}


def test_which_silences_mute_which_labels_as_alertmanager_decides(
    alertmanager: Alertmanager,
) -> None:
    """`silencing` against Alertmanager's own verdict (each alert's `silencedBy`)."""
    labelled = [
        {"alertname": "t", "station": "3"},
        {"alertname": "t", "station": "33"},
        {"alertname": "t", "station": "7", "lane": "1"},
        {"alertname": "t"},
        {"alertname": "u", "station": "3"},
    ]
    t = matcher("alertname", "t")
    silences = [
        [matcher("station", "3")],
        [t, matcher("station", "3", equal=False)],
        [matcher("station", "3", regex=True)],  # anchored: not "33"
        [t, matcher("station", "3.*", regex=True, equal=False)],
        [t, matcher("lane", "")],  # no lane label: the empty string
        [t, matcher("lane", "", equal=False)],
        [matcher("alertname", "t|u", regex=True), matcher("station", "[37]", regex=True)],
        [t, matcher("station", "(", regex=True, equal=False)],  # no valid regex: mutes none
    ]
    now = datetime.now(UTC)
    for matchers in silences:
        body = {
            "matchers": matchers,
            "startsAt": rfc3339(now),
            "endsAt": rfc3339(now + timedelta(hours=1)),
            "createdBy": "test",
            "comment": "matching",
        }
        try:
            request(alertmanager.url, "POST", "/api/v2/silences", body)
        except AlertmanagerError:
            assert matchers[-1]["value"] == "("  # Alertmanager refuses it; so do we
    ended = create_silence(alertmanager.url, {"alertname": "u"}, timedelta(hours=1), "test", "x")
    expire_silence(alertmanager.url, ended)
    ends = rfc3339(now + timedelta(hours=1))
    request(
        alertmanager.url,
        "POST",
        "/api/v2/alerts",
        [{"labels": labels, "startsAt": rfc3339(now), "endsAt": ends} for labels in labelled],
    )

    def verdicts() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        held = list_silences(alertmanager.url)
        alerts = request(alertmanager.url, "GET", "/api/v2/alerts")
        theirs = {str(sorted(a["labels"].items())): set(a["status"]["silencedBy"]) for a in alerts}
        ours = {
            str(sorted(labels.items())): {s["id"] for s in silencing(held, labels)}
            for labels in labelled
        }
        return theirs, ours

    wait_for(lambda: len(verdicts()[0]) == len(labelled), 20, "the alerts to arrive")
    theirs, ours = verdicts()
    assert ours == theirs
    assert sum(map(len, ours.values())) >= 10  # the cases do mute, and differently
    assert len({frozenset(v) for v in ours.values()}) == len(labelled)
