"""Readings in blocks: numpy record arrays, one row per reading, and how they are written.

A generator yields :class:`Block` s: the readings of a slice of event time, in
event-time order, as one record array. Its dtype (:func:`row_dtype`) has the fields every
reading has (``t`` the true event time in ms, ``topic`` an index into the run's
:class:`Layout`, ``seq``; ``ts``, ``arrival``, ``key``, ``order`` and ``fault`` are set by
:func:`simulators.disorder.arrange`) and those of its kind's payloads. The layout names
each topic: its MQTT topic, its source and the :class:`Shape` its payloads have.

A :class:`Writer` turns rows into JSON text many at a time: each topic's payload is a
``%`` template, and the templates of many rows are filled in one call
(:meth:`Writer.render`); :meth:`Writer.payload` builds one row's payload as a dict, for
the rare single messages (malformed ones) and for tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain

import numpy as np
import orjson

from simulators.common import format_ts

#: Fields of every row (numpy record dtype): event time, topic index, sequence number,
#: the payload's ts (event time plus the source's skew), arrival time, the tie-break key
#: of equal arrivals, the order of generation and the fault (0 none, 1-4 a malformed
#: kind of :data:`simulators.disorder.MALFORMED_KINDS`).
COMMON_FIELDS = [
    ("t", "i8"),
    ("topic", "i4"),
    ("seq", "i8"),
    ("ts", "i8"),
    ("arrival", "i8"),
    ("key", "f8"),
    ("order", "i8"),
    ("fault", "i1"),
]


#: Event time generated at once: a slice of this many ms (more at low rates, so that a
#: slice holds some 2,000 readings).
SLICE_MS = 1000


def slice_ms(rate: float) -> int:
    """The length of the event-time slices a generator of ``rate`` readings/s works in."""
    return max(SLICE_MS, min(600_000, round(2_000_000 / rate)))


def row_dtype(*fields: tuple[str, str]) -> np.dtype:
    """The record dtype of rows with the common fields and ``fields`` (name, numpy type)."""
    return np.dtype(COMMON_FIELDS + list(fields))


@dataclass(frozen=True)
class Field:
    """One payload field: its JSON key and where its value comes from.

    ``kind``:

    - ``const``: ``value`` itself;
    - ``int``: the integer in ``column``;
    - ``centi``: the number in ``column`` divided by 100 (a value rounded to 2 decimals);
    - ``topic``: ``table[topic]``, the same for every reading of a topic;
    - ``code``: ``table[code]``, by the row's ``code`` field (a small integer);
    - ``tag``: a tag id, ``prefix`` and the number in ``column`` zero-padded to
      ``digits``, where ``table[code]`` is (prefix, digits).
    """

    key: str
    kind: str
    column: str = ""
    table: tuple = ()
    value: object = None


@dataclass(frozen=True)
class Shape:
    """The payload fields of one kind of reading, in payload order (``ts``, ``source``,
    ``seq`` and ``epoch`` follow)."""

    fields: tuple[Field, ...]

    @property
    def codes(self) -> int:
        """How many values the rows' ``code`` takes (1: the shape has no code)."""
        return max((len(f.table) for f in self.fields if f.kind in ("code", "tag")), default=1)


@dataclass(frozen=True)
class Layout:
    """The topics of a run: topic ``i`` is published to ``names[i]`` by source
    ``sources[i]`` with payloads of shape ``shapes[shape_of[i]]``."""

    names: tuple[str, ...]
    sources: tuple[str, ...]
    shape_of: tuple[int, ...]
    shapes: tuple[Shape, ...]


@dataclass(frozen=True)
class Block:
    """Readings of event time before ``until`` not in an earlier block, in event-time
    order; every later block's readings have ``t >= until``."""

    rows: np.ndarray
    until: int
    layout: Layout


def _json(value: object) -> str:
    return orjson.dumps(value).decode()


# Two-decimal numbers 0.00-99.99 as JSON text, built on first use.
_CENTI: list[np.ndarray] = []


def _centi_text(values: np.ndarray) -> list[str]:
    if not _CENTI:
        _CENTI.append(np.array([repr(c / 100) for c in range(10_000)], dtype=object))
    table = _CENTI[0]
    if len(values) and (values.min() < 0 or values.max() >= len(table)):
        return [repr(c / 100) for c in values.tolist()]
    return table[values].tolist()


