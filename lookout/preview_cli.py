"""`lookout rules preview FILE`: what a rule file's alerts would have raised on the
readings stored in the lakehouse (:mod:`lookout.preview`), printed per rule and key."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.alerts import iso_utc
from lookout.config import load_config
from lookout.preview import Preview, PreviewError, parse_duration, preview
from rules.language.loader import RuleCheckError


def _run(args: argparse.Namespace) -> int:
    config = load_config(getattr(args, "config", None))
    file = Path(args.file)
    try:
        since = parse_duration(args.since)
        text = file.read_text(encoding="utf-8")
    except (ValueError, OSError) as err:
        print(f"lookout rules preview: {err}", file=sys.stderr)
        return 2
    try:
        result = preview(
            args.rules or config.rule_paths,
            file,
            text,
            args.lakehouse or config.lakehouse,
            since,
            config.rule_policy,
            config.s3,
        )
    except RuleCheckError as err:
        for error in err.errors:
            print(error.format(), file=sys.stderr)
        count = len(err.errors)
        print(f"{count} error{'s' if count != 1 else ''}; nothing evaluated", file=sys.stderr)
        return 1
    except PreviewError as err:
        print(f"lookout rules preview: {err}", file=sys.stderr)
        return 2
    print(report(result, args.limit))
    return 0


def report(result: Preview, limit: int) -> str:
    """The preview as text: the history read, per rule and key the counts, each rule's
    latest incidents (at most `limit`), and the time taken."""
    lines = [f"history {iso_utc(result.start)} .. {iso_utc(result.end)} (the stored watermark)"]
    for stream in result.streams:
        mark = "none" if stream.watermark is None else iso_utc(stream.watermark)
        lines.append(f"  {stream.stream}: {stream.readings:,} readings, watermark {mark}")
    lines.append("")
    rows = result.summary()
    width = max(len("key"), *(len(r["key"]) for r in rows))
    for rule in result.rules:
        lines.append(f"{rule}:")
        lines.append(f"  {'key':<{width}}  {'alerts':>7}  {'incidents':>9}  {'firing':>6}")
        for row in (r for r in rows if r["rule"] == rule):
            lines.append(
                f"  {row['key'] or '-':<{width}}  {row['alerts']:>7,}  "
                f"{row['incidents']:>9,}  {row['firing']:>6,}"
            )
        incidents = [i for i in result.incidents if i["rule"] == rule]
        for incident in incidents[-limit:] if limit else []:
            until = incident["resolved_at"]
            state = "firing" if until is None else f"resolved {iso_utc(until)}"
            lines.append(
                f"  {iso_utc(incident['opened_at'])}  {incident['key'] or '-'}  {state}  "
                f"{incident['reports']} report(s)  {incident['message']}"
            )
        if limit and len(incidents) > limit:
            lines.append(f"  ({len(incidents) - limit} earlier incidents not shown)")
    lines.append("")
    lines.append(
        f"evaluated in {result.evaluate_s:.2f} s (reading the tables {result.read_s:.2f} s)"
    )
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `preview` to the `rules` command's subparsers."""
    command = subparsers.add_parser(
        "preview",
        help="what a rule file's alerts would have raised on the stored readings",
    )
    command.add_argument("file", metavar="FILE", help="the rule file (new or edited)")
    command.add_argument(
        "--since",
        default="24h",
        help="how much history, back from the stored watermark (90s, 15m, 1h, 2d; default 24h)",
    )
    command.add_argument(
        "--lakehouse", default=None, help="the lakehouse (default: the configured one)"
    )
    command.add_argument(
        "--rules",
        action="append",
        metavar="PATH",
        help="rule files or folders beside FILE (default: the configured library and user rules)",
    )
    command.add_argument(
        "--limit", type=int, default=10, help="incidents listed per rule (latest; default 10)"
    )
    command.set_defaults(func=_run)
