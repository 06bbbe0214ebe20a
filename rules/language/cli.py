"""`lookout rules check [PATH...]`, `lookout rules explain NAME`, `lookout rules test
[PATH...]` (and `lookout rules preview FILE`, from `lookout.preview_cli`).

`lookout/cli.py` calls `register(subparsers)` and dispatches with `args.func(args)`,
which returns the process exit code. Without paths, each takes the rule set the engine
loads (the configured library and user rule store); either way the rules reach only
what the configuration allows (`[rules]` in lookout.toml).
"""

from __future__ import annotations

import argparse
import sys

from lookout.config import Config, load_config
from rules.language.explain import explain
from rules.language.loader import analyse, check_paths, rule_files


def _config(args: argparse.Namespace) -> Config:
    return load_config(getattr(args, "config", None))


def _check(args: argparse.Namespace) -> int:
    config = _config(args)
    paths = args.paths or config.rule_paths
    errors = check_paths(paths, config.rule_policy)
    for error in errors:
        print(error.format(), file=sys.stderr)
    if errors:
        print(f"{len(errors)} error{'s' if len(errors) != 1 else ''}", file=sys.stderr)
        return 1
    files = rule_files(paths)
    print(f"ok: {len(files)} rule file{'s' if len(files) != 1 else ''}")
    return 0


def _explain(args: argparse.Namespace) -> int:
    config = _config(args)
    analysis = analyse(args.rules or config.rule_paths, config.rule_policy)
    for error in analysis.errors:
        print(error.format(), file=sys.stderr)
    # Explain what can be explained even if other rules have errors, and still say
    # (by the exit status) that the rules do not check.
    text = explain(analysis.catalog, args.name)
    if text is None:
        print(f"no stream, alert, table or aggregate named '{args.name}'", file=sys.stderr)
        return 1
    print(text)
    return 1 if analysis.errors else 0


def _test(args: argparse.Namespace) -> int:
    from lookout.rule_tests import run_rule_tests  # the engine core: only for this command

    config = _config(args)
    return run_rule_tests(args.paths or config.rule_paths, config.rule_policy)


def _rule_paths(parser: argparse.ArgumentParser, positional: bool) -> None:
    """The rule files or folders a command takes: `PATH...`, or `--rules PATH` repeated."""
    name, options = ("paths", {"nargs": "*"}) if positional else ("--rules", {"action": "append"})
    parser.add_argument(
        name,
        metavar="PATH",
        help="rule files or folders (default: the configured rule library and user rules)",
        **options,  # type: ignore[arg-type]
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `rules` command (with `check`, `explain` and `test`) to an argparse
    subparsers."""
    rules = subparsers.add_parser("rules", help="check, explain and test rule files")
    sub = rules.add_subparsers(dest="rules_command", required=True)
    check = sub.add_parser("check", help="check rule files; exit 1 on any error")
    _rule_paths(check, positional=True)
    check.set_defaults(func=_check)
    expl = sub.add_parser(
        "explain",
        help="explain a rule's streams, keys, windows, outputs; exit 1 if the rules have errors",
    )
    expl.add_argument("name", metavar="NAME")
    _rule_paths(expl, positional=False)
    expl.set_defaults(func=_explain)
    test = sub.add_parser(
        "test",
        help="run the rule files' tests (NAME.test.yaml beside NAME.sql); exit 1 on a failure",
    )
    _rule_paths(test, positional=True)
    test.set_defaults(func=_test)
    from lookout.preview_cli import register as register_preview  # imports the engine: late

    register_preview(sub)
    from lookout.rule_status import register as register_status

    register_status(sub)
