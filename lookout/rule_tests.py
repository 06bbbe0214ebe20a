"""`lookout rules test [PATH...]`: rule files' own tests, run as `lookout replay` runs.

A rule file `NAME.sql` is tested by `NAME.test.yaml` beside it: cases, each with
readings per source stream and the alerts (and, if given, incidents) they must give.
Every case runs through `engine.core.replay.run`, the engine core replay and the live
job run, over the whole rule set of the paths; its readings pass the ingest's
validation first. The format is in docs/rules.md, *Testing rules*.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from engine.alerts import alert_keys, incident_record, iso_utc, render_message
from engine.core.plan import SinkKind
from engine.core.replay import run
from ingest.validate import normalize_reading, parse_timestamp
from lookout.replay import output_key, parse_end_at
from lookout.services import alert_specs
from rules.language.access import RulePolicy
from rules.language.loader import RuleCheckError, RuleSet, load_rules, rule_files

SUFFIX = ".test.yaml"
"""`NAME.sql` is tested by `NAME.test.yaml` in its folder."""

Item = tuple[str | None, ...]
"""An alert (key, at, message) or incident (key, opened_at, resolved_at) as text; in
an expectation, None matches anything (a message left out)."""
ALERT_FIELDS = ("key", "at", "message")
INCIDENT_FIELDS = ("key", "opened_at", "resolved_at")


class RuleTestError(Exception):
    """A test file or case that cannot be run, said as `file: case: what`."""


@dataclass(frozen=True)
class Case:
    """One test case: readings in arrival order, where history ends, expectations."""

    name: str
    readings: list[tuple[str, dict[str, Any]]]
    end_at: int | None
    alerts: dict[str, list[Item]]
    incidents: dict[str, list[Item]]


class _Loader(yaml.SafeLoader):
    """Safe YAML that leaves times as text: they are read as ingest reads readings'."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def companion_tests(rules: Iterable[Path]) -> list[Path]:
    """The test files of `rules` (rule files): each one's companion that exists."""
    found = (path.with_suffix(SUFFIX) for path in rules)
    return [path for path in found if path.is_file()]


def _mapping(
    value: Any, what: str, allowed: set[str], required: set[str], kind: str = "field"
) -> dict[str, Any]:
    """`value`, a mapping whose keys (`kind`s) are among `allowed` and hold `required`."""
    if not isinstance(value, dict):
        raise RuleTestError(f"{what} must be a mapping")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise RuleTestError(
            f"{what}: unknown {kind} '{unknown[0]}' ({kind}s: {', '.join(sorted(allowed))})"
        )
    missing = sorted(required - set(value))
    if missing:
        raise RuleTestError(f"{what}: missing field '{missing[0]}'")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise RuleTestError(f"{what} must be a list")
    return value


def _time(value: Any, what: str) -> str:
    try:
        return iso_utc(parse_timestamp(value))
    except ValueError as err:
        raise RuleTestError(f"{what}: {err}") from None


def _expected(
    value: Any, what: str, names: set[str], fields: tuple[str, ...], required: set[str]
) -> dict[str, list[Item]]:
    """Expectations per rule name: items with their times as `iso_utc` text."""
    expected: dict[str, list[Item]] = {}
    for rule, items in _mapping(value or {}, what, names, set(), "alert").items():
        expected[rule] = []
        for i, item in enumerate(_list(items, f"{what}: {rule}"), start=1):
            where = f"{what}: {rule} #{i}"
            fields_of = _mapping(item, where, set(fields), required)
            expected[rule].append(tuple(_field(fields_of, name, where) for name in fields))
    return expected


def _field(item: dict[str, Any], name: str, where: str) -> str | None:
    """One expected field as compared: times as `iso_utc` text, a firing incident's end
    as `firing`, a key left out as the empty key (an unkeyed rule), the rest as text;
    any other field left out is None (matches anything)."""
    if name not in item:
        return "" if name == "key" else None
    value = item[name]
    if name == "resolved_at" and value is None:
        return "firing"
    if name in ("at", "opened_at", "resolved_at"):
        return _time(value, f"{where}: {name}")
    return str(value)


def _case(number: int, raw: Any, rule_set: RuleSet) -> Case:
    """Case `number` of a test file, checked against the rule set's streams and alerts."""
    plan = rule_set.plan
    fields = {"name", "input", "end_at", "alerts", "incidents"}
    case = _mapping(raw, f"case {number}", fields, {"name", "input", "alerts"})
    what = f"case {number} ({case['name']})"
    sources = {s.name: s for s in plan.sources()}
    readings = []
    inputs = _mapping(case["input"], f"{what}: input", set(sources), set(), "source stream")
    for stream, rows in inputs.items():
        for i, row in enumerate(_list(rows, f"{what}: input: {stream}"), start=1):
            try:
                readings.append(
                    (stream, normalize_reading(sources[stream], row, require_identity=False))
                )
            except ValueError as err:
                raise RuleTestError(f"{what}: input: {stream} #{i}: {err}") from None
    try:
        end_at = parse_end_at(str(case.get("end_at", "infinity")))
    except ValueError as err:
        raise RuleTestError(f"{what}: end_at: {err}") from None
    alerts = {q.sink.name for q in plan.queries if q.sink.kind == SinkKind.ALERT}
    return Case(
        str(case["name"]),
        readings,
        end_at,
        _expected(case["alerts"], f"{what}: alerts", alerts, ALERT_FIELDS, {"at"}),
        _expected(
            case.get("incidents"),
            f"{what}: incidents",
            alerts,
            INCIDENT_FIELDS,
            set(INCIDENT_FIELDS) - {"key"},
        ),
    )