class Writer:
    """Writes rows of a :class:`Layout` as JSON payloads: ``ts`` as epoch ms or ISO-8601
    (``ts_format``), and ``epoch`` (when not None) on every reading.

    Each topic, and each ``code`` of its shape, has a ``%`` template of its own, with
    every field known from them written in; a row brings the rest (its ``int``,
    ``centi`` and ``tag`` numbers, ``ts`` and ``seq``).
    """

    def __init__(self, layout: Layout, ts_format: str, epoch: str | None) -> None:
        self.layout = layout
        self.ts_format = ts_format
        self.epoch = epoch
        self.names = layout.names
        self.codes = max(shape.codes for shape in layout.shapes)
        self._shape_of = np.array(layout.shape_of, dtype=np.int64)
        # Each shape's row values in template order; every template takes as many (the
        # shorter ones end in "%.0s", which writes nothing), so rows of several shapes
        # fill one template string.
        self._columns = [
            [(f.kind, f.column) for f in shape.fields if f.kind in ("int", "centi", "tag")]
            for shape in layout.shapes
        ]
        self._width = max(len(c) for c in self._columns) + 2  # and ts, seq
        self._templates = np.array(
            [
                self._template(topic, code)
                for topic in range(len(layout.names))
                for code in range(self.codes)
            ],
            dtype=object,
        )

    def _template(self, topic: int, code: int) -> str:
        k = self.layout.shape_of[topic]
        parts = []
        for f in self.layout.shapes[k].fields:
            key = _json(f.key)
            if f.kind in ("int", "centi"):
                parts.append(f"{key}:%{'d' if f.kind == 'int' else 's'}")
            elif f.kind == "tag":
                prefix, digits = f.table[min(code, len(f.table) - 1)]
                parts.append(f'{key}:"{_escape(prefix)}%0{int(digits)}d"')
            else:
                if f.kind == "const":
                    value = f.value
                elif f.kind == "topic":
                    value = f.table[topic]
                else:
                    value = f.table[min(code, len(f.table) - 1)]
                parts.append(f"{key}:{_escape(_json(value))}")
        parts.append('"ts":%d' if self.ts_format == "ms" else '"ts":"%s+00:00"')
        parts.append(f'"source":{_escape(_json(self.layout.sources[topic]))}')
        parts.append('"seq":%d')
        if self.epoch is not None:
            parts.append(f'"epoch":{_escape(_json(self.epoch))}')
        padding = "%.0s" * (self._width - 2 - len(self._columns[k]))
        return "{" + ",".join(parts) + "}" + padding

    def _values(self, k: int, rows: np.ndarray) -> list[list]:
        """The template values of ``rows`` (all of shape ``k``), column by column."""
        columns: list[list] = []
        for kind, column in self._columns[k]:
            if kind == "centi":
                columns.append(_centi_text(rows[column]))
            else:
                columns.append(rows[column].tolist())
        if self.ts_format == "ms":
            columns.append(rows["ts"].tolist())
        else:
            iso = np.datetime_as_string(rows["ts"].astype("datetime64[ms]"), unit="ms")
            columns.append(iso.tolist())
        columns.append(rows["seq"].tolist())
        return columns + [[0] * len(rows)] * (self._width - len(columns))

    def render(self, rows: np.ndarray, seps: list[str] | None = None) -> str:
        """The JSON of ``rows``, each followed by its separator in ``seps`` (default a
        newline; the last row's is not written)."""
        if not len(rows):
            return ""
        index = rows["topic"].astype(np.int64) * self.codes
        if self.codes > 1:
            index += rows["code"]
        templates = self._templates[index].tolist()
        shapes = self._shape_of[rows["topic"]]
        first = int(shapes[0])
        if len(self.layout.shapes) == 1 or (shapes == first).all():
            values = tuple(chain.from_iterable(zip(*self._values(first, rows), strict=True)))
        else:
            table = np.empty((len(rows), self._width), dtype=object)
            for k in np.unique(shapes).tolist():
                idx = np.flatnonzero(shapes == k)
                for c, column in enumerate(self._values(k, rows[idx])):
                    table[idx, c] = column
            values = tuple(table.ravel().tolist())
        if seps is None:
            template = "\n".join(templates)
        else:
            template = "".join(chain.from_iterable(zip(templates, seps, strict=True)))
            template = template[: len(template) - len(seps[-1])]
        return template % values

    def json_rows(self, rows: np.ndarray) -> list[str]:
        """Every row's payload as JSON text, in row order."""
        return self.render(rows).split("\n") if len(rows) else []

    def payload(self, row: np.void) -> dict:
        """One row's payload as a dict (in payload order)."""
        topic = int(row["topic"])
        shape = self.layout.shapes[self.layout.shape_of[topic]]
        code = int(row["code"]) if "code" in (row.dtype.names or ()) else 0
        out: dict = {}
        for f in shape.fields:
            if f.kind == "const":
                out[f.key] = f.value
            elif f.kind == "int":
                out[f.key] = int(row[f.column])
            elif f.kind == "centi":
                out[f.key] = int(row[f.column]) / 100
            elif f.kind == "topic":
                out[f.key] = f.table[topic]
            elif f.kind == "code":
                out[f.key] = f.table[code]
            else:
                prefix, digits = f.table[code]
                out[f.key] = f"{prefix}{int(row[f.column]):0{digits}d}"
        out["ts"] = format_ts(int(row["ts"]), self.ts_format)
        out["source"] = self.layout.sources[topic]
        out["seq"] = int(row["seq"])
        if self.epoch is not None:
            out["epoch"] = self.epoch
        return out


def _escape(text: str) -> str:
    """``text`` as it must stand in a ``%`` template."""
    return text.replace("%", "%%")


@dataclass(frozen=True)
class Chunk:
    """Readings sent in a row, in arrival order (``rows["arrival"]`` ascending), written
    by ``writer``."""

    rows: np.ndarray
    writer: Writer

    def __len__(self) -> int:
        return len(self.rows)

    def messages(self) -> Iterator[tuple[int, str, str, dict]]:
        """One message per reading, its payload a dict (slow: for tests and tools)."""
        names = self.writer.names
        for row in self.rows:
            yield int(row["arrival"]), "reading", names[int(row["topic"])], self.writer.payload(row)


def assign_seq(topics: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Sequence numbers of rows of ``topics`` (in order), per topic from ``counters``,
    which are advanced past them."""
    n = len(topics)
    if not n:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(topics, kind="stable")
    st = topics[order]
    first = np.flatnonzero(np.r_[True, st[1:] != st[:-1]])
    rank = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
    seq = np.empty(n, dtype=np.int64)
    seq[order] = counters[st] + rank
    counters += np.bincount(topics, minlength=len(counters))
    return seq
