"""`lookout notify`: post the incidents to Alertmanager, as Prometheus posts its alerts.

The outbox is the `incidents` Delta table itself, read on its own schedule by this
process: the engine's batches never wait for Alertmanager, and nothing is lost while
it is down, since what is to be said is always in the table. Each poll reads the
firing incidents and the resolved ones Alertmanager was told were firing, and posts:

* every firing incident that is new to this process or not posted for
  `resend_seconds` (Alertmanager keeps alerts in memory only: resending is how a
  restarted one learns them again), with `endsAt` four resends ahead, so that one whose
  notifier has gone resolves by itself;
* every resolved incident it announced as firing, with `endsAt` = `resolved_at`.

Progress is one durable record (`<lakehouse>/_notify/alertmanager.json`): the ids of
the incidents announced as firing and not yet delivered as resolved. An id is written
there *before* its first post, and leaves only after its resolution was accepted, so
a crash anywhere repeats a post at worst (Alertmanager deduplicates by labels) and
never loses a resolution. A failed post is retried with exponential backoff.

An incident that opens and resolves between two polls, or while Alertmanager is
unreachable, reaches it as resolved only, and Alertmanager notifies no one of an alert
it never notified as firing (as with Prometheus); the incidents table and the
dashboard keep it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import orjson
import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import TableNotFoundError

from lookout.alertmanager import AlertmanagerError, request, rfc3339
from lookout.config import Config
from lookout.storage import lakehouse_options, put_whole, read_whole

log = logging.getLogger("lookout.notify")

# How far ahead a firing alert says it ends, in resend intervals (Prometheus: 4).
ENDS_AFTER_RESENDS = 4

# The query parameter of the link back: the dashboard's Alerts page (its first page, at
# the root) shows the incident it names.
INCIDENT_PARAM = "incident"

_KEY_PART = re.compile(r"(\w+)=(.*?)(?=, \w+=|$)")


def key_labels(key: str) -> dict[str, str]:
    """The `incidents` key text (`station=3, lane=1`) as labels."""
    return {name: value for name, value in _KEY_PART.findall(key)}


def incident_labels(incident: Mapping[str, Any]) -> dict[str, str]:
    """The labels an incident is posted with (its rule, severity and key): what a silence
    of it matches."""
    # The key's columns first: a column named like alertname or severity cannot hide them.
    return {
        **key_labels(incident["key"]),
        "alertname": incident["rule"],
        "severity": incident["severity"],
    }


def state_location(config: Config) -> str:
    """Where the notifier's progress is kept: beside the tables it describes."""
    return f"{config.lakehouse.rstrip('/')}/_notify/alertmanager.json"


def dashboard_url(config: Config) -> str:
    """The base of every alert's generatorURL."""
    if config.alertmanager.dashboard_url:
        return config.alertmanager.dashboard_url.rstrip("/")
    return f"http://{config.dashboard.address}:{config.dashboard.port}"


def incident_url(base: str, incident_id: str) -> str:
    """The link to one incident on the dashboard at `base`: `<base>/?incident=<id>`."""
    return f"{base.rstrip('/')}/?{urlencode({INCIDENT_PARAM: incident_id})}"


def to_alert(incident: dict[str, Any], now: datetime, config: Config) -> dict[str, Any]:
    """One incident as a postable alert of Alertmanager's v2 API."""
    resolved = incident["resolved_at"]
    if resolved is None:
        ends = now + timedelta(seconds=ENDS_AFTER_RESENDS * config.alertmanager.resend_seconds)
    else:
        ends = resolved
    return {
        "labels": incident_labels(incident),
        "annotations": {
            "message": incident["message"] or "",
            "incident_id": incident["incident_id"],
            "reports": str(incident["reports"]),
        },
        "startsAt": rfc3339(incident["opened_at"]),
        "endsAt": rfc3339(ends),
        "generatorURL": incident_url(dashboard_url(config), incident["incident_id"]),
    }


