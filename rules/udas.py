"""Python user-defined aggregates of the rule library (ESL-shaped, see
engine.core.aggregates.WindowAggregate).

Each method receives the argument tuple of one input row and the window buffer
(`inwindow`: the argument tuples still in the window, oldest first) and returns the
values to emit, like ESL's `INSERT INTO RETURN`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from engine.core.aggregates import InWindow, WindowAggregate


class ItemAlarm(WindowAggregate):
    """ESL example 18, the theft alarm: item_alarm(tagid, tagtype, tagtime).

    Called with `RANGE t PRECEDING ACTIVE EXPIRATION`. An authorised person ('ap')
    clears every item waiting in the window (the person came within t after the item);
    an item read while an 'ap' is in the window is covered (the person came within t
    before it). An item that expires neither cleared nor covered emits 'larceny alarm'.

    The paper's version deletes the cleared items from ``inwindow``. Here they stay
    until they expire, and expire silently: deleting searched the whole window at every
    read of a person's tag, thousands of readings at a busy door, many times a second.
    Readings expire in arrival order, and a person clears every item read before, so
    the cleared items are always the window's oldest items: counting them is enough.
    """

    # How many items in the window are cleared, and how many wait. `waiting` is None in
    # a state saved when cleared items were deleted: counted at the next person's read.
    cleared = 0
    waiting: int | None = 0

    def __init__(self) -> None:
        # (tagid, tagtime) of items read while an authorised person was in the window,
        # and how many authorised persons' readings the window holds: counted as they
        # come and expire, not searched for at every item.
        self.covered: Counter[tuple[Any, Any]] = Counter()
        self.persons = 0
        self.cleared = 0
        self.waiting = 0

    def set_state(self, state: Any) -> None:
        self.cleared, self.waiting = 0, None  # unless the state counted them
        super().set_state(state)

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """A reading arrives: a person clears the waiting items, an item is covered if
        a person is in the window."""
        tagid, tagtype, tagtime = args
        if tagtype == "ap":
            self.persons += 1
            if self.waiting is None:
                self.waiting = sum(1 for waiting in inwindow if waiting[1] == "item")
            self.cleared += self.waiting
            self.waiting = 0
        elif tagtype == "item":
            if self.waiting is not None:
                self.waiting += 1
            if self.persons:
                self.covered[(tagid, tagtime)] += 1
        return ()

    def _uncover(self, tagid: Any, tagtime: Any) -> bool:
        """Forget one covered reading of this item; whether there was one."""
        count = self.covered.get((tagid, tagtime), 0)
        if count > 1:
            self.covered[(tagid, tagtime)] = count - 1
        elif count:
            del self.covered[(tagid, tagtime)]
        return bool(count)

    def expire(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """A reading leaves the window: an item neither cleared nor covered alarms."""
        tagid, tagtype, tagtime = args
        if tagtype == "ap":
            self.persons -= 1
            return ()
        if tagtype != "item":
            return ()
        covered = self._uncover(tagid, tagtime)
        if self.cleared:
            self.cleared -= 1
            return ()
        if self.waiting:
            self.waiting -= 1
        return () if covered else ("larceny alarm",)


class PackingGroup(WindowAggregate):
    """ESL example 17, packing groups: packing_group(tagtime) -> group number.

    Items read less than GAP_MS apart belong to the same group; a longer gap starts
    a new group. Non-blocking (no terminate), so it runs over an unbounded window.
    """

    GAP_MS = 2_000

    def __init__(self) -> None:
        self.last: int | None = None
        self.group = 0

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """Compare the gap to the previous item and emit the item's group number."""
        tagtime = args[0]
        if self.last is not None and tagtime - self.last > self.GAP_MS:
            self.group += 1
        self.last = tagtime
        inwindow.delete(lambda t: True)  # the group needs no buffer, only `last`
        return (self.group,)


class Silence(WindowAggregate):
    """silence(ts): emits the time of the last reading when a partition falls silent.

    Called with `RANGE n PRECEDING ACTIVE EXPIRATION`: when the newest reading of the
    partition expires, no reading came for n, and the aggregate emits that reading's
    timestamp. Each arrival deletes the older readings, so only the newest ever expires.
    """

    newest_only = True

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """A reading arrives; only the newest one matters, so drop the others."""
        inwindow.delete(lambda t: True)
        return ()

    def expire(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """The expiring reading is the newest (the only one kept): silence."""
        return (args[0],)


class MissedDoor(WindowAggregate):
    """missed_door(door, next_door): a tag seen at a door and not at `next_door`
    within the window's range; emits the door it was last seen at.

    Called with `PARTITION BY tagid RANGE t PRECEDING ACTIVE EXPIRATION`. A reading at
    `next_door` settles the tag's earlier readings (they are deleted and never
    expire); of repeated readings at the first door only the last one counts.

    It is `newest_only`: a reading alarms only if no later reading of its tag came
    within t (a later one at `next_door` deleted it; a later repeat is still in the
    window when it expires), and then its value is its own door, or nothing at
    `next_door`. The repeats it keeps never alarm.
    """

    newest_only = True

    def iterate(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """A reading at the next door settles the earlier ones."""
        door, next_door = args
        if door == next_door:
            inwindow.delete(lambda t: True)
        return ()

    def expire(self, args: tuple[Any, ...], inwindow: InWindow) -> Iterable[Any]:
        """A first-door reading expiring unsettled, with no repeat after it, alarms."""
        door, next_door = args
        # The expiring reading is still oldest(); a later one is a repeat and decides.
        if door == next_door or len(inwindow) > 1:
            return ()
        return (door,)
