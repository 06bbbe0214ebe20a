"""A plan cut down to what some of its streams need (a preview's alerts, a warm start's
new rules)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from engine.core.plan import Plan


def needed_plan(plan: Plan, sinks: Iterable[str]) -> Plan:
    """`plan` cut down to what `sinks` need: their queries, those of the streams they
    read (every branch of a UNION ALL), transitively, and the incidents of the alerts
    among them. A stage's name and key depend only on its query and those upstream,
    so the kept stages emit what they emit in the whole plan."""
    producers: dict[str, list[int]] = {}
    for i, query in enumerate(plan.queries):
        producers.setdefault(query.sink.name, []).append(i)
    wanted, streams, todo = set(), set(), list(sinks)
    while todo:
        stream = todo.pop()
        if stream in streams:
            continue
        streams.add(stream)
        for i in producers.get(stream, ()):
            wanted.add(i)
            todo.append(plan.queries[i].input)
    return dataclasses.replace(
        plan,
        streams={n: s for n, s in plan.streams.items() if n in streams},
        queries=tuple(q for i, q in enumerate(plan.queries) if i in wanted),
        incidents=tuple(i for i in plan.incidents if i.alert in streams),
    )
