"""Which keys a stage holds state for and when each must wake, stored apart from the
keys' states: :class:`KeyIndex`.

A pipeline rebuilt from its store (a restarted engine, a standby taking over) needs
every key's wakeup before its first advance, but a key's state only when a batch
touches or wakes the key. An RFID stage holds one key per tag, hundreds of thousands:
reading all their states back cost seconds before the first batch. The index holds
per key only its text and its wakeup, in a few entries a rebuild lists; each key's
state waits in an entry of its own (kind :data:`KEY_STATE`), read when needed.

The index is a log. Each save writes one entry (kind :data:`KEY_INDEX`, numbered on)
with a record (text, wakeup) of every key saved since the last save and the texts of
the keys deleted; read in order, a key's last record wins and a deletion removes it.
Entries leave from the oldest end only (an entry's deletions must outlive the older
records they cancel): an oldest entry none of whose records is still a key's last is
deleted, and while there are more than ``max_entries`` the save carries the oldest
entry's live records into its own entry and deletes that one.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from engine.core.state import StateKey, StateStore

K = TypeVar("K", bound=Hashable)

KEY_INDEX = "keyindex"
"""The kind of an index entry: (keyindex, stage, "", number)."""
KEY_STATE = "keystate"
"""The kind of a key's own state: (keystate, stage, key, 0)."""
MAX_ENTRIES = 128
"""Index entries kept before the oldest one's live records are carried forward."""

_PICKLE = pickle.HIGHEST_PROTOCOL


@dataclass(frozen=True)
class Indexed(Generic[K]):
    """What a restored index holds: each live key with its text and wakeup, and whether
    every entry was saved by a stage that evicts idle keys."""

    keys: list[tuple[K, str, int | None]]
    evicting: bool


class KeyIndex(Generic[K]):
    """A stage's key index (module docstring). ``key_of`` gives a key from its stored
    text and ``text_of`` the text of a key; ``definition`` and ``kind`` mark the
    entries, so that a stage of another definition or kind finds them stale;
    ``max_entries`` is :data:`MAX_ENTRIES` unless given.

    In memory a key costs its place in two containers, not its text: an RFID stage
    indexes hundreds of thousands of keys, and the few whose records an entry carries
    forward have their texts made again."""

    def __init__(
        self,
        name: str,
        definition: str,
        kind: str,
        key_of: Callable[[str], K],
        text_of: Callable[[K], str],
        max_entries: int | None = None,
    ) -> None:
        self.name, self.definition, self.kind = name, definition, kind
        self._key_of, self._text_of = key_of, text_of
        self.max_entries = MAX_ENTRIES if max_entries is None else max_entries
        self._entry_of: dict[K, int] = {}  # each key: the entry of its last record
        # Each entry, oldest first: the keys it recorded (a key whose last record is
        # in a later entry too), and how many of them are still live there.
        self._members: dict[int, list[K]] = {}
        self._live: dict[int, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._entry_of)

    def __contains__(self, key: object) -> bool:
        return key in self._entry_of

    def state_entry(self, text: str) -> StateKey:
        """Where the state of the key with text ``text`` is stored."""
        return (KEY_STATE, self.name, text, 0)

    def save(
        self,
        store: StateStore,
        gone: Iterable[tuple[K, str]],
        changed: Iterable[tuple[K, str]],
        wakeups: Mapping[K, int],
        evicting: bool,
    ) -> None:
        """Write one entry: the keys deleted (``gone``, those indexed), then the keys
        saved (``changed``), each with its text, and ``wakeups`` the keys' wakeups now
        (a key without one is not in it); then drop the entries the log no longer
        needs."""
        number = self._next
        deleted = [text for key, text in gone if self._unlink(key)]
        mine: dict[K, str | None] = {}  # each key's text, None if to be made
        for key, text in changed:
            self._unlink(key)
            mine[key] = text
        members, live, entry_of = self._members, self._live, self._entry_of
        while members and (len(members) >= self.max_entries or not live[next(iter(members))]):
            oldest = next(iter(members))
            for key in members.pop(oldest):
                if entry_of.get(key) == oldest:  # its last record: carried forward
                    del entry_of[key]
                    mine[key] = None
            del live[oldest]
            store.delete((KEY_INDEX, self.name, "", oldest))
        if not mine and not deleted:
            return
        texts = [self._text_of(key) if text is None else text for key, text in mine.items()]
        entry_of.update(dict.fromkeys(mine, number))
        members[number] = list(mine)
        live[number] = len(mine)
        at = [wakeups.get(key) for key in mine]
        record = (self.definition, self.kind, evicting, texts, at, deleted)
        store.put((KEY_INDEX, self.name, "", number), pickle.dumps(record, _PICKLE))
        self._next = number + 1

    def _unlink(self, key: K) -> bool:
        """Take ``key``'s last record out of its entry's live ones; whether it had one."""
        number = self._entry_of.pop(key, None)
        if number is None:
            return False
        self._live[number] -= 1
        return True

    def restore(self, found: Sequence[tuple[StateKey, bytes]]) -> Indexed[K] | None:
        """Take up the entries ``found``; None (and nothing taken) if any was saved for
        another definition or kind."""
        records: list[tuple[int, tuple[bool, list[str], list[int | None], list[str]]]] = []
        for entry, data in found:
            definition, kind, *rest = pickle.loads(data)
            if definition != self.definition or kind != self.kind:
                return None
            records.append((entry[3], (rest[0], rest[1], rest[2], rest[3])))
        records.sort(key=lambda record: record[0])
        last: dict[str, tuple[int, int | None]] = {}
        evicting = True
        for number, (evicts, texts, wakeups, deleted) in records:
            evicting = evicting and evicts
            for text in deleted:
                last.pop(text, None)
            for text, wakeup in zip(texts, wakeups, strict=True):
                last[text] = (number, wakeup)
        self._members = {number: [] for number, _ in records}
        self._live = dict.fromkeys(self._members, 0)
        keys = []
        for text, (number, wakeup) in last.items():
            key = self._key_of(text)
            self._entry_of[key] = number
            self._members[number].append(key)
            self._live[number] += 1
            keys.append((key, text, wakeup))
        self._next = records[-1][0] + 1 if records else 0
        return Indexed(keys, evicting)


def recorded_states(entry: StateKey, data: bytes) -> list[StateKey]:
    """The key states an index entry names (recorded or deleted): those to delete with
    a stale index."""
    _, _, _, texts, _, deleted = pickle.loads(data)
    return [(KEY_STATE, entry[1], text, 0) for text in (*texts, *deleted)]
