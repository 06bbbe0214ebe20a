"""Each page of the dashboard under Streamlit's AppTest, on a small sample lakehouse.

The sample (dashboard.sample) ends at the current time with: congestion alerts each
minute at stations 3 and 7, a silent station 5 (no reading for ten minutes), one
stopped vehicle, one theft (item-0042 at door 4), packing groups at four doors, three
late readings and three quarantined payloads.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from dashboard.data import VERSION_TTL_S, query
from dashboard.rule_folder import book_of
from dashboard.rulebook import Book, read_book
from dashboard.sample import (
    TS,
    alerts_table,
    incident_rows,
    traffic_readings,
    write_health,
    write_incidents,
    write_red_health,
    write_sample,
)
from dashboard.settings import rule_store
from dashboard.silences import TTL_SECONDS
from dashboard.testing import APP
from lookout.alertmanager import (
    Alertmanager,
    create_silence,
    expire_silence,
    list_silences,
    request,
)
from lookout.config import AlertmanagerConfig, Config
from lookout.notify import INCIDENT_PARAM, Notifier, to_alert
from tests.dashboard.helpers import metrics, texts
from tests.waiting import wait_for

Open = Callable[[str], AppTest]


def alert_list(app: AppTest) -> pd.DataFrame:
    """The Alerts page's list of alerts (every report), below the incidents."""
    return next(d.value for d in app.dataframe if "alert_id" in d.value.columns)


# ---- empty states --------------------------------------------------------------------


def test_every_page_says_what_to_do_on_an_empty_lakehouse(
    empty_lakehouse: Path, open_page: Open
) -> None:
    for page in ("alerts", "traffic", "rfid", "health"):
        app = open_page(page)
        assert not app.error, (page, [e.value for e in app.error])
        assert "lookout simulate" in texts(app) or "lookout demo" in texts(app), page


def test_a_broken_table_shows_a_plain_error_not_a_trace(
    empty_lakehouse: Path, open_page: Open
) -> None:
    log = empty_lakehouse / "alerts" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("this is not a Delta log\n")
    app = open_page("alerts")
    assert app.error
    assert "Traceback" not in texts(app)


# ---- alerts --------------------------------------------------------------------------


def test_alerts_newest_first_with_counts(lakehouse: Path, open_page: Open) -> None:
    app = open_page("alerts")
    assert metrics(app) == {"matching alerts": "40", "open": "40", "acknowledged": "0"}
    table = alert_list(app)
    assert list(table["event_time"]) == sorted(table["event_time"], reverse=True)
    assert {"status", "severity", "rule", "key", "event_time", "detected_at", "message"} <= set(
        table.columns
    )
    assert "Alerts over time" in [h.value for h in app.subheader]


def test_alert_filters(lakehouse: Path, open_page: Open) -> None:
    app = open_page("alerts")
    app.multiselect[0].select("larceny").run()
    assert metrics(app)["matching alerts"] == "1"
    assert alert_list(app)["message"].iloc[0].startswith("item item-0042")
    app.multiselect[0].unselect("larceny").run()
    app.multiselect[1].select("critical").run()
    assert set(alert_list(app)["severity"]) == {"critical"}
    app.multiselect[1].unselect("critical").run()
    app.text_input[0].input("station=7").run()
    assert set(alert_list(app)["key"]) == {"station=7"}
    app.text_input[0].input("").run()
    app.selectbox[0].select("last 15 minutes").run()
    recent = alert_list(app)["event_time"]
    assert 0 < len(recent) < 40
    assert (time.time() - recent.min().timestamp()) <= 15 * 60 + 30


def test_acknowledging_an_alert_survives_a_restart(lakehouse: Path, open_page: Open) -> None:
    app = open_page("alerts")
    choices = app.multiselect(key="ack_ids")
    first = choices.options[0]
    choices.select(first)
    app.text_input(key="ack_note").input("crew on the way")
    app.button(key="ack_submit").click().run()
    assert "Acknowledged 1 alert(s)." in texts(app)
    assert metrics(app)["acknowledged"] == "1"
    assert (lakehouse / "alert_acks" / "_delta_log").is_dir()

    assert choices.proto.select_all == 0  # no one-click "select all" to acknowledge

    restarted = open_page("alerts")  # a new session reads the acks from Delta
    restarted.selectbox[1].select("acknowledged").run()
    table = alert_list(restarted)
    assert len(table) == 1
    assert table["status"].iloc[0] == "acknowledged"
    assert table["note"].iloc[0] == "crew on the way"
    assert first not in restarted.multiselect(key="ack_ids").options


# ---- incidents -----------------------------------------------------------------------


