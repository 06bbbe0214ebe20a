"""``lookout simulate traffic|rfid|replay``: the simulators' command line (DESIGN section 5)."""

from __future__ import annotations

import argparse
import contextlib
import random
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

from lookout.config import ConfigError, load_config
from lookout.mqtt_auth import PUBLISHER, Login, load_credentials
from simulators.common import parse_episodes, parse_start
from simulators.disorder import DisorderModel, Faults, arrange
from simulators.publish import FileSink, MqttSink, Progress, emit, first_ts, replay_messages
from simulators.rfid import RfidConfig, generate_rfid, rfid_sources
from simulators.rows import Block
from simulators.traffic import TrafficConfig, generate_traffic, traffic_sources
from simulators.truth import Truth

#: Event-time start of a run written to a file when ``--start`` is not given: a file
#: must not depend on the wall clock (same seed and arguments => same bytes).
FILE_START = "2026-01-01T00:00:00+00:00"


@contextlib.contextmanager
def _signals_stop_cleanly() -> Iterator[threading.Event]:
    """While sending, SIGTERM (how ``lookout demo`` stops its parts) and Ctrl-C set the
    event yielded: the publisher finishes the message in hand, flushes and collects its
    PUBACKs before exiting. A flag, not an exception raised wherever the signal lands:
    one raised inside a publish left a message counted but never sent, and closing then
    waited for its PUBACK."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {
        sig: signal.signal(sig, lambda signum, frame: stop.set())
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``simulate`` command (sub-commands ``traffic``, ``rfid``, ``replay``)."""
    sim = subparsers.add_parser("simulate", help="publish simulated readings to MQTT or a file")
    subs = sim.add_subparsers(dest="simulate_command", required=True)

    traffic = subs.add_parser("traffic", help="highway loop detectors (PIPES section 2.1)")
    _common(traffic, rate=200.0)
    traffic.add_argument(
        "--stations", type=int, default=10, help="measuring stations (5 lanes each)"
    )
    traffic.add_argument(
        "--profile",
        choices=("daily", "flat"),
        default="daily",
        help="daily: rush-hour speed dips at 08:00 and 17:30 UTC",
    )
    ep = "STATION[@START[+DURATION]],... (seconds from the start)"
    traffic.add_argument(
        "--congestion",
        metavar="LIST",
        help=f"congestion episodes: {ep}; duration default 0 = until the end",
    )
    traffic.add_argument(
        "--silent",
        metavar="LIST",
        help="silent detectors: STATION[:LANE][@START[+DURATION]],...; "
        "no lane = the whole station; duration default 300",
    )
    traffic.add_argument(
        "--accident",
        metavar="LIST",
        help=f"stopped vehicles with position reports: {ep}; duration default 600",
    )
    traffic.add_argument(
        "--speeding",
        metavar="LIST",
        help=f"speeding vehicles (10%% of the station's): {ep}; duration default 300",
    )
    traffic.add_argument(
        "--tracked",
        type=int,
        default=20,
        help="with --accident: other vehicles sending position reports (default 20)",
    )
    traffic.set_defaults(func=run_traffic)

    rfid = subs.add_parser("rfid", help="warehouse doors (ESL examples 17 and 18)")
    _common(rfid, rate=50.0)
    rfid.add_argument(
        "--doors", type=int, default=4, help="doors 1..N along the path; N is the exit"
    )
    rfid.add_argument(
        "--gap",
        type=float,
        default=2.0,
        help="packing-group gap threshold t1 in seconds (ESL example 17)",
    )
    rfid.add_argument(
        "--window", type=float, default=5.0, help="theft window t2 in seconds (ESL example 18)"
    )
    rfid.add_argument("--packing", type=int, default=1, help="packing episodes per period")
    rfid.add_argument("--theft", type=int, default=1, help="thefts per period")
    rfid.add_argument(
        "--authorised-exit",
        type=int,
        default=1,
        help="items leaving with an authorised person, per period",
    )
    rfid.add_argument("--missing", type=int, default=1, help="items going missing per period")
    rfid.add_argument(
        "--period",
        type=float,
        default=600.0,
        help="seconds between repeats of the episode schedule when --duration 0",
    )
    rfid.set_defaults(func=run_rfid)

    replay = subs.add_parser("replay", help="republish a recorded JSON-lines file")
    replay.add_argument("file", metavar="FILE")
    _mqtt(replay)
    replay.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="1 = original speed, 10 = ten times faster, 0 = as fast as possible",
    )
    replay.add_argument(
        "--topic",
        default="lookout/traffic/unknown/readings",
        help="topic for unparseable lines before the first reading",
    )
    replay.add_argument(
        "--heartbeat-lag",
        type=float,
        metavar="SECONDS",
        help="send heartbeats each second of event time promising (newest ts - LAG); "
        "LAG must cover the file's disorder and clock skew (default: no heartbeats)",
    )
    replay.add_argument("--quiet", action="store_true", help="no progress on stderr")
    replay.set_defaults(func=run_replay)


