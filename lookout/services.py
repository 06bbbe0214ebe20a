"""The long-running parts `lookout engine` and `lookout dashboard` (ingest's is
`ingest.service.run`), with clean shutdown on SIGINT/SIGTERM."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from engine.alerts import AlertSpec
from lookout import standby_priority
from lookout.config import Config
from lookout.storage import is_object_store
from rules.language import ast
from rules.language.loader import RuleCheckError, RuleSet, load_rules

log = logging.getLogger("lookout")

DASHBOARD_APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"


def load_rule_set(config: Config, paths: Sequence[str] | None) -> RuleSet:
    """The checked, compiled rules at `paths` (default: the configured rule library and
    user rule store), reaching only what the configuration allows."""
    return load_rules(list(paths) if paths else list(config.rule_paths), config.rule_policy)


def alert_specs(rule_set: RuleSet) -> dict[str, AlertSpec]:
    """Severity and message of every `CREATE ALERT` in the rule set."""
    return {
        s.name.name: AlertSpec(s.name.name, str(s.severity), s.message)
        for s in rule_set.statements
        if isinstance(s, ast.CreateAlert)
    }


def _stop_on_signals(stop: threading.Event) -> None:
    def handler(signum: int, _frame: object) -> None:
        log.info("received %s; stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run_engine(config: Config, rule_paths: Sequence[str] | None, standby: bool = False) -> int:
    """Run the Spark job until a signal arrives. It holds the lakehouse's engine lock
    (`engine.engine_lock`) while it runs; another engine holding it is an error, unless
    `standby`: then Spark starts at once and the job waits for the lock, to take over
    when that engine stops or dies."""
    from engine.engine_lock import EngineLock
    from engine.spark.checkpoint_layout import CheckpointLayoutError
    from engine.spark.job import EngineJob
    from engine.spark.jvm_output import filter_output
    from engine.spark.rehearsal import Rehearsal
    from engine.tables import TableSchemaError
    from lookout.rule_watch import watch_rules

    filter_output()
    try:
        rules = watch_rules(config, rule_paths, alert_specs)
    except RuleCheckError as err:
        for error in err.errors:
            print(error.format(), file=sys.stderr)
        return 2
    lock = None if is_object_store(config.lakehouse) else EngineLock(config.lakehouse)
    if lock is None and standby:
        print(
            f"lookout engine: --standby needs the engine lock, a file lock, and the "
            f"lakehouse {config.lakehouse} is in an object store",
            file=sys.stderr,
        )
        return 2
    if lock is not None and not standby and not lock.take():
        print(
            f"lookout engine: another engine runs on {config.lakehouse} ({lock.holder()}, "
            f"{lock.path}); stop it first, or start this one with --standby to take over "
            "when it stops",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()
    _stop_on_signals(stop)
    waiting = time.monotonic()
    # A standby beside a running engine starts Spark at a lower priority, not to take
    # the CPU its batches need.
    priority = None
    if standby and lock is not None and not lock.take():
        priority = standby_priority.lower()
    job = EngineJob(config, rules.running.plan, alert_specs(rules.running))
    if standby:
        assert lock is not None
        if priority is None:
            log.info("standby: no engine runs on %s; this one runs", config.lakehouse)
        else:
            log.info("standby: Spark is up; waiting for the engine on %s to stop (%s)",
                     config.lakehouse, lock.holder())  # fmt: skip
            rehearsal = Rehearsal(job.spark, config, job.plan, alert_specs(rules.running))
            rehearsal.start()
            try:
                if not lock.wait(stop):
                    return 0
            finally:
                rehearsal.stop()
            if (problem := priority.restore()) is not None:
                log.warning("standby: %s", problem)
            log.info("standby: taking over after %.0f s", time.monotonic() - waiting)
            rules.poll(job.use, at_once=True)  # the files may have changed while it waited
            job.started_at_ms = int(time.time() * 1000)
    if config.engine.metrics_port:
        from engine.spark.metrics import serve

        try:
            serve(config.engine.metrics_address, config.engine.metrics_port)
        except OSError as err:  # the engine runs on; only its metrics are missing
            log.warning("no metrics: %s:%d: %s", config.engine.metrics_address,
                        config.engine.metrics_port, err)  # fmt: skip
    job.rules_status = rules.status
    try:
        job.run_until(stop, tick=lambda: rules.poll(job.apply))
    except (TableSchemaError, CheckpointLayoutError) as err:
        print(f"lookout engine: {err}", file=sys.stderr)
        return 2
    finally:
        if lock is not None:
            lock.release()
    return 0


RECORD_BATCHES = 2
"""Rehearsal batches a class archive's recording runs: a reading of every stream, then
a heartbeat."""

ARCHIVE_WRITE_S = 300.0
"""How long the recording JVM may take to write the archive as it exits (10-15 s here)."""


def archive_classes(
    config: Config, rule_paths: Sequence[str] | None, timeout_s: float = 600.0
) -> int:
    """Record the engine JVM's class archive (`engine.spark.class_archive`) unless it is
    there already: a standby's rehearsal of the rules' query, in a JVM that writes the
    archive as it exits. Run in a process that has started no Spark (the JVM is its)."""
    from pyspark import SparkContext

    from engine.spark.class_archive import archive_problem, stale_archives
    from engine.spark.jvm_output import filter_output
    from engine.spark.rehearsal import Rehearsal
    from engine.spark.session import build_session, driver_archive
    from lookout.storage import uses_object_store

    s3 = config.s3 if uses_object_store(config) else None
    target = driver_archive(s3)
    if target.is_file():
        print(f"lookout engine: the class archive is recorded: {target}")
        return 0
    filter_output()
    try:
        rules = load_rule_set(config, rule_paths)
    except RuleCheckError as err:
        for error in err.errors:
            print(error.format(), file=sys.stderr)
        return 2
    partial = target.with_name(f"{target.stem}.{os.getpid()}.partial")
    began = time.monotonic()
    spark = build_session(config.engine, "lookout-class-archive", s3, record_classes=partial)
    class_path = spark.sparkContext._jvm.java.lang.System.getProperty("java.class.path")  # type: ignore[union-attr]
    rehearsal = Rehearsal(spark, config, rules.plan, alert_specs(rules), every_s=1.0)
    rehearsal.start()
    rehearsed = False
    try:
        while not rehearsed and rehearsal.running and time.monotonic() - began <= timeout_s:
            time.sleep(0.2)
            rehearsed = rehearsal.batches >= RECORD_BATCHES
    finally:
        rehearsal.stop()
        spark.stop()
        # The JVM writes the archive as it exits, which it does when its input closes.
        jvm = SparkContext._gateway.proc  # type: ignore[union-attr]
        jvm.stdin.close()
        jvm.wait(timeout=ARCHIVE_WRITE_S)
    if not rehearsed:
        partial.unlink(missing_ok=True)  # the classes of a rehearsal that did not run
        ran = f"{rehearsal.batches} of {RECORD_BATCHES} batches"
        print(f"lookout engine: no class archive: the rehearsal ran {ran}", file=sys.stderr)
        return 1
    if not partial.is_file():
        print(f"lookout engine: the JVM exited ({jvm.returncode}) without writing {partial}",
              file=sys.stderr)  # fmt: skip
        return 1
    problem = archive_problem(partial, class_path)
    if problem is not None:
        partial.unlink()
        print(f"lookout engine: no class archive: a JVM could not map it: {problem}",
              file=sys.stderr)  # fmt: skip
        return 1
    # Named after the jars this session resolved, if the check above ran before any had.
    target = driver_archive(s3)
    partial.replace(target)  # whole or not at all: an engine may be starting meanwhile
    for stale in stale_archives(target.parent):
        stale.unlink(missing_ok=True)
        print(f"lookout engine: deleted {stale}, of the Spark jars installed before")
    print(f"lookout engine: recorded the class archive in {time.monotonic() - began:.0f} s: "
          f"{target}")  # fmt: skip
    return 0


def dashboard_command(config: Config) -> list[str]:
    """The streamlit command line serving the dashboard on the configured address."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(DASHBOARD_APP),
        "--server.address",
        config.dashboard.address,
        "--server.port",
        str(config.dashboard.port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        # No deploy button, and never a stack trace on an operator's screen.
        "--client.toolbarMode",
        "viewer",
        "--client.showErrorDetails",
        "none",
    ]


