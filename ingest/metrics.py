"""Ingest's Prometheus metrics, served at `http://<metrics_address>:<metrics_port>/metrics`
(`[ingest]` in lookout.toml) by `lookout ingest`, beside the health record:

* `lookout_ingest_{messages,readings,heartbeats,quarantined,redelivered}_total{ingester}`:
  messages landed and acknowledged, the readings and heartbeats in them, the payloads
  and readings quarantined, the messages the broker sent again;
* `lookout_ingest_landed_files_total{ingester}`: landing files written;
* `lookout_ingest_flush_seconds{ingester}`: the time to make one batch durable (write,
  fsync and rename, or the object PUT);
* `lookout_ingest_connected`, `_subscribed`, `_landing_failing` (1 or 0),
  `lookout_ingest_pending_messages` and `lookout_ingest_landing_lag_seconds` (the last
  landing's oldest message, from receipt to durable) `{ingester}`.

The counts are the ingester's own `IngestStats`, read at each scrape, so the endpoint
and the health record cannot disagree. Process-wide (Prometheus' default registry).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ingest.subscriber import IngestStats

log = logging.getLogger("lookout.ingest")

FLUSH_SECONDS = Histogram(
    "lookout_ingest_flush_seconds",
    "Time to make one batch of landing files durable",
    ["ingester"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)

# metric name (after lookout_ingest_): the IngestStats field and what it counts
_COUNTERS = {
    "messages": ("messages", "MQTT messages landed and acknowledged"),
    "readings": ("readings", "Readings landed"),
    "heartbeats": ("heartbeats", "Heartbeats landed (published and emitted by ingest)"),
    "quarantined": ("quarantined", "Payloads and readings quarantined"),
    "redelivered": ("redelivered", "Messages the broker flagged as sent before"),
    "landed_files": ("files", "Landing files written"),
}


class _StatsCollector(Collector):
    """The counts of every ingester of this process, as they are at the scrape."""

    def __init__(self) -> None:
        self.watched: dict[str, IngestStats] = {}

    def collect(self) -> Iterator[Metric]:
        stats = list(self.watched.values())
        for name, (attribute, text) in _COUNTERS.items():
            family = CounterMetricFamily(f"lookout_ingest_{name}", text, labels=["ingester"])
            for s in stats:
                family.add_metric([s.ingester], getattr(s, attribute))
            yield family
        gauges: dict[str, tuple[str, Callable[[IngestStats], float]]] = {
            "connected": ("Connected to the broker", lambda s: float(s.connected)),
            "subscribed": ("Subscribed to the streams' topics", lambda s: float(s.subscribed)),
            "landing_failing": (
                "The landing storage fails (nothing is acknowledged meanwhile)",
                lambda s: float(s.landing_failing_since_ms > 0),
            ),
            "pending_messages": ("Messages received, not landed yet", lambda s: s.pending),
            "landing_lag_seconds": (
                "The last landing's oldest message: receipt to durable",
                lambda s: s.last_landing_lag_ms / 1000,
            ),
        }
        for name, (text, value) in gauges.items():
            gauge = GaugeMetricFamily(f"lookout_ingest_{name}", text, labels=["ingester"])
            for s in stats:
                gauge.add_metric([s.ingester], value(s))
            yield gauge


_COLLECTOR = _StatsCollector()
REGISTRY.register(_COLLECTOR)


def watch(stats: IngestStats) -> None:
    """Report `stats` (an ingester's) under its ingester id, replacing an earlier one's."""
    _COLLECTOR.watched[stats.ingester] = stats


def serve(address: str, port: int) -> None:
    """Serve /metrics on `address:port` (a thread of this process)."""
    start_http_server(port, addr=address)
    log.info("metrics on http://%s:%d/metrics", address, port)