def _mqtt(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=1883)
    p.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    p.add_argument("--batch", type=int, default=1, help="readings per MQTT message (at most)")
    p.add_argument("--client-id", help="MQTT client id (default: unique per run)")
    p.add_argument(
        "--credentials",
        metavar="FILE",
        help="the installation's MQTT credentials, whose publisher login is used "
        "(default: [mqtt] credentials_file; none there: connect anonymously)",
    )
    p.add_argument(
        "--max-inflight",
        type=int,
        default=1000,
        help="unacknowledged messages allowed before waiting for PUBACKs "
        "(paho slows down with thousands in flight)",
    )


def _common(p: argparse.ArgumentParser, rate: float) -> None:
    _mqtt(p)
    p.add_argument("--rate", type=float, default=rate, help="readings per second of event time")
    p.add_argument(
        "--duration",
        type=float,
        default=0.0,
        help="seconds of event time; 0 = until Ctrl-C (not with --out)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", metavar="FILE", help="write JSON lines here instead of publishing")
    p.add_argument("--truth", metavar="FILE", help="write the ground truth here (JSON lines)")
    p.add_argument(
        "--start",
        help=f"event-time start, ISO-8601 or epoch ms (default: now; {FILE_START} with --out)",
    )
    p.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="event time runs this many times faster than wall time; 0 = no pacing",
    )
    p.add_argument("--disorder", default="none", help="none | bounded:D | blocks:SIZE (seconds)")
    p.add_argument(
        "--slack", type=float, default=2.0, help="seconds of slack that late readings exceed"
    )
    p.add_argument("--late-fraction", type=float, default=0.0)
    p.add_argument("--duplicate-fraction", type=float, default=0.0)
    p.add_argument("--malformed-fraction", type=float, default=0.0)
    p.add_argument(
        "--skew",
        type=float,
        default=0.0,
        help="max clock skew per source in seconds (uniform in +-SKEW)",
    )
    p.add_argument("--heartbeats", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--heartbeat-interval", type=float, default=1.0, help="seconds of event time")
    p.add_argument(
        "--ts-format",
        choices=("ms", "iso"),
        default="ms",
        help="payload ts: epoch milliseconds or ISO-8601 with offset",
    )
    p.add_argument(
        "--epoch",
        help="the run's id, set on every reading (default: the start time in ms and a "
        "random suffix, new for each run; give one to write the same bytes again)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run_epoch() -> str:
    """An id new for each run: its start in epoch ms and a random suffix (two runs
    started in the same millisecond still differ)."""
    return f"{int(time.time() * 1000)}-{secrets.token_hex(4)}"


def publisher_login(args: argparse.Namespace) -> Login | None:
    """The publisher login of the credentials file (`--credentials`, else the
    configuration's), or None when there is no such file. Raises ConfigError."""
    path = args.credentials or load_config().mqtt.credentials_file
    credentials = load_credentials(path)
    return credentials.login(PUBLISHER) if credentials else None


def _mqtt_sink(args: argparse.Namespace) -> MqttSink:
    """The sink the MQTT options describe, logged in as a publisher."""
    return MqttSink(
        args.host,
        args.port,
        args.qos,
        args.batch,
        args.client_id,
        args.max_inflight,
        publisher_login(args),
    )


def _settings(args: argparse.Namespace) -> dict:
    """The arguments that shape the output, for the truth file's ``run`` record."""
    skip = {"func", "host", "port", "client_id", "max_inflight", "credentials", "quiet"}
    skip |= {"out", "truth", "epoch"}
    return {k: v for k, v in sorted(vars(args).items()) if k not in skip}


def _simulate(
    args: argparse.Namespace,
    kind: str,
    sources: dict[str, str],
    make: Callable[[int, int | None, random.Random, Truth], Iterator[Block]],
) -> int:
    """Shared driver: validate, build the stream, send it, report. Returns an exit code."""
    if args.out and args.duration <= 0:
        print("simulate: --out needs a --duration > 0", file=sys.stderr)
        return 2
    fractions = (args.late_fraction, args.duplicate_fraction, args.malformed_fraction)
    checks = (
        (args.rate <= 0, "--rate must be > 0"),
        (args.heartbeat_interval <= 0, "--heartbeat-interval must be > 0"),
        (min(fractions) < 0 or sum(fractions) > 1, "fault fractions must be >= 0, sum <= 1"),
    )
    problem = next((msg for bad, msg in checks if bad), None)
    if problem:
        print(f"simulate: {problem}", file=sys.stderr)
        return 2
    try:
        model = DisorderModel.parse(args.disorder)
        start = parse_start(
            args.start, parse_start(FILE_START, 0) if args.out else int(time.time() * 1000)
        )
    except ValueError as e:
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    end = start + round(args.duration * 1000) if args.duration > 0 else None
    faults = Faults(
        args.late_fraction,
        args.duplicate_fraction,
        args.malformed_fraction,
        round(args.slack * 1000),
        round(args.skew * 1000),
    )
    try:
        truth = Truth(args.truth)
    except OSError as e:
        print(f"simulate: cannot write the truth file: {e}", file=sys.stderr)
        return 1
    epoch = args.epoch if args.epoch is not None else run_epoch()
    truth.record(
        {
            "type": "run",
            "kind": kind,
            "start": start,
            "end": end,
            "epoch": epoch,
            "settings": _settings(args),
        }
    )
    try:
        readings = make(start, end, random.Random(f"{args.seed}:gen"), truth)
        messages = arrange(
            readings,
            model,
            faults,
            sources,
            random.Random(f"{args.seed}:disorder"),
            truth,
            args.ts_format,
            round(args.heartbeat_interval * 1000) if args.heartbeats else None,
            start,
            end,
            epoch,
        )
        try:
            sink = FileSink(args.out) if args.out else _mqtt_sink(args)
        except OSError as e:
            where = args.out or f"{args.host}:{args.port}"
            print(f"simulate: cannot open {where}: {e}", file=sys.stderr)
            return 1
        progress = Progress(f"simulate {kind}", truth, args.quiet)
        with _signals_stop_cleanly() as stop:
            emit(messages, sink, 0 if args.out else args.speedup, start, progress, stop)
    except ValueError as e:
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    finally:
        truth.close()
    return 0


def run_traffic(args: argparse.Namespace) -> int:
    """``lookout simulate traffic``."""
    try:
        cfg = TrafficConfig(
            stations=args.stations,
            rate=args.rate,
            profile=args.profile,
            congestion=parse_episodes(args.congestion, 0),
            silent=parse_episodes(args.silent, 300),
            accident=parse_episodes(args.accident, 600),
            speeding=parse_episodes(args.speeding, 300),
            tracked=args.tracked,
        )
    except ValueError as e:
        print(f"simulate traffic: {e}", file=sys.stderr)
        return 2
    return _simulate(
        args,
        "traffic",
        traffic_sources(cfg),
        lambda s, e, rng, truth: generate_traffic(cfg, s, e, rng, truth),
    )


def run_rfid(args: argparse.Namespace) -> int:
    """``lookout simulate rfid``."""
    cfg = RfidConfig(
        doors=args.doors,
        rate=args.rate,
        gap_s=args.gap,
        window_s=args.window,
        packing=args.packing,
        theft=args.theft,
        authorised_exit=args.authorised_exit,
        missing=args.missing,
        period_s=args.period,
    )
    return _simulate(
        args,
        "rfid",
        rfid_sources(cfg),
        lambda s, e, rng, truth: generate_rfid(cfg, s, e, rng, truth),
    )


def run_replay(args: argparse.Namespace) -> int:
    """``lookout simulate replay FILE``: republish a recorded file, paced by its ``ts``."""
    try:
        start = first_ts(args.file)
        fh = open(args.file, "rb")  # noqa: SIM115
    except OSError as e:
        print(f"simulate replay: {e}", file=sys.stderr)
        return 2
    lag = round(args.heartbeat_lag * 1000) if args.heartbeat_lag is not None else None
    with fh:
        try:
            sink = _mqtt_sink(args)
        except OSError as e:
            print(f"simulate replay: cannot reach {args.host}:{args.port}: {e}", file=sys.stderr)
            return 1
        with _signals_stop_cleanly() as stop:
            emit(
                replay_messages(fh, args.topic, lag),
                sink,
                args.speedup,
                start,
                Progress("simulate replay", None, args.quiet),
                stop,
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``simulate`` on its own (``python -m simulators.cli traffic ...``)."""
    parser = argparse.ArgumentParser(prog="lookout")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["simulate", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"simulate: the configuration cannot be used:\n{err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
