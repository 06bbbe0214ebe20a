"""`lookout replay`: the rules over recorded JSON-lines readings.

The readings go through the same validation as live ingest and the same engine core as
the live job (`engine.core.replay.run`), so the rows written here are the rows the live
pipeline writes for the same readings in the same arrival order.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from engine.alerts import alert_id, alert_keys, format_key, incident_record, iso_utc
from engine.core.evaluator import Output
from engine.core.plan import END_OF_TIME, ColumnType, Plan, SinkKind, StreamSchema
from engine.core.replay import ReplayResult, run
from ingest.validate import normalize_reading, parse_timestamp
from lookout.config import ConfigError, load_config
from lookout.services import alert_specs
from rules.language.loader import RuleCheckError, RuleSet, load_rules


class ReplayInputError(Exception):
    """A recorded reading that cannot be used, located as file:line."""


Input = tuple[tuple[StreamSchema, ...], Path]
"""A recorded file and the source streams its lines may belong to (one: all of them)."""


def _parse_inputs(specs: Sequence[str], plan: Plan) -> list[Input]:
    """`STREAM=FILE` (every line is a reading of STREAM) or `FILE` (each line goes to the
    one source stream whose declared columns it carries: a simulator's file mixing loop
    detector readings and position reports)."""
    sources = {s.name: s for s in plan.sources()}
    inputs = []
    for spec in specs:
        stream, sep, file = spec.partition("=")
        if not sep:
            inputs.append((tuple(sources.values()), Path(spec)))
            continue
        if stream not in sources:
            known = ", ".join(sorted(sources))
            raise ReplayInputError(
                f"--input {spec!r}: no source stream {stream!r} (known: {known})"
            )
        inputs.append(((sources[stream],), Path(file)))
    return inputs


def _stream_of(schemas: tuple[StreamSchema, ...], data: Any) -> StreamSchema:
    if len(schemas) == 1:
        return schemas[0]
    fits = [s for s in schemas if isinstance(data, dict) and all(c.name in data for c in s.columns)]
    if len(fits) != 1:
        which = (
            "no source stream"
            if not fits
            else "several streams: " + ", ".join(s.name for s in fits)
        )
        raise ValueError(f"the line carries the columns of {which} (give STREAM=FILE)")
    return fits[0]


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
                    schema = _stream_of(schemas, data)
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


def _render(row: dict[str, Any], schema: StreamSchema | None) -> dict[str, Any]:
    """Timestamps as ISO-8601 UTC text, everything else as is."""
    if schema is None:
        return row
    stamps = {c.name for c in schema.columns if c.type == ColumnType.TIMESTAMP}
    return {k: iso_utc(v) if k in stamps and isinstance(v, int) else v for k, v in row.items()}


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


def incident_lines(rule_set: RuleSet, result: ReplayResult) -> list[dict[str, Any]]:
    """Every incident in its final state, as `DIR/incidents.jsonl` holds it (times as
    ISO-8601 UTC text; a firing incident's `resolved_at` null)."""
    specs, keys = alert_specs(rule_set), alert_keys(rule_set.plan)
    records = []
    for update in result.incidents:
        record = incident_record(specs[update.alert], keys[update.alert], update)
        for name in ("opened_at", "last_report_at", "resolved_at"):
            if record[name] is not None:
                record[name] = iso_utc(record[name])
        records.append(record)
    return records


def parse_end_at(text: str) -> int | None:
    """`--end-at`: `infinity` (END_OF_TIME), `watermark` (None: no final heartbeat), or
    the final heartbeat's time as ISO-8601 with offset or epoch ms; ValueError if none."""
    if text == "infinity":
        return END_OF_TIME
    if text == "watermark":
        return None
    return parse_timestamp(int(text) if text.lstrip("-").isdigit() else text)


def _describe_end(end_at: int | None) -> str:
    if end_at is None:
        return "the input's watermark"
    return "+infinity" if end_at == END_OF_TIME else iso_utc(end_at)


def run_replay(
    rule_paths: Sequence[str],
    input_specs: Sequence[str],
    out: str,
    end_at: int | None = END_OF_TIME,
) -> int:
    """Evaluate the rules over the inputs, ending with a heartbeat at `end_at` (None:
    at the input's watermark, see `engine.core.replay.run`), and write
    DIR/<sink>.jsonl files."""
    try:
        rule_set = load_rules(rule_paths)
    except RuleCheckError as err:
        for error in err.errors:
            print(error.format(), file=sys.stderr)
        return 2
    plan = rule_set.plan
    try:
        inputs = _parse_inputs(input_specs, plan)
        # The live engine's caps on live keys ([engine] of lookout.toml), so that replay
        # quarantines what it quarantines.
        caps = load_config().engine.live_key_caps([s.name for s in plan.sources()])
        result = run(plan, read_readings(inputs), end_at=end_at, caps=caps)
    except (ReplayInputError, OSError, ConfigError) as err:
        print(f"lookout replay: {err}", file=sys.stderr)
        return 2
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    lines: dict[str, list[bytes]] = defaultdict(list)
    for output in result.outputs:
        lines[output.sink].append(orjson.dumps(_render(output.row, plan.streams.get(output.sink))))
    for late in result.late:
        schema = plan.streams[late.stream]
        lines["late_readings"].append(
            orjson.dumps({**_render(late.row, schema), "stream": late.stream})
        )
    for capped in result.capped:
        schema = plan.streams[capped.stream]
        lines["quarantine"].append(
            orjson.dumps(
                {**_render(capped.row, schema), "stream": capped.stream, "reason": capped.reason}
            )
        )
    for query in plan.queries:
        lines.setdefault(query.sink.name, [])
    lines["incidents"] = [orjson.dumps(record) for record in incident_lines(rule_set, result)]
    for name, rows in lines.items():
        (folder / f"{name}.jsonl").write_bytes(b"".join(row + b"\n" for row in rows))
    print(
        f"replay: {len(result.outputs)} output rows, {len(result.incidents)} incidents, "
        f"{len(result.late)} late readings, "
        + (f"{len(result.capped)} quarantined by a cap on live keys, " if result.capped else "")
        + f"{sum(result.duplicates.values())} duplicates removed -> {folder}",
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
    return 0