def load_cases(path: Path, rule_set: RuleSet) -> list[Case]:
    """The cases of test file `path`; RuleTestError if it cannot be used."""
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise RuleTestError(f"cannot read the file: {err}") from None
    cases = _mapping(document, "the file", {"cases"}, {"cases"})["cases"]
    return [_case(i, raw, rule_set) for i, raw in enumerate(_list(cases, "cases"), start=1)]


def outcome(rule_set: RuleSet, case: Case) -> tuple[dict[str, list[Item]], dict[str, list[Item]]]:
    """The alerts and incidents the case's readings give, per rule, as expectations
    are written (every field present)."""
    plan = rule_set.plan
    result = run(plan, case.readings, end_at=case.end_at)
    specs = alert_specs(rule_set)
    keys = {stage.name: stage.key for stage in plan.stages()}
    alerts: dict[str, list[Item]] = {}
    for out in result.outputs:
        if out.sink in specs:
            item = (
                output_key(keys, out),
                iso_utc(out.ts),
                render_message(specs[out.sink], out.row),
            )
            alerts.setdefault(out.sink, []).append(item)
    incidents: dict[str, list[Item]] = {}
    key_names = alert_keys(plan)
    for update in result.incidents:
        record = incident_record(specs[update.alert], key_names[update.alert], update)
        resolved = record["resolved_at"]
        item = (
            record["key"],
            iso_utc(record["opened_at"]),
            "firing" if resolved is None else iso_utc(resolved),
        )
        incidents.setdefault(update.alert, []).append(item)
    return alerts, incidents


def diff(expected: list[Item], actual: list[Item], fields: tuple[str, ...]) -> list[str]:
    """`- item` for each expected item nothing matched, `+ item` for each actual item no
    expectation took, in time order; empty when they agree."""
    left = list(actual)
    missing = []
    # Expectations with every field first, so one with a field left out cannot take
    # the item a complete one needs.
    for want in sorted(expected, key=lambda w: None in w):
        found = next(
            (
                got
                for got in left
                if all(w is None or w == g for w, g in zip(want, got, strict=True))
            ),
            None,
        )
        if found is None:
            missing.append(want)
        else:
            left.remove(found)
    lines = [("-", item) for item in missing] + [("+", item) for item in left]
    return [
        f"{sign} "
        + ", ".join(
            f"{name} {value!r}"
            for name, value in zip(fields, item, strict=True)
            if value is not None
        )
        for sign, item in sorted(lines, key=lambda line: (line[1][1] or "", line[1][0] or ""))
    ]


def check_case(rule_set: RuleSet, case: Case) -> list[str]:
    """What the case's outcome differs in from its expectations, per rule named in
    them (rules it does not name are not compared); empty when it passes."""
    alerts, incidents = outcome(rule_set, case)
    lines = []
    for kind, expected, actual, fields in (
        ("alerts", case.alerts, alerts, ALERT_FIELDS),
        ("incidents", case.incidents, incidents, INCIDENT_FIELDS),
    ):
        for rule, items in expected.items():
            differences = diff(items, actual.get(rule, []), fields)
            if differences:
                lines += [f"{kind} of {rule}:", *(f"  {line}" for line in differences)]
    return lines


def run_rule_tests(paths: Sequence[str | Path], policy: RulePolicy) -> int:
    """Load the rule set at `paths`, run the test files of its rule files, print each
    case's result (a failure with its differences); exit status 1 if any case failed,
    a test file could not be used or the rules have errors."""
    try:
        rule_set = load_rules(paths, policy)
    except RuleCheckError as err:
        for error in err.errors:
            print(error.format(), file=sys.stderr)
        return 1
    files = companion_tests(rule_files(paths))
    if not files:
        print(f"no rule tests: a rule file NAME.sql is tested by NAME{SUFFIX} beside it")
        return 0
    passed = failed = 0
    for path in files:
        print(path)
        try:
            cases = load_cases(path, rule_set)
        except RuleTestError as err:
            print(f"  ERROR {err}")
            failed += 1
            continue
        for case in cases:
            differences = check_case(rule_set, case)
            print(f"  {'FAIL' if differences else 'ok  '} {case.name}")
            for line in differences:
                print(f"       {line}")
            failed += bool(differences)
            passed += not differences
    legend = " (-: expected, not given; +: given, not expected)" if failed else ""
    print(f"{passed} passed, {failed} failed{legend}")
    return 1 if failed else 0
