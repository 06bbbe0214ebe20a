"""The command-line options of an ingest process (`python -m ingest`, `lookout ingest`),
apart from the process itself so that building the `lookout` command's parser does not
import the MQTT client and the validator."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of an ingest process (shared with `lookout ingest`)."""
    parser.add_argument("--rules", nargs="*", default=None, help="rule files or folders")
    parser.add_argument("--id", default="0", help="this ingester's id (unique per process)")
    parser.add_argument("--share", default=None, help="MQTT shared-subscription group")
    parser.add_argument(
        "--heartbeat-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="land a heartbeat for a stream silent this long, assuming no reading arrives "
        "more than SECONDS late (see docs/ingest.md)",
    )
