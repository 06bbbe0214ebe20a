"""The `lookout` console command: one entry point for every part."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from lookout.config import ConfigError, load_config


def _engine(args: argparse.Namespace) -> int:
    from lookout.services import run_engine

    if args.archive_classes:
        from lookout.services import archive_classes

        return archive_classes(load_config(args.config), args.rules)
    return run_engine(load_config(args.config), args.rules, standby=args.standby)


def _ingest(args: argparse.Namespace) -> int:
    from ingest.service import run

    return run(load_config(args.config), args.rules, args.id, args.share, args.heartbeat_after)


def _dashboard(args: argparse.Namespace) -> int:
    from lookout.services import run_dashboard

    return run_dashboard(load_config(args.config))


def _dashboard_user(args: argparse.Namespace) -> int:
    import getpass
    from pathlib import Path

    from lookout.passwords import set_user

    users_file = Path(load_config(args.config).dashboard.users_file)
    if args.remove:
        password = None
    elif sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            print("lookout dashboard-user: the passwords differ", file=sys.stderr)
            return 1
    else:
        password = sys.stdin.readline().rstrip("\n")
    if password == "":
        print("lookout dashboard-user: an empty password is refused", file=sys.stderr)
        return 1
    try:
        set_user(users_file, args.name, password)
    except ValueError as err:
        print(f"lookout dashboard-user: {err}", file=sys.stderr)
        return 1
    print(f"{'removed' if args.remove else 'set'} {args.name} in {users_file}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from lookout.demo import run_demo

    return run_demo(load_config(args.config), args)


def _broker(args: argparse.Namespace) -> int:
    from lookout.demo import run_broker

    return run_broker(load_config(args.config))


def _replay(args: argparse.Namespace) -> int:
    from lookout.arrow_memory import use_system_allocator
    from lookout.replay import TimeRange, default_workers, parse_end_at, parse_time, run_replay

    use_system_allocator()
    try:
        end_at = parse_end_at(args.end_at)
    except ValueError as err:
        print(f"lookout replay: --end-at: {err}", file=sys.stderr)
        return 2
    bounds: dict[str, int | None] = {}
    for option, text in (("--from", args.start), ("--until", args.until)):
        try:
            bounds[option] = None if text is None else parse_time(text)
        except ValueError as err:
            print(f"lookout replay: {option}: {err}", file=sys.stderr)
            return 2
    window = TimeRange(bounds["--from"], bounds["--until"])
    if window.start is not None and window.end is not None and window.end <= window.start:
        print("lookout replay: --until must be after --from", file=sys.stderr)
        return 2
    workers = default_workers() if args.workers is None else args.workers
    if workers < 1:
        print("lookout replay: --workers must be at least 1", file=sys.stderr)
        return 2
    return run_replay(
        args.rules, args.input, args.out, end_at, window, args.format, not args.quiet, workers
    )


def _cluster(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from lookout.cluster import LocalCluster

    cluster = LocalCluster(
        Path(args.work_dir), workers=args.workers, cores=args.cores, memory=args.memory,
        port=args.port,
    )  # fmt: skip
    with cluster:
        print(f"Spark standalone master at {cluster.url} with {args.workers} workers; logs in "
              f"{args.work_dir}. Run the engine on it with\n"
              f"  LOOKOUT_ENGINE_MASTER={cluster.url} lookout engine\nCtrl-C stops the cluster.",
              flush=True)  # fmt: skip
        while all(p.poll() is None for p in cluster.processes):
            time.sleep(1)
    print("a cluster process exited; see its log", file=sys.stderr)
    return 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command registered."""
    from ingest.arguments import add_arguments as add_ingest_arguments
    from lookout.alerting_cli import register as register_alerting
    from rules.language.cli import register as register_rules
    from simulators.cli import register as register_simulate

    parser = argparse.ArgumentParser(
        prog="lookout", description="Event monitoring for traffic sensors and RFID readers."
    )
    parser.add_argument("--config", default=None, help="configuration file (default lookout.toml)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo", help="run broker, simulators, ingest, engine, notifier and dashboard"
    )
    demo.add_argument("--rate", type=float, default=200.0, help="traffic readings per second")
    demo.add_argument("--stations", type=int, default=10)
    demo.add_argument("--congestion", default="3,7", help="stations with a congestion episode")
    demo.add_argument(
        "--rfid-rate",
        type=float,
        default=50.0,
        help="RFID door readings per second, with a theft and a missing item planted; 0: no RFID",
    )
    demo.add_argument("--no-browser-hint", action="store_true", help=argparse.SUPPRESS)
    demo.set_defaults(func=_demo)

    broker = commands.add_parser(
        "broker", help="run mosquitto (shipped configuration) with this installation's logins"
    )
    broker.set_defaults(func=_broker)

    engine = commands.add_parser("engine", help="run the Spark job over the rules")
    engine.add_argument("--rules", nargs="*", default=None, help="rule files or folders")
    engine.add_argument(
        "--standby",
        action="store_true",
        help="start Spark now and take over when the engine running on the lakehouse stops",
    )
    engine.add_argument(
        "--archive-classes",
        action="store_true",
        help="record the class archive later engine JVMs start from (about a minute; "
        "docs/runtime.md), then exit; nothing if it is recorded already",
    )
    engine.set_defaults(func=_engine)

    ingest = commands.add_parser("ingest", help="subscribe to MQTT and land readings")
    add_ingest_arguments(ingest)
    ingest.set_defaults(func=_ingest)

    dashboard = commands.add_parser("dashboard", help="serve the Streamlit dashboard")
    dashboard.set_defaults(func=_dashboard)

    user = commands.add_parser(
        "dashboard-user",
        help="set a dashboard user's password (asked for, or one line on stdin), or remove it",
    )
    user.add_argument("name", metavar="NAME")
    user.add_argument("--remove", action="store_true", help="remove the user")
    user.set_defaults(func=_dashboard_user)

    replay = commands.add_parser(
        "replay", help="evaluate rules over recorded readings (JSON lines, Delta, Parquet)"
    )
    replay.add_argument("--rules", action="append", required=True, help="rule file or folder")
    replay.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="[STREAM=]PATH",
        help="readings of STREAM (no STREAM=: each line, or the table, goes to the source "
        "stream whose columns it has): a JSON-lines file, a Delta table's folder, or a "
        "Parquet file or folder",
    )
    replay.add_argument("--out", required=True, help="output folder")
    replay.add_argument(
        "--from",
        dest="start",
        metavar="TIME",
        help="only readings at or after TIME in event time (ISO-8601 with offset, or epoch ms)",
    )
    replay.add_argument("--until", metavar="TIME", help="only readings before TIME in event time")
    replay.add_argument(
        "--format",
        choices=("jsonl", "delta", "parquet"),
        default="jsonl",
        help="outputs as DIR/NAME.jsonl (default), DIR/NAME/ Delta tables or DIR/NAME.parquet",
    )
    replay.add_argument("--quiet", action="store_true", help="no progress on stderr")
    replay.add_argument(
        "--end-at",
        default="infinity",
        metavar="TIME|watermark|infinity",
        help="the final heartbeat: at TIME (ISO-8601 with offset, or epoch ms), none "
        "(watermark: nothing expires because the input ends) or at +infinity (default: "
        "every window closes, every expiration fires)",
    )
    replay.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes evaluating the rules, split by key (default: one per core)",
    )
    replay.set_defaults(func=_replay)

    cluster = commands.add_parser(
        "cluster", help="run a Spark standalone master and workers on 127.0.0.1"
    )
    cluster.add_argument("--workers", type=int, default=2)
    cluster.add_argument("--cores", type=int, default=1, help="cores per worker")
    cluster.add_argument("--memory", default="2g", help="memory per worker")
    cluster.add_argument("--port", type=int, default=7077, help="the master's port")
    cluster.add_argument("--work-dir", default="lakehouse/_cluster", help="logs and scratch")
    cluster.set_defaults(func=_cluster)

    register_rules(commands)
    register_simulate(commands)
    register_alerting(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the chosen command; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.config:
        # Child processes (the dashboard's streamlit, the demo's parts) read it too.
        os.environ["LOOKOUT_CONFIG"] = os.path.abspath(args.config)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    # py4j logs every call between Python and the JVM at INFO (thousands a minute).
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except ConfigError as err:
        # Like a rule error: each problem with its file:line (or variable), no traceback.
        print(f"lookout {args.command}: the configuration cannot be used:\n{err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
