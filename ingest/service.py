"""`python -m ingest`: one ingester as a long-running process, stopped by SIGTERM/SIGINT.

`build_ingester` is the one place that turns the configuration and the rules into an
`Ingester`; `lookout ingest` and the tests use it too.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

from ingest.arguments import add_arguments
from ingest.object_store import ObjectStore
from ingest.subscriber import Ingester
from ingest.validate import DAY_MS, ClockWindow, Validator
from lookout.config import Config, ConfigError, StreamClock, load_config
from lookout.mqtt_auth import INGEST, load_or_create_credentials
from lookout.services import load_rule_set
from lookout.storage import is_object_store
from rules.language.loader import RuleCheckError, RuleSet

log = logging.getLogger("lookout.ingest")


def build_ingester(
    config: Config,
    rule_set: RuleSet,
    ingester_id: str = "0",
    share_group: str | None = None,
    heartbeat_after_s: float | None = None,
) -> Ingester:
    """An ingester for every `CREATE STREAM … SOURCE` of `rule_set`, as configured.

    It logs in with the installation's ingest login (`[mqtt] credentials_file`, made on
    first use) unless `[mqtt] username` names another, and takes the client id only
    the installation's secret gives.
    """
    sources = list(rule_set.plan.sources())
    unknown = set(config.ingest.streams) - {s.name for s in sources}
    if unknown:
        known = ", ".join(sorted(s.name for s in sources))
        raise ConfigError(
            f"[ingest.streams.{sorted(unknown)[0]}]: the rules declare no such source stream "
            f"(known: {known})"
        )
    validator = Validator(
        sources,
        max_payload_bytes=config.ingest.max_payload_bytes,
        clock=clock_window(StreamClock(config.ingest.max_future_ms, config.ingest.max_past_days)),
        stream_clocks={name: clock_window(c) for name, c in config.ingest.streams.items()},
        max_string_chars=config.ingest.max_string_chars,
    )
    landing = config.landing
    credentials = load_or_create_credentials(config.mqtt.credentials_file)
    return Ingester(
        validator,
        landing_root=(
            ObjectStore.from_url(landing, config.s3) if is_object_store(landing) else landing
        ),
        lakehouse=config.lakehouse,
        s3=config.s3,
        mqtt_config=credentials.mqtt_config(config.mqtt, INGEST),
        ingest_config=config.ingest,
        ingester_id=ingester_id,
        share_group=share_group,
        heartbeat_after_s=heartbeat_after_s,
        client_id=credentials.ingest_client_id(ingester_id),
    )


def clock_window(clock: StreamClock) -> ClockWindow:
    """The validator's clock window for a stream's configured limits."""
    return ClockWindow(max_future_ms=clock.max_future_ms, max_past_ms=clock.max_past_days * DAY_MS)


def run(
    config: Config,
    rule_paths: Sequence[str] | None,
    ingester_id: str = "0",
    share_group: str | None = None,
    heartbeat_after_s: float | None = None,
) -> int:
    """Run one ingester until SIGTERM or SIGINT, then flush, acknowledge and return 0
    (2 when the rules do not check)."""
    try:
        rule_set = load_rule_set(config, rule_paths)
    except RuleCheckError as err:
        for error in err.errors:
            print(error.format(), file=sys.stderr)
        return 2
    try:
        ingester = build_ingester(config, rule_set, ingester_id, share_group, heartbeat_after_s)
    except ConfigError as err:
        print(f"ingest: the configuration cannot be used:\n{err}", file=sys.stderr)
        return 2
    if config.ingest.metrics_port:
        from ingest.metrics import serve

        try:
            serve(config.ingest.metrics_address, config.ingest.metrics_port)
        except OSError as err:  # ingest runs on; only its metrics are missing
            log.warning("no metrics: %s:%d: %s", config.ingest.metrics_address,
                        config.ingest.metrics_port, err)  # fmt: skip
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: ingester.stop())
    ingester.run()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m ingest`: parse the options and `run`."""
    parser = argparse.ArgumentParser(prog="python -m ingest", description=__doc__)
    parser.add_argument("--config", default=None, help="lookout.toml (default: ./lookout.toml)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"python -m ingest: the configuration cannot be used:\n{err}", file=sys.stderr)
        return 2
    return run(config, args.rules, args.id, args.share, args.heartbeat_after)
