"""`lookout replay`: the rules over recorded readings (JSON lines, Delta tables, Parquet).

The readings go through the same validation as live ingest (`lookout.replay_inputs`)
and the same engine core as the live job (`engine.core.replay`), so the rows written
here are the rows the live pipeline writes for the same readings in the same arrival
order. Outputs are written by `lookout.replay_outputs`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from engine.alerts import alert_id, alert_keys, format_key, incident_record, iso_utc
from engine.core.evaluator import Output
from engine.core.partitions import CapReachable, partitioning
from engine.core.plan import END_OF_TIME, Plan, SinkKind, StreamSchema
from engine.core.replay import Finished, ReplayResult, run_arrivals, run_split
from engine.python_gc import collector_paused, freeze_batch_survivors, freeze_worker_heap
from ingest.validate import normalize_reading, parse_timestamp
from lookout.config import ConfigError, load_config
from lookout.replay_inputs import (
    EVERYTHING,
    Progress,
    Readings,
    ReplayInputError,
    TimeRange,
    batch_readings,
    parse_inputs,
    stream_of,
)
from lookout.replay_outputs import OutputFiles, ReplayOutputError
from lookout.replay_workers import WorkerFailed, WorkerProcess
from lookout.services import alert_specs
from rules.language.loader import RuleCheckError, RuleSet, load_rules

__all__ = [
    "ReplayInputError",
    "TimeRange",
    "evaluate",
    "evaluate_split",
    "read_readings",
    "run_replay",
    "start_workers",
]

Input = tuple[tuple[StreamSchema, ...], Path]
"""A recorded file and the source streams its lines may belong to (one: all of them)."""


def read_readings(
    inputs: Sequence[Input], progress_every_s: float = 2.0
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (stream, reading) in file order, validated; progress on stderr for long inputs."""
    last = time.monotonic()
    for schemas, path in inputs:
        total = path.stat().st_size
        with open(path, "rb") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    data = orjson.loads(line)
                    schema = stream_of(schemas, data)
                    reading = normalize_reading(schema, data, require_identity=False)
                except (ValueError, orjson.JSONDecodeError) as err:
                    raise ReplayInputError(f"{path}:{number}: {err}") from None
                yield schema.name, reading
                if time.monotonic() - last > progress_every_s:
                    last = time.monotonic()
                    print(
                        f"replay: {path.name} {100 * handle.tell() / max(total, 1):.0f}% "
                        f"({number} lines)",
                        file=sys.stderr,
                        flush=True,
                    )


def output_key(stage_keys: dict[str, tuple[str, ...]], out: Output) -> str:
    """The key of an output as the live job writes it (e.g. `station=3`), from its tie
    order; `stage_keys` maps each stage's name to its key columns."""
    stage, *values = orjson.loads(out.source)  # derived_source: [stage, *key]
    return format_key(stage_keys[stage], tuple(values))


def alert_ids(plan: Plan, outputs: Iterable[Output]) -> list[str]:
    """The ids the live job gives the alerts among `outputs` (one per alert output)."""
    alerts = {q.sink.name for q in plan.queries if q.sink.kind == SinkKind.ALERT}
    keys = {stage.name: stage.key for stage in plan.stages()}
    return [
        alert_id(out.sink, output_key(keys, out), out.ts, out.row, out.source, out.seq)
        for out in outputs
        if out.sink in alerts
    ]


def incident_records(rule_set: RuleSet, result: ReplayResult) -> list[dict[str, Any]]:
    """Every incident in its final state (times in epoch ms; a firing incident's
    `resolved_at` None)."""
    specs, keys = alert_specs(rule_set), alert_keys(rule_set.plan)
    return [
        incident_record(specs[update.alert], keys[update.alert], update)
        for update in result.incidents
    ]


def parse_end_at(text: str) -> int | None:
    """`--end-at`: `infinity` (END_OF_TIME), `watermark` (None: no final heartbeat), or
    the final heartbeat's time as ISO-8601 with offset or epoch ms; ValueError if none."""
    if text == "infinity":
        return END_OF_TIME
    if text == "watermark":
        return None
    return parse_time(text)


def _describe_end(end_at: int | None) -> str:
    if end_at is None:
        return "the input's watermark"
    return "+infinity" if end_at == END_OF_TIME else iso_utc(end_at)


def parse_time(text: str) -> int:
    """A time on the command line: ISO-8601 with offset, or epoch ms; ValueError if not."""
    return parse_timestamp(int(text) if text.lstrip("-").isdigit() else text)


def evaluate(
    plan: Plan,
    readings: Readings,
    end_at: int | None = END_OF_TIME,
    meter: Progress | None = None,
    caps: Mapping[str, int] | None = None,
    finished: Finished | None = None,
) -> ReplayResult:
    """``run_arrivals`` over the readings with the collector as the engine's workers
    run it (`engine.python_gc`): paused during a batch, what each batch leaves frozen;
    ``meter`` is told each batch's readings, ``finished`` the output rows as they become
    final."""

    def after_batch(count: int) -> None:
        freeze_batch_survivors()
        if meter is not None:
            meter.fed(count)

    freeze_worker_heap()
    with collector_paused():
        return run_arrivals(plan, readings.batches(), end_at, after_batch, caps, finished)


