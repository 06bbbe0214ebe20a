"""The Rules editor's Preview button: what the edited text's alerts would have raised
on the sample lakehouse's readings (station 5 went quiet 10 minutes before the end,
stations 3 and 7 crawl), with the same checks as saving and nothing saved."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from streamlit.testing.v1 import AppTest

from tests.dashboard.helpers import texts

Open = Callable[[str], AppTest]

RULE = """CREATE ALERT crawling SEVERITY info MESSAGE 'station {station}: {speed} m/s'
  AS SELECT station, ts, speed FROM traffic WHERE speed < 5;
CREATE ALERT hushed SEVERITY warning RESOLVE WHEN TRUE
  AS SELECT station,
            silence(ts) OVER (PARTITION BY station RANGE 5 MINUTES PRECEDING ACTIVE EXPIRATION)
              AS last_reading
     FROM traffic;
"""


def edit(app: AppTest, text: str) -> AppTest:
    app.text_input(key="rule_name::(new file)").input("mine")
    app.text_area(key="rule_text::(new file)").input(text)
    return app


def test_preview_shows_alerts_per_rule_and_key_and_saves_nothing(
    lakehouse: Path, rule_store: Path, open_page: Open
) -> None:
    app = edit(open_page("rules"), RULE)
    app.selectbox(key="rule_preview_span").select("last 24 hours")
    app.button(key="rule_preview").click().run()
    assert not app.exception, [e.value for e in app.exception]
    assert not (rule_store / "mine.sql").exists()
    said = texts(app)
    assert "(the stored watermark)" in said and "evaluated in" in said
    summary = next(d.value for d in app.dataframe if "firing" in d.value.columns)
    quiet = summary[summary["rule"] == "hushed"]
    assert quiet[["key", "alerts", "incidents", "firing"]].values.tolist() == [
        ["station=5", 1, 1, 1]
    ]
    crawling = summary[summary["rule"] == "crawling"]
    assert crawling["alerts"].sum() > 0 and set(crawling["key"]) == {""}
    charts = app.get("vega_lite_chart")
    assert len(charts) == 2  # one per rule under preview


def test_preview_shows_located_errors_and_refuses_modules(
    lakehouse: Path, rule_store: Path, open_page: Open
) -> None:
    app = edit(
        open_page("rules"), "CREATE ALERT slow SEVERITY warning\n  AS SELECT ts FROM trafic;\n"
    )
    app.button(key="rule_preview").click().run()
    said = texts(app)
    assert "nothing was evaluated" in said
    assert "| 2:" in said and "unknown stream 'trafic'" in said
    edit(
        app,
        "CREATE AGGREGATE boom(x DOUBLE) RETURNS DOUBLE LANGUAGE PYTHON AS 'os:system';\n"
        "CREATE ALERT x SEVERITY info AS SELECT station, boom(speed) OVER "
        "(PARTITION BY station ROWS 1 PRECEDING) AS b FROM traffic;\n",
    )
    app.button(key="rule_preview").click().run()
    assert "module 'os' is refused" in texts(app)
    assert not app.get("vega_lite_chart")
