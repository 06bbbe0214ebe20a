"""Which rules changed since the engine last ran on a lakehouse, said at each start and
at each change of rules applied while it runs.

The engine query resumes each stage's state from its checkpoint, and its stateful step
drops the state of a stage that has been removed from the rules, or whose rule has
been edited since the state was saved (`Query.definition`): that state was built by
another rule, and a stage that comes back has missed the readings in between. This
happens inside Spark's Python workers, where nobody reads it, so the engine records the
stages' definitions at every start (`<lakehouse>/_checkpoints/RULES.json`) and logs what
differs from the last start's.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress

import orjson
import pyarrow.fs as pafs

from engine.core.plan import Plan
from lookout.config import Config
from lookout.storage import filesystem, put_whole


def rule_changes(last: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """What the engine does differently from the last start, one message per
    stage edited or removed (stage name -> definition, as `definitions` gives)."""
    messages = [
        f"rule {name!r} has been edited since the last start: its state from before "
        "is dropped, and its windows are filled again from the stored readings"
        for name in sorted(now.keys() & last.keys())
        if now[name] != last[name]
    ]
    messages += [
        f"rule {name!r} is no longer in the rules: its state is dropped (were it added "
        "again, its windows would be filled from the stored readings)"
        for name in sorted(last.keys() - now.keys())
    ]
    return messages


def definitions(plan: Plan) -> dict[str, str]:
    """Every stage of `plan` by name, with its root query's definition digest."""
    return {stage.name: stage.query.definition for stage in plan.stages()}


def record_rule_changes(config: Config, plan: Plan) -> list[str]:
    """Compare `plan` with the stages recorded at the last start on this lakehouse
    (none: nothing changed), record `plan`'s, and return `rule_changes`' messages."""
    fs, root = filesystem(config.table("_checkpoints"), config.s3)
    record = f"{root}/RULES.json"
    last: object = {}
    if fs.get_file_info(record).type == pafs.FileType.File:
        # A record cut short by a crash while written loses only these messages.
        with fs.open_input_stream(record) as f, suppress(orjson.JSONDecodeError):
            last = orjson.loads(f.read())
    if not isinstance(last, dict):
        last = {}  # not a record this engine wrote (edited by hand): nothing to compare
    now = definitions(plan)
    # Replaced whole: a write that fails (a full disk) keeps the last start's record.
    put_whole(
        f"{config.table('_checkpoints')}/RULES.json",
        orjson.dumps(now, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2),
        config.s3,
    )
    return rule_changes(last, now)