# What the dashboard process takes from the environment: what finds programs and
# libraries, the locale and time zone, TLS trust, and its own settings. Nothing else
# reaches it: never the MQTT password, and the S3 keys only when its lakehouse is in S3.
_DASHBOARD_VARIABLES = {
    *("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM"),
    *("PYTHONPATH", "VIRTUAL_ENV", "SSL_CERT_FILE", "SSL_CERT_DIR", "LOOKOUT_CONFIG"),
}
_DASHBOARD_PREFIXES = ("LC_", "STREAMLIT_", "LOOKOUT_DASHBOARD_", "LOOKOUT_RULES_")
_S3_PREFIXES = ("LOOKOUT_S3_", "AWS_")


def dashboard_environment(config: Config, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment the dashboard runs with: what it needs of `environ` (see
    `_DASHBOARD_VARIABLES`), and where the lakehouse is."""
    s3 = is_object_store(config.lakehouse)
    env = {
        name: value
        for name, value in environ.items()
        if name in _DASHBOARD_VARIABLES
        or name.startswith(_DASHBOARD_PREFIXES)
        or (s3 and name.startswith(_S3_PREFIXES))
    }
    env["LOOKOUT_LAKEHOUSE_PATH"] = config.lakehouse
    env["LOOKOUT_DASHBOARD_REFRESH_SECONDS"] = str(config.dashboard.refresh_seconds)
    return env


def run_dashboard(config: Config) -> int:
    """Serve the dashboard until interrupted (streamlit replaces this process, so signals
    reach it directly), with only the environment it needs. Sign-in may be off only on
    a loopback address."""
    address = config.dashboard.address
    if not config.dashboard.login and not _is_loopback(address):
        print(
            f"lookout dashboard: sign-in is off ([dashboard] login = false) and the "
            f"dashboard would listen on {address}, which other machines can reach; turn "
            "sign-in on or listen on 127.0.0.1",
            file=sys.stderr,
        )
        return 2
    command = dashboard_command(config)
    os.execve(command[0], command, dashboard_environment(config, os.environ))


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False
