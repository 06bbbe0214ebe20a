"""Python's collector in the engine's workers (`engine.python_gc`): what a batch
leaves alive is frozen, so later passes do not walk it; its garbage is still collected,
and so is a dropped pipeline's."""

from __future__ import annotations

import gc
import weakref

import pytest

from engine.python_gc import collect_frozen, freeze_batch_survivors

pytestmark = pytest.mark.usefixtures("unfrozen")


class Node:
    """An object the collector tracks, which can be put in a cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    """A reference cycle no one else holds, seen through a weak reference."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_what_a_batch_leaves_alive_is_frozen_and_its_garbage_collected() -> None:
    gc.collect()
    kept = [Node() for _ in range(1000)]
    dropped = cycle()
    before = gc.get_freeze_count()
    freeze_batch_survivors()
    assert dropped() is None
    assert gc.get_freeze_count() >= before + len(kept)
    assert not any(o is kept[0] for o in gc.get_objects())  # no pass walks it now


def test_a_frozen_cycle_dropped_later_is_collected_by_collect_frozen() -> None:
    held = [cycle()]
    strong = held[0]()  # alive while the batch runs
    freeze_batch_survivors()
    del strong
    gc.collect()
    assert held[0]() is not None, "a frozen cycle outlives a plain pass"
    collect_frozen()
    assert held[0]() is None