def incident_tables(app: AppTest) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The Firing now and Recently resolved tables, in that order on the page."""
    firing, resolved = (d.value for d in app.dataframe if "duration" in d.value.columns)
    return firing, resolved


def keyed(frame: pd.DataFrame) -> set[tuple[str, str]]:
    return set(zip(frame["rule"], frame["key"], strict=True))


def test_firing_incidents_lead_and_resolved_ones_follow(lakehouse: Path, open_page: Open) -> None:
    app = open_page("alerts")
    headers = [h.value for h in app.subheader]
    assert headers[:3] == ["Firing now", "Recently resolved", "Alerts"]
    firing, resolved = incident_tables(app)
    assert keyed(firing) == {
        ("congestion", "station=3"),
        ("congestion", "station=7"),
        ("silent_detector", "station=5"),
        ("larceny", "door=4"),
    }
    assert firing["severity"].iloc[0] == "critical"  # the most severe first
    assert firing.set_index("key").at["station=3", "duration"] == "20 min"
    assert firing.set_index("key").at["station=3", "reports"] == 19
    assert list(resolved["rule"]) == ["stopped_vehicle", "congestion"]  # newest first
    assert list(resolved["duration"]) == ["2 min", "30 min"]
    assert resolved["resolved_at"].notna().all()

    app.selectbox(key="filter_range").select("last hour").run()  # resolved 2.5 h ago: gone
    firing, resolved = incident_tables(app)
    assert len(firing) == 4 and list(resolved["rule"]) == ["stopped_vehicle"]
    app.text_input(key="filter_key").input("station=7").run()
    assert "No incident resolved in this time range." in texts(app)
    assert keyed(next(d.value for d in app.dataframe if "duration" in d.value.columns)) == {
        ("congestion", "station=7")
    }


def test_acknowledging_one_incident_acknowledges_exactly_that_one(
    lakehouse: Path, open_page: Open
) -> None:
    app = open_page("alerts")
    pick = app.selectbox(key="incident_pick")
    assert pick.value is None  # nothing is chosen for the operator
    app.button(key="incident_ack_submit").click().run()
    assert "Choose an incident first." in texts(app)
    assert not (lakehouse / "incident_acks").exists()

    incidents = DeltaTable(str(lakehouse / "incidents")).to_pandas()
    (station_3,) = incidents.query("key == 'station=3' and resolved_at.isna()")["incident_id"]
    assert any(o.startswith("firing · warning · congestion · station=3") for o in pick.options)
    app.selectbox(key="incident_pick").select(station_3).run()
    app.text_input(key="incident_note").input("crew on the way")
    app.button(key="incident_ack_submit").click().run()
    assert "Acknowledged congestion at station=3." in texts(app)
    firing = incident_tables(app)[0].set_index("key")
    assert firing.at["station=3", "acked_by"] == "anonymous"
    assert firing.at["station=3", "note"] == "crew on the way"
    assert firing.drop(index="station=3")["acked_by"].isna().all()
    assert incident_tables(app)[1]["acked_by"].isna().all()
    # The alerts (reports) of that incident are not acknowledged by it.
    assert metrics(app)["acknowledged"] == "0"

    # The engine goes on merging the incident (a new report); the acknowledgement stays,
    # and a new session reads it from Delta.
    rows = [r for r in incident_rows(int(time.time() * 1000)) if r["key"] == "station=3"]
    write_incidents(lakehouse, [{**rows[0], "incident_id": station_3, "reports": 20}])
    time.sleep(VERSION_TTL_S + 0.1)
    firing = incident_tables(open_page("alerts"))[0].set_index("key")
    assert firing.at["station=3", "reports"] == 20
    assert firing.at["station=3", "note"] == "crew on the way"
    assert firing["acked_by"].notna().sum() == 1


def test_silencing_an_incident_silences_exactly_it_in_alertmanager(
    lakehouse: Path,
    open_page: Open,
    alertmanager: Alertmanager,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOOKOUT_ALERTMANAGER_URL", alertmanager.url)
    config = Config(
        lakehouse=str(lakehouse),
        alertmanager=AlertmanagerConfig(url=alertmanager.url, poll_seconds=0.2),
    )
    stop = threading.Event()
    notifier = threading.Thread(target=Notifier(config).run, args=(stop,), daemon=True)
    notifier.start()
    try:

        def states() -> dict[tuple[str, str], str]:
            alerts = request(alertmanager.url, "GET", "/api/v2/alerts")
            return {
                (a["labels"]["alertname"], a["labels"].get("station", "")): a["status"]["state"]
                for a in alerts
            }

        wait_for(lambda: len(states()) == 4, 20, "the firing incidents to reach Alertmanager")
        app = open_page("alerts")
        incidents = DeltaTable(str(lakehouse / "incidents")).to_pandas()
        (station_3,) = incidents.query("key == 'station=3' and resolved_at.isna()")["incident_id"]
        app.selectbox(key="incident_pick").select(station_3).run()
        app.button(key="incident_silence_submit").click().run()
        assert "Say why: Alertmanager requires a comment." in texts(app)
        assert list_silences(alertmanager.url) == []

        app.selectbox(key="silence_for").select("8 hours")
        app.text_input(key="silence_comment").input("roadworks")
        app.button(key="incident_silence_submit").click().run()
        assert "Silenced congestion at station=3 for 8 hours" in texts(app)
        # The table drawn right after says so (the silences are read afresh).
        assert firing_table(app).at["station=3", "silenced"].endswith(" UTC (anonymous)")
        assert firing_table(app).at["station=7", "silenced"] == ""
        (silence,) = list_silences(alertmanager.url)
        assert {m["name"]: m["value"] for m in silence["matchers"]} == {
            "alertname": "congestion",
            "severity": "warning",
            "station": "3",
        }
        assert (silence["createdBy"], silence["comment"]) == ("anonymous", "roadworks")
        wait_for(
            lambda: (
                states()
                == {
                    ("congestion", "3"): "suppressed",
                    ("congestion", "7"): "active",
                    ("silent_detector", "5"): "active",
                    ("larceny", ""): "active",
                }
            ),
            20,
            "the silence to apply to station 3's congestion only",
        )
    finally:
        stop.set()
        notifier.join(timeout=10)


def firing_table(app: AppTest) -> pd.DataFrame:
    """The Firing now table (the first incident table with a trend, after any linked
    incident's), by key."""
    tables = [d.value for d in app.dataframe if "trend" in d.value.columns]
    return tables[-1].set_index("key")


def test_firing_incidents_show_their_rules_input_read_in_one_query(
    lakehouse: Path, open_page: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dashboard.trends

    sql: list[str] = []

    def counted(text: str, *tables: str) -> pd.DataFrame | None:
        sql.append(text)
        return query(text, *tables)

    monkeypatch.setattr(dashboard.trends, "query", counted)
    app = open_page("alerts")
    book_of(rule_store())  # the rule set read (in the background since the first run)
    sql.clear()
    app.run()  # one refresh
    firing = firing_table(app)
    speeds = DeltaTable(str(lakehouse / "station_speed")).to_pandas().sort_values("ts")
    for station in (3, 7):
        row = firing.loc[f"station={station}"]
        assert row["condition"] == "avg_speed < 15"
        # The station's own station_speed rows (one a minute): the last hour of them.
        mine = speeds[speeds["station"] == station]
        mine = mine[mine["ts"] >= mine["ts"].max() - pd.Timedelta(minutes=59)]
        assert list(row["trend"]) == [round(v, 2) for v in mine["avg_speed"]]
        assert row["latest"] == round(mine["avg_speed"].iloc[-1], 2)
        assert row["latest"] < 15 < row["trend"][0]  # the hour shows the fall
    # larceny and silent_detector compare no stored column: nothing to draw.
    assert firing.loc[["door=4", "station=5"], "condition"].isna().all()
    assert firing.loc[["door=4", "station=5"], "latest"].isna().all()
    assert len(sql) == 1 and "station_speed" in sql[0]  # one query for both stations

    # More congested stations: still one query a refresh.
    end = int(time.time() * 1000)
    more = [
        {**r, "key": f"station={s}", "incident_id": f"more-{s}"}
        for r in incident_rows(end)
        if r["key"] == "station=3"
        for s in (1, 2, 4)
    ]
    write_incidents(lakehouse, more)
    time.sleep(VERSION_TTL_S + 0.1)
    sql.clear()
    app.run()
    assert len(firing_table(app)) == 7
    assert len(firing_table(app).loc["station=1", "trend"]) > 0
    assert len(sql) == 1


def test_the_first_page_does_not_wait_for_the_rule_set(
    lakehouse: Path, open_page: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dashboard.rule_folder

    release = threading.Event()

    def slow_read(*args: object) -> Book:
        release.wait(30)
        return read_book(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(dashboard.rule_folder, "read_book", slow_read)
    try:
        app = open_page("alerts")
        assert "What the rules watch is being read" in texts(app)
        assert firing_table(app)["condition"].isna().all()
        assert len(firing_table(app)) == 4  # the rest of the page is there
    finally:
        release.set()
    book_of(rule_store())
    app.run()
    assert "What the rules watch is being read" not in texts(app)
    assert firing_table(app).at["station=3", "condition"] == "avg_speed < 15"


def test_a_resolved_incident_s_input_ends_at_its_resolution(
    lakehouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    incidents = DeltaTable(str(lakehouse / "incidents")).to_pandas()
    (old,) = incidents.query("key == 'station=7' and resolved_at.notna()").itertuples()
    resolved_ms = int(old.resolved_at.timestamp() * 1000)
    # Station 7's speed, a row a minute from 4 hours before that resolution to 2 hours
    # after: the value is how many minutes before the resolution the row is.
    minutes = list(range(240, -121, -1))
    rows = pa.table(
        {
            "station": pa.array([7] * len(minutes), pa.int32()),
            "ts": pa.array([resolved_ms - m * 60_000 for m in minutes], pa.int64())
            .cast(pa.timestamp("ms", tz="UTC"))
            .cast(TS),
            "avg_speed": pa.array(minutes, pa.float64()),
        }
    )
    write_deltalake(str(lakehouse / "station_speed"), rows, mode="append")
    book_of(rule_store())
    app = AppTest.from_file(str(APP), default_timeout=60)
    app.query_params[INCIDENT_PARAM] = old.incident_id
    app.run()
    linked = next(d.value for d in app.dataframe if "trend" in d.value.columns)
    assert list(linked["key"]) == ["station=7"]
    # The hour up to the resolution, none after it.
    assert list(linked["trend"].iloc[0]) == [float(m) for m in range(59, -1, -1)]
    assert linked["latest"].iloc[0] == 0


def test_a_notification_link_shows_its_incident_first_and_chooses_it(lakehouse: Path) -> None:
    incidents = DeltaTable(str(lakehouse / "incidents")).to_pyarrow_table().to_pylist()
    (theft,) = [r for r in incidents if r["rule"] == "larceny"]
    # The link the notifier sends: the dashboard's root (its first page, Alerts).
    link = urlsplit(to_alert(theft, datetime.now(UTC), Config())["generatorURL"])
    assert link.path == "/"
    app = AppTest.from_file(str(APP), default_timeout=60)
    for name, values in parse_qs(link.query).items():
        app.query_params[name] = values
    app.run()
    assert not app.exception
    assert [h.value for h in app.subheader][:2] == ["Linked incident", "Firing now"]
    first = app.dataframe[0].value
    assert list(first["key"]) == ["door=4"] and list(first["rule"]) == ["larceny"]
    assert app.selectbox(key="incident_pick").value == theft["incident_id"]

    # Shown whatever the filters; the operator's own choice then stands.
    app.multiselect(key="filter_rules").select("congestion").run()
    assert list(app.dataframe[0].value["key"]) == ["door=4"]
    assert "door=4" not in firing_table(app).index
    (station_3,) = [
        r["incident_id"] for r in incidents if r["key"] == "station=3" and r["resolved_at"] is None
    ]
    app.selectbox(key="incident_pick").select(station_3).run()
    app.run()
    assert app.selectbox(key="incident_pick").value == station_3


def test_a_link_to_an_unknown_incident_says_so(lakehouse: Path) -> None:
    app = AppTest.from_file(str(APP), default_timeout=60)
    app.query_params[INCIDENT_PARAM] = "no-such-incident"
    app.run()
    assert "`no-such-incident` is not in the incidents table" in texts(app)
    assert len(firing_table(app)) == 4
    assert app.selectbox(key="incident_pick").value is None


@pytest.mark.slow
def test_silenced_incidents_say_until_when_and_by_whom(
    lakehouse: Path,
    open_page: Open,
    alertmanager: Alertmanager,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOOKOUT_ALERTMANAGER_URL", alertmanager.url)
    hours = timedelta(hours=2)
    create_silence(alertmanager.url, {"alertname": "congestion", "station": "3"}, hours, "ann", "x")
    regex = {"name": "station", "value": "5|6", "isRegex": True, "isEqual": True}
    now = datetime.now(UTC)
    request(
        alertmanager.url,
        "POST",
        "/api/v2/silences",
        {
            "matchers": [regex],
            "startsAt": now.isoformat(),
            "endsAt": (now + hours).isoformat(),
            "createdBy": "bob",
            "comment": "sensor swap",
        },
    )
    ended = create_silence(alertmanager.url, {"station": "7"}, hours, "cy", "over")
    expire_silence(alertmanager.url, ended)
    firing = firing_table(open_page("alerts"))
    said = re.fullmatch(r"until (\d\d):(\d\d) UTC \(ann\)", firing.at["station=3", "silenced"])
    assert said, firing.at["station=3", "silenced"]
    minutes = int(said.group(1)) * 60 + int(said.group(2))
    due = now + hours
    assert abs((minutes - (due.hour * 60 + due.minute) + 720) % 1440 - 720) <= 2
    assert firing.at["station=5", "silenced"].endswith(" UTC (bob)")
    assert firing.at["station=7", "silenced"] == ""  # its silence has expired
    assert firing.at["door=4", "silenced"] == ""
    # A silence ending a day or more away says its date too.
    create_silence(alertmanager.url, {"alertname": "larceny"}, timedelta(days=3), "dee", "x")
    time.sleep(TTL_SECONDS + 0.1)
    firing = firing_table(open_page("alerts"))
    assert re.fullmatch(
        r"until \d{4}-\d\d-\d\d \d\d:\d\d UTC \(dee\)", firing.at["door=4", "silenced"]
    )


def test_the_page_draws_when_alertmanager_does_not_answer(lakehouse: Path, open_page: Open) -> None:
    # The fixtures point [alertmanager] url at a port nothing listens on.
    app = open_page("alerts")
    assert set(firing_table(app)["silenced"]) == {"unknown"}
    assert "Silences unknown: Alertmanager did not answer" in texts(app)
    assert not app.error


def test_no_silence_column_when_incidents_bypass_alertmanager(
    lakehouse: Path, open_page: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOKOUT_ALERTMANAGER_ENABLED", "false")
    app = open_page("alerts")
    assert "silenced" not in firing_table(app).columns
    assert "Silences unknown" not in texts(app)


# ---- traffic -------------------------------------------------------------------------


def test_traffic_strip_and_station_detail(lakehouse: Path, open_page: Open) -> None:
    app = open_page("traffic")
    strip = next(m.value for m in app.markdown if "station 1" in m.value)
    assert "<b>station 3</b><br>congested" in strip
    assert "<b>station 7</b><br>congested" in strip
    assert "<b>station 5</b><br>silent" in strip
    assert "<b>station 1</b><br>normal" in strip
    assert len(app.get("vega_lite_chart")) >= 2  # speed and volume per station
    app.selectbox(key="station").select(3).run()
    detail = app.dataframe
    assert (detail[0].value["source"] == "station-3").all()
    assert set(detail[1].value["rule"]) == {"congestion"}


def test_traffic_tiles_age_by_the_wall_clock_so_a_frozen_stream_looks_stale(
    empty_lakehouse: Path, open_page: Open
) -> None:
    # The stream's clock froze ten minutes ago: nothing has arrived since. By its own
    # clock every station's newest reading is "0 min" old.
    now_ms = int(time.time() * 1000)
    write_sample(empty_lakehouse, readings=3000, alerts=40, end_ms=now_ms - 600_000)
    app = open_page("traffic")
    assert set(strip_states(app).values()) == {"silent"}
    strip = next(m.value for m in app.markdown if "station 1" in m.value)
    assert re.search(r"<b>station 1</b><br>silent<br>.*· arrived 10 min ago<", strip)
    assert "wall clock since the station's newest reading reached Lookout" in strip


def test_a_station_trailing_the_stream_clock_is_silent_though_its_readings_arrive(
    lakehouse: Path, open_page: Open
) -> None:
    now_ms = int(time.time() * 1000)
    # Station 9's readings arrive now, stamped 8 minutes behind the stream clock.
    behind = traffic_readings(now_ms, 20, seed=3)
    for column, value in (
        ("station", 9),
        ("ts", pd.Timestamp(now_ms - 480_000, unit="ms", tz="UTC")),
        ("received_at", pd.Timestamp(now_ms, unit="ms", tz="UTC")),
    ):
        index = behind.schema.get_field_index(column)
        behind = behind.set_column(
            index, column, pa.array([value] * 20).cast(behind.schema.field(index).type)
        )
    write_deltalake(str(lakehouse / "readings_traffic"), behind, mode="append")
    app = open_page("traffic")
    states = strip_states(app)
    assert states[9] == "silent" and states[1] == "normal"
    strip = next(m.value for m in app.markdown if "station 1" in m.value)
    assert re.search(
        "<b>station 9</b><br>silent<br>.*· arrived &lt; 1 min ago · 8 min behind<", strip
    )


def test_an_acknowledged_congestion_no_longer_colours_the_station(
    lakehouse: Path, open_page: Open
) -> None:
    alerts = open_page("alerts")
    alerts.text_input[0].input("station=3").run()
    ack = alerts.multiselect(key="ack_ids")
    for option in ack.options:
        ack.select(option)
    alerts.button(key="ack_submit").click().run()
    strip = next(m.value for m in open_page("traffic").markdown if "station 1" in m.value)
    assert "<b>station 3</b><br>normal" in strip
    assert "<b>station 7</b><br>congested" in strip


def chart_data(app: AppTest, index: int) -> pd.DataFrame:
    """The rows the page's `index`-th Vega-Lite chart draws."""
    return convert_arrow_bytes_to_pandas_df(app.get("vega_lite_chart")[index].proto.data.data)


def test_per_minute_charts_draw_whole_minutes_only(lakehouse: Path, open_page: Open) -> None:
    # Readings from before the chart's hour too, so that its start cuts a minute.
    older = traffic_readings(int(time.time() * 1000) - 3_000_000, 1500, seed=5)
    write_deltalake(str(lakehouse / "readings_traffic"), older, mode="append")
    readings = DeltaTable(str(lakehouse / "readings_traffic")).to_pandas()
    clock = readings["ts"].max()
    app = open_page("traffic")
    volume = chart_data(app, 1).groupby("minute")["vehicles"].sum()
    # Neither the minute still running at the stream clock nor one cut by the window's start.
    assert volume.index.max() == clock.floor("min") - pd.Timedelta(minutes=1)
    assert volume.index.min() == clock.floor("min") - pd.Timedelta(minutes=60)
    whole = readings.groupby(readings["ts"].dt.floor("min")).size()
    assert volume.iloc[0] == whole[volume.index.min()]
    assert volume.iloc[-1] == whole[volume.index.max()]


def test_time_axes_use_the_24_hour_clock(lakehouse: Path, open_page: Open) -> None:
    for page in ("alerts", "traffic", "rfid"):
        app = open_page(page)
        for chart in app.get("vega_lite_chart"):
            spec = json.loads(chart.proto.spec)
            layers = spec.get("layer", [spec])
            x = layers[0]["encoding"]["x"]
            assert x["type"] == "temporal" and x["axis"]["format"].endswith("%H:%M"), page


def test_station_tiles_keep_one_width_on_a_short_last_row(lakehouse: Path, open_page: Open) -> None:
    strip = next(m.value for m in open_page("traffic").markdown if "station 1" in m.value)
    assert "grid-template-columns:repeat(auto-fill,minmax(6.5em,1fr))" in strip
    assert "flex:1" not in strip  # a wrapped flex row stretched its tiles to fill it


def test_no_tile_is_congested_while_the_page_says_none_can_be(
    lakehouse: Path, rules_folder: Path, open_page: Open
) -> None:
    # `congestion` alerts stand at stations 3 and 7, but the rule is now called `jam`.
    traffic = rules_folder / "traffic.sql"
    traffic.write_text(traffic.read_text().replace("CREATE ALERT congestion", "CREATE ALERT jam"))
    app = open_page("traffic")
    (warning,) = [w.value for w in app.warning]
    assert warning.startswith("No station can show as congested.")
    states = strip_states(app)
    assert "congested" not in states.values()
    assert states[3] == states[7] == "normal"


# ---- RFID ----------------------------------------------------------------------------


def test_rfid_doors_alarms_groups_and_item_path(lakehouse: Path, open_page: Open) -> None:
    app = open_page("rfid")
    doors, alarms, groups = (d.value for d in app.dataframe[:3])
    assert list(doors["door"]) == ["1", "2", "3", "4"]
    assert "item-0042" in alarms["message"].iloc[0]
    assert groups["items"].min() >= 3
    # The theft incident, linked to the Alerts page as its notification links to it.
    incidents = DeltaTable(str(lakehouse / "incidents")).to_pandas()
    (theft,) = incidents.query("rule == 'larceny'")["incident_id"]
    (link,) = app.get("page_link")
    assert link.proto.label.startswith("Theft incident at door=4, firing since")
    assert link.proto.query_string == f"{INCIDENT_PARAM}={theft}"
    # Once it is resolved, no link, and the page says so.
    (row,) = [r for r in incident_rows(int(time.time() * 1000)) if r["rule"] == "larceny"]
    resolved = int(time.time() * 1000)
    write_incidents(lakehouse, [{**row, "incident_id": theft, "resolved_at": resolved}])
    time.sleep(VERSION_TTL_S + 0.1)
    app.run()
    assert not app.get("page_link")
    assert "No theft incident is firing." in texts(app)
    app.text_input(key="tagid").input("item-0110").run()
    assert "door 1 → 2 → 3 → 4" in texts(app)
    app.text_input(key="tagid").input("nothing-like-this").run()
    assert "No read of tag" in texts(app)


# ---- rules ---------------------------------------------------------------------------


def test_rules_list_text_explanation_and_alert_count(lakehouse: Path, open_page: Open) -> None:
    app = open_page("rules")
    summary = app.dataframe[0].value.set_index("rule")
    assert summary.loc["congestion", "alerts"] == 37  # 40 minus the three other alerts
    assert summary.loc["larceny", "alerts"] == 1
    app.selectbox(key="rule_shown").select("congestion").run()
    code = texts(app)
    assert "alert **congestion** (traffic.sql:19) — 37 alerts" in code
    assert "CREATE ALERT congestion SEVERITY warning" in code
    assert "reads stream: station_speed" in code  # the explanation
    app.selectbox(key="rule_shown").select("station_speed").run()
    assert "15 minutes" in texts(app).split("station_speed: derived stream")[1]  # its window


def test_saving_an_invalid_then_a_valid_rule(
    lakehouse: Path, rule_store: Path, open_page: Open
) -> None:
    app = open_page("rules")
    app.text_input(key="rule_name::(new file)").input("slow")
    app.text_area(key="rule_text::(new file)").input(
        "CREATE ALERT slow SEVERITY warning\n  AS SELECT station, ts, speed FROM trafic;\n"
    )
    app.button(key="rule_save").click().run()
    assert not (rule_store / "slow.sql").exists()
    annotated = texts(app)
    assert "nothing was saved" in annotated
    assert "| 2:" in annotated and "unknown stream 'trafic'" in annotated

    app.text_area(key="rule_text::(new file)").input(
        "CREATE ALERT slow SEVERITY warning\n"
        "  AS SELECT station, ts, speed FROM traffic WHERE speed < 5;\n"
    )
    app.button(key="rule_save").click().run()
    assert "Saved" in texts(app)
    assert "speed < 5" in (rule_store / "slow.sql").read_text()


def test_a_bad_file_name_is_refused(lakehouse: Path, rules_folder: Path, open_page: Open) -> None:
    app = open_page("rules")
    app.text_input(key="rule_name::(new file)").input("../escape")
    app.text_area(key="rule_text::(new file)").input("-- nothing\n")
    app.button(key="rule_save").click().run()
    assert "letters, digits and underscores" in texts(app)
    assert not (rules_folder.parent / "escape.sql").exists()


def test_the_library_is_read_only_and_user_files_are_managed(
    lakehouse: Path, rules_folder: Path, rule_store: Path, open_page: Open
) -> None:
    app = open_page("rules")
    assert app.selectbox(key="rule_file").options == ["(new file)"]  # no library file
    app.text_input(key="rule_name::(new file)").input("traffic")
    app.text_area(key="rule_text::(new file)").input("-- shadowing the library\n")
    app.button(key="rule_save").click().run()
    assert "a file of the rule library, which is read-only here" in texts(app)

    rule_store.mkdir()
    (rule_store / "crawl.sql").write_text(
        "CREATE ALERT crawl SEVERITY info AS SELECT station, ts FROM traffic WHERE speed < 1;\n"
    )
    app = open_page("rules")
    assert app.selectbox(key="manage_file").options == ["crawl.sql"]
    app.button(key="manage_disable").click().run()
    assert "`crawl.sql` is no longer loaded." in texts(app)
    assert (rule_store / "crawl.sql.disabled").exists()
    assert app.selectbox(key="manage_file").options == ["crawl.sql (disabled)"]
    app.checkbox(key="manage_sure").check().run()
    app.button(key="manage_delete").click().run()
    assert not list(rule_store.glob("crawl*"))
    changes = app.dataframe[-1].value
    assert list(changes["action"]) == ["deleted", "disabled"]
    assert set(changes["user"]) == {"anonymous"}  # sign-in is off in these tests


# ---- health --------------------------------------------------------------------------


def test_health_up_streams_quarantine_and_tables(lakehouse: Path, open_page: Open) -> None:
    write_health(lakehouse, int(time.time() * 1000))
    app = open_page("health")
    assert metrics(app)["engine"] == "up"
    assert metrics(app)["ingest-0"] == "up"
    assert metrics(app)["quarantined payloads"] == "3"
    queries, streams, quarantine, tables = (d.value for d in app.dataframe)
    assert list(queries["name"]) == ["engine"]
    assert list(queries["live_keys"]) == [25]
    assert "Health: green." in texts(app) and not app.error
    assert set(streams["status"]) == {"ok"}
    assert dict(zip(streams["stream"], streams["late (total)"], strict=True)) == {
        "traffic": 2,
        "tag_readings": 1,
    }
    assert dict(zip(streams["stream"], streams["duplicates (total)"], strict=True)) == {
        "traffic": 5,
        "tag_readings": 0,
    }
    # The last minute's figures (sample.write_health), as a rate for what arrived.
    assert dict(zip(streams["stream"], streams["duplicates"], strict=True)) == {
        "traffic": 2,
        "tag_readings": 0,
    }
    assert dict(zip(streams["stream"], streams["arrived/s"], strict=True))["traffic"] == 310.05
    assert streams["engine lag (s)"].max() < 1
    assert dict(zip(streams["stream"], streams["live keys"], strict=True)) == {
        "traffic": 40,
        "tag_readings": 212,
    }
    assert set(streams["key cap"]) == {"500,000"}
    assert "missing field 'ts'" in set(quarantine["reason"])
    assert {"alerts", "readings_traffic", "quarantine"} <= set(tables["table"])
    compacted = dict(zip(tables["table"], tables["files compacted"], strict=True))
    assert compacted["readings_traffic"] == 611  # the engine's record, sample.write_health
    assert pd.isna(compacted["alerts"])
    deleted = dict(zip(tables["table"], tables["files deleted"], strict=True))
    assert deleted["readings_traffic"] == 1_204 and pd.isna(deleted["alerts"])
    log_deleted = dict(zip(tables["table"], tables["log files deleted"], strict=True))
    assert log_deleted["readings_traffic"] == 2_310 and pd.isna(log_deleted["alerts"])


def test_health_red_says_which_stream_crossed_what(lakehouse: Path, open_page: Open) -> None:
    write_red_health(lakehouse, int(time.time() * 1000))
    app = open_page("health")
    (red,) = app.error
    assert red.value.startswith("**Health: red**")
    assert (
        "stream traffic: 50,705 of the 50,735 readings that arrived in the last 60 s were "
        "duplicates (99.9 %; the limit is 5 %)" in red.value
    )
    assert "stream traffic: its clock (newest event time) has stood at" in red.value
    assert "for 270 s while 50,735 readings arrived (the limit is 60 s)" in red.value
    assert (
        "stream tag_readings: 12 readings of new keys were quarantined in the last 60 s: a "
        "rule reading it holds state for max_live_keys = 5000 keys" in red.value
    )
    streams = app.dataframe[1].value
    assert dict(zip(streams["stream"], streams["status"], strict=True)) == {
        "traffic": "red: duplicates, clock stopped",
        "tag_readings": "red: key cap",
    }
    assert dict(zip(streams["stream"], streams["capped"], strict=True))["tag_readings"] == 12


def test_health_down_when_the_files_are_stale(lakehouse: Path, open_page: Open) -> None:
    stale = int(time.time() * 1000) - 120_000
    write_health(lakehouse, stale)
    record = orjson.loads((lakehouse / "_health" / "ingest-0.json").read_bytes())
    assert record["updated_at_ms"] == stale
    app = open_page("health")
    assert metrics(app)["engine"] == "down"
    assert metrics(app)["ingest-0"] == "down"
    # 120 s when written, a second or so more once the page has read it.
    assert re.search(r"- engine is down: its last report is 12\d s old", app.error[0].value)


def test_an_idle_stream_shows_no_watermark_or_lag(lakehouse: Path, open_page: Open) -> None:
    now_ms = int(time.time() * 1000)
    write_health(lakehouse, now_ms)
    # A stream declared and ingested but without a reading yet, which the engine reports
    # with a watermark at the start of time.
    write_deltalake(str(lakehouse / "readings_weather"), pa.table({"ts": pa.array([], TS)}))
    path = lakehouse / "_health" / "engine.json"
    record = orjson.loads(path.read_bytes())
    idle = {"stream": "weather", "watermark_ms": 0, "lag_ms": now_ms, "max_event_ms": 0}
    record["streams"].append(idle)
    path.write_bytes(orjson.dumps(record))
    streams = open_page("health").dataframe[1].value.set_index("stream")
    assert streams.at["weather", "status"] == "no readings yet"
    assert pd.isna(streams.at["weather", "watermark"])
    assert pd.isna(streams.at["weather", "engine lag (s)"])
    assert streams.at["traffic", "status"] == "ok"
    assert streams.at["traffic", "watermark"].year > 2000


# ---- inputs survive reruns -------------------------------------------------------------


def append_alert(lakehouse: Path, rule: str, seed: int, key: str = "station=5") -> None:
    """Append one open alert of `rule` for `key`, a minute old."""
    table = alerts_table(int(time.time() * 1000), 1, seed=seed)
    for column, value in (("rule", rule), ("alert_id", f"{rule}-{seed}"), ("key", key)):
        table = table.set_column(table.schema.get_field_index(column), column, pa.array([value]))
    write_deltalake(str(lakehouse / "alerts"), table, mode="append")


def test_filters_keep_their_choices_when_a_new_rule_appears(
    lakehouse: Path, open_page: Open
) -> None:
    # (Text typed but not yet sent lives in the browser: test_browser.py covers it.)
    app = open_page("alerts")
    app.multiselect(key="filter_rules").select("larceny")
    app.multiselect(key="filter_severities").select("critical")
    app.text_input(key="filter_key").input("door")
    app.selectbox(key="filter_range").select("last 24 hours")
    app.selectbox(key="filter_status").select("open").run()
    # A new rule's first alert changes the filters' options; the choices must stay.
    append_alert(lakehouse, "speeding", seed=1)
    time.sleep(VERSION_TTL_S + 0.1)
    app.run()
    assert "speeding" in app.multiselect(key="filter_rules").options
    assert app.multiselect(key="filter_rules").value == ["larceny"]
    assert app.multiselect(key="filter_severities").value == ["critical"]
    assert app.text_input(key="filter_key").value == "door"
    assert app.selectbox(key="filter_range").value == "last 24 hours"
    assert app.selectbox(key="filter_status").value == "open"
    assert metrics(app)["matching alerts"] == "1"  # the filters still apply


# ---- the alerts the Traffic and RFID pages build on ------------------------------------


def strip_states(app: AppTest) -> dict[int, str]:
    """Station number -> state, read from the strip's boxes."""
    strip = next(m.value for m in app.markdown if "station 1" in m.value)
    return {int(n): state for n, state in re.findall(r"<b>station (\d+)</b><br>(\w+)", strip)}


def test_the_congestion_rule_is_configured_by_name(
    lakehouse: Path, rules_folder: Path, open_page: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator renamed the rule: `jam`, whose open alert now stands at station 4.
    traffic = rules_folder / "traffic.sql"
    text = traffic.read_text().replace("CREATE ALERT congestion", "CREATE ALERT jam")
    traffic.write_text(text.replace("WHERE avg_speed < 15", "WHERE avg_speed < 12"))
    append_alert(lakehouse, "jam", seed=2, key="station=4")
    monkeypatch.setenv("LOOKOUT_DASHBOARD_CONGESTION_RULE", "jam")
    app = open_page("traffic")
    assert not app.warning
    states = strip_states(app)
    # Only `jam` alerts count now: the old `congestion` alerts at 3 and 7 do not.
    assert {n for n, s in states.items() if s == "congested"} == {4}
    assert states[5] == "silent"
    # The speed chart's dashed line is the renamed rule's own bound.
    assert "`jam` fires below 12 m/s" in texts(app)
    speed_chart = json.loads(app.get("vega_lite_chart")[0].proto.spec)
    assert speed_chart["layer"][1]["encoding"]["y"] == {"datum": 12.0}


def test_a_congestion_rule_missing_from_the_rules_says_what_to_set(
    lakehouse: Path, open_page: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOKOUT_DASHBOARD_CONGESTION_RULE", "jam")
    app = open_page("traffic")
    (warning,) = [w.value for w in app.warning]
    assert "no rule `jam`" in warning
    assert "congestion_rule" in warning and "LOOKOUT_DASHBOARD_CONGESTION_RULE" in warning
    # The alerts keyed by station are offered; the unkeyed and the door-keyed are not.
    assert "`congestion`" in warning and "`stopped_vehicle`" in warning
    assert "`speeding`" not in warning and "`larceny`" not in warning
    assert "congested" not in strip_states(app).values()
    assert "Dashed line" not in texts(app)  # no rule, no threshold to draw


def test_the_theft_rule_is_configured_in_lookout_toml_and_checked(
    lakehouse: Path, tmp_path: Path, open_page: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "lookout.toml"
    monkeypatch.setenv("LOOKOUT_CONFIG", str(config))
    config.write_text('[dashboard]\ntheft_rule = "missed_shipping"\n')
    app = open_page("rfid")
    assert "keyed by tagid, not by door" in " ".join(w.value for w in app.warning)
    assert "No theft alarm." not in texts(app)  # no false all-clear

    append_alert(lakehouse, "door_alarm", seed=3, key="door=2")
    rfid = tmp_path / "rules" / "rfid.sql"
    rfid.write_text(rfid.read_text().replace("CREATE ALERT larceny", "CREATE ALERT door_alarm"))
    config.write_text('[dashboard]\ntheft_rule = "door_alarm"\n')
    time.sleep(VERSION_TTL_S + 0.1)  # the dashboard looks for new commits this often
    app = open_page("rfid")
    assert not app.warning
    alarms = app.dataframe[1].value
    assert list(alarms["key"]) == ["door=2"]  # the larceny alert is no longer shown