def evaluate_split(
    plan: Plan,
    readings: Readings,
    processes: Sequence[WorkerProcess],
    end_at: int | None = END_OF_TIME,
    meter: Progress | None = None,
    caps: Mapping[str, int] | None = None,
    finished: Finished | None = None,
) -> ReplayResult:
    """:func:`evaluate` with the evaluation split by key among worker ``processes`` made
    by :func:`start_workers` (`engine.core.partitions`), this process judging the
    arrivals; the same result. Raises :class:`~engine.core.partitions.CapReachable` when
    a cap on live keys could matter."""

    def after_batch(count: int) -> None:
        freeze_batch_survivors()
        if meter is not None:
            meter.fed(count)

    split = partitioning(plan, len(processes))
    freeze_worker_heap()
    with collector_paused():
        return run_split(
            plan, readings.batches(), split, processes, end_at, after_batch, caps, finished
        )


def start_workers(plan: Plan, workers: int, render: bool = False) -> list[WorkerProcess]:
    """The processes of a split evaluation of ``plan`` among ``workers`` (close them);
    ``render``: they send their rows back as JSON lines, rendered there."""
    split = partitioning(plan, workers)
    return [WorkerProcess(plan, split.groups_of(i), render) for i in range(workers)]


def default_workers() -> int:
    """A replay's ``--workers`` by default: one per core (on one core: one process)."""
    return os.cpu_count() or 1


def run_replay(
    rule_paths: Sequence[str],
    input_specs: Sequence[str],
    out: str,
    end_at: int | None = END_OF_TIME,
    window: TimeRange = EVERYTHING,
    output_format: str = "jsonl",
    progress: bool = True,
    workers: int = 1,
) -> int:
    """Evaluate the rules over the inputs (JSON lines, Delta tables, Parquet; readings
    with event time in ``window`` only), ending with a heartbeat at `end_at` (None: at
    the input's watermark, see `engine.core.replay.run`), and write a file or table per
    output to DIR (``output_format``: `jsonl`, `delta`, `parquet`). With ``workers`` > 1
    the evaluation is split by key among that many processes (:func:`evaluate_split`)."""
    try:
        rule_set = load_rules(rule_paths)
    except RuleCheckError as err:
        for error in err.errors:
            print(error.format(), file=sys.stderr)
        return 2
    plan = rule_set.plan
    meter = Progress(out=sys.stderr) if progress else None
    # Forked before any input is read, so that they start at once and hold none of it.
    render = output_format == "jsonl"
    processes = start_workers(plan, workers, render) if workers > 1 else []
    folder = Path(out)
    files = OutputFiles(folder, output_format, plan)
    try:
        # The live engine's caps on live keys ([engine] of lookout.toml), so that replay
        # quarantines what it quarantines.
        caps = load_config().engine.live_key_caps([s.name for s in plan.sources()])
        readings = Readings(
            parse_inputs(input_specs, plan), window, meter, batch=batch_readings(caps)
        )
        for note in readings.notes:
            print(f"replay: {note}", file=sys.stderr)
        result = _evaluated(plan, readings, processes, end_at, meter, caps, files)
        files.close(result.late, result.capped, incident_records(rule_set, result))
    except (ReplayInputError, ReplayOutputError, OSError, ConfigError, WorkerFailed) as err:
        files.discard()
        print(f"lookout replay: {err}", file=sys.stderr)
        return 2
    finally:
        for process in processes:
            process.close()
    rows = files.rows
    conflicts = (
        f", {len(result.conflicts)} conflicting readings set aside" if result.conflicts else ""
    )
    print(
        f"replay: {rows} output rows, {len(result.incidents)} incidents, "
        f"{len(result.late)} late readings, "
        + (f"{len(result.capped)} quarantined by a cap on live keys, " if result.capped else "")
        + f"{sum(result.duplicates.values())} duplicates removed{conflicts} -> {folder}",
        file=sys.stderr,
    )
    # How much of the output is only there because the input ended (pending expirations
    # and windows closed by the final heartbeat), per output.
    closed = ", ".join(f"{sink} {rows}" for sink, rows in sorted(result.closed.items()))
    print(
        f"replay: ended at {_describe_end(end_at)}; the final close produced "
        + (f"{sum(result.closed.values())} output rows: {closed}" if closed else "no output rows"),
        file=sys.stderr,
    )
    if meter is not None:
        elapsed = time.monotonic() - meter.started
        print(
            f"replay: {meter.readings:,} readings in {elapsed:.1f} s "
            f"({meter.readings / max(elapsed, 1e-9):,.0f}/s)",
            file=sys.stderr,
        )
    return 0


def _evaluated(
    plan: Plan,
    readings: Readings,
    processes: Sequence[WorkerProcess],
    end_at: int | None,
    meter: Progress | None,
    caps: Mapping[str, int],
    files: OutputFiles,
) -> ReplayResult:
    """The evaluation split among ``processes``, or in this process when there are none
    or a cap on live keys could quarantine readings (the split cannot decide those);
    output rows written to ``files`` as they become final."""
    if processes:
        try:
            return evaluate_split(plan, readings, processes, end_at, meter, caps, files.write)
        except CapReachable as err:
            print(f"replay: {err}; evaluating again in one process", file=sys.stderr)
            files.discard()
            if meter is not None:
                meter.restart()
    return evaluate(plan, readings, end_at, meter, caps, files.write)