@dataclass
class Notifier:
    """Posts the incidents of `config`'s lakehouse to `config.alertmanager.url`."""

    config: Config
    announced: set[str] = field(default_factory=set)
    """Incidents announced as firing whose resolution is not delivered yet (durable)."""
    sent_at: dict[str, float] = field(default_factory=dict)
    """When each firing incident was last accepted (monotonic; this process only)."""
    failures: int = 0
    _table: DeltaTable | None = None

    def __post_init__(self) -> None:
        saved = read_whole(state_location(self.config), self.config.s3)
        if saved:
            self.announced = set(orjson.loads(saved)["announced"])

    def _save(self) -> None:
        record = {"announced": sorted(self.announced)}
        put_whole(state_location(self.config), orjson.dumps(record), self.config.s3)

    def _incidents(self) -> list[dict[str, Any]]:
        """The firing incidents, and the announced ones whatever their state."""
        if self._table is None:
            try:
                self._table = DeltaTable(
                    self.config.table("incidents"),
                    storage_options=lakehouse_options(self.config),
                )
            except TableNotFoundError:
                return []  # the engine has not made it yet
        else:
            self._table.update_incremental()
        # DataFusion rather than a pyarrow dataset filter: the engine's merges write
        # string_view columns, which pyarrow cannot compare with a string value set.
        wanted = "resolved_at IS NULL"
        if self.announced:
            ids = ", ".join("'" + i.replace("'", "''") + "'" for i in sorted(self.announced))
            wanted += f" OR incident_id IN ({ids})"
        builder = QueryBuilder().register("incidents", self._table)
        reader = pa.RecordBatchReader.from_stream(
            builder.execute(f"SELECT * FROM incidents WHERE {wanted}")
        )
        return reader.read_all().to_pylist()

    def poll(self) -> bool:
        """Read the table once and post what is due; False when the post failed (the
        same will be due next time)."""
        rows = self._incidents()
        now = datetime.now(tz=UTC)
        clock = time.monotonic()
        resend = self.config.alertmanager.resend_seconds
        resolved = [r for r in rows if r["resolved_at"] is not None]
        firing = [
            r
            for r in rows
            if r["resolved_at"] is None
            and (
                r["incident_id"] not in self.sent_at
                or clock - self.sent_at[r["incident_id"]] >= resend
            )
        ]
        # An announced incident the table no longer has (a lakehouse moved aside) cannot
        # be described any more.
        present = {r["incident_id"] for r in rows}
        new = {r["incident_id"] for r in firing} - self.announced
        if new or not self.announced <= present:
            self.announced = (self.announced & present) | new
            self._save()  # before the post: a crash after it must not forget them
        if not firing and not resolved:
            return True
        # Resolutions first: an incident of the same labels opened since then replaces
        # the resolved one instead of merging with it.
        alerts = [to_alert(r, now, self.config) for r in (*resolved, *firing)]
        try:
            request(
                self.config.alertmanager.url,
                "POST",
                "/api/v2/alerts",
                alerts,
                self.config.alertmanager.timeout_seconds,
            )
        except AlertmanagerError as err:
            if err.status is None or err.status >= 500:
                log.warning("posting %d incidents failed, will retry: %s", len(alerts), err)
                return False
            # Refused as malformed: sending it again cannot help.
            log.error("Alertmanager refused %d incidents: %s", len(alerts), err)
        # Only the firing incidents still need a resend time.
        still = {r["incident_id"] for r in rows if r["resolved_at"] is None}
        self.sent_at = {i: t for i, t in self.sent_at.items() if i in still}
        for r in firing:
            self.sent_at[r["incident_id"]] = clock
        if resolved:
            self.announced -= {r["incident_id"] for r in resolved}
            self._save()
        # New and resolved incidents are news; the periodic resends are not.
        level = logging.INFO if new or resolved else logging.DEBUG
        log.log(level, "posted %d firing (%d new) and %d resolved incidents",
                len(firing), len(new), len(resolved))  # fmt: skip
        return True

    def delay(self) -> float:
        """Seconds until the next poll: `poll_seconds`, doubling after each failure up
        to `max_backoff_seconds`."""
        settings = self.config.alertmanager
        return min(settings.max_backoff_seconds, settings.poll_seconds * 2**self.failures)

    def run(self, stop: threading.Event) -> None:
        """Poll until `stop` is set."""
        while not stop.is_set():
            try:
                ok = self.poll()
            except Exception:
                # The lakehouse unreadable for a moment, a file vacuumed under a read, the
                # table replaced: the notifier must outlive them. Open the table afresh.
                log.exception("reading the incidents failed, will retry")
                self._table = None
                ok = False
            self.failures = 0 if ok else min(self.failures + 1, 16)
            stop.wait(self.delay())
