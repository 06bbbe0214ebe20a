"""The dashboard over a lakehouse on S3 (a real S3 server, moto's, on 127.0.0.1).

The sample lakehouse is written to a folder, then copied object by object into the
bucket with boto3 (a Delta table's log names its files relative to the table, so the
copy is the same table). Every page must then show over `s3://` what it shows over the
folder, and an acknowledgement must land in the bucket. The server runs in its own
process: the dashboard's delta-rs calls would otherwise wait on it holding the GIL.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import data
from dashboard.sample import write_health
from tests.dashboard.helpers import metrics
from tests.s3server import S3Server

PAGES = ("alerts", "traffic", "rfid", "health")


def copy_to_bucket(folder: Path, s3: S3Server, prefix: str) -> None:
    client = s3.client()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            client.put_object(Bucket=s3.bucket, Key=key, Body=path.read_bytes())


def shown(app: AppTest) -> tuple[dict[str, str], list[pd.DataFrame]]:
    """A page's metrics and tables, without the columns that age with the clock."""
    frames = [
        d.value.drop(columns=[c for c in d.value.columns if "lag" in c or "age" in c])
        for d in app.dataframe
    ]
    return metrics(app), frames


@pytest.fixture
def on_s3(lakehouse: Path, s3_process: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The sample lakehouse copied into the bucket; returns the settings reaching it."""
    write_health(lakehouse, int(time.time() * 1000) + 600_000)  # "up" throughout
    copy_to_bucket(lakehouse, s3_process, "lake")
    for name, value in s3_process.env().items():
        monkeypatch.setenv(name, value)
    return {"LOOKOUT_LAKEHOUSE_PATH": s3_process.url("lake")}


@pytest.mark.slow
def test_every_page_shows_over_s3_what_it_shows_over_the_folder(
    lakehouse: Path, on_s3: dict[str, str], open_page, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = {page: shown(open_page(page)) for page in PAGES}
    monkeypatch.setenv("LOOKOUT_LAKEHOUSE_PATH", on_s3["LOOKOUT_LAKEHOUSE_PATH"])
    for page in PAGES:
        app = open_page(page)
        assert not app.error, (page, [e.value for e in app.error])
        remote = shown(app)
        assert remote[0] == local[page][0], page
        assert len(remote[1]) == len(local[page][1]) > 0, page
        for got, want in zip(remote[1], local[page][1], strict=True):
            pd.testing.assert_frame_equal(got, want)
    assert data.lakehouse().startswith("s3://")
    assert set(data.table_names("readings_")) == {"readings_traffic", "readings_tag_readings"}
    assert data.ingest_parts() == ["ingest-0"]


def test_an_acknowledgement_lands_in_the_bucket(
    on_s3: dict[str, str], s3_process: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOKOUT_LAKEHOUSE_PATH", on_s3["LOOKOUT_LAKEHOUSE_PATH"])
    first = data.query("SELECT min(alert_id) AS id FROM alerts", "alerts")["id"].iloc[0]
    data.acknowledge([first], "crew on the way", "alice")

    log = s3_process.keys("lake/alert_acks/_delta_log/")
    assert log == ["lake/alert_acks/_delta_log/00000000000000000000.json"]
    source, tables = data.alert_source()
    acked = data.query(
        f"SELECT alert_id, note, acked_by FROM {source} WHERE note IS NOT NULL", *tables
    )
    assert acked.to_dict("records") == [
        {"alert_id": first, "note": "crew on the way", "acked_by": "alice"}
    ]
