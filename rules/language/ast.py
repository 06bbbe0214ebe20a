"""The syntax tree of a rule file.

Every node carries the position (line, column, both 1-based) of its first
character so that the checker can point at it; statements also carry their file.
The tree is plain frozen data: nothing here evaluates anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Literal as TypingLiteral

Severity = TypingLiteral["info", "warning", "critical"]
R2S = TypingLiteral["ISTREAM", "DSTREAM", "RSTREAM"]


@dataclass(frozen=True)
class Pos:
    """A 1-based line and column in a rule file."""

    line: int
    col: int


@dataclass(frozen=True)
class Ident:
    """A name as written, with where it was written."""

    name: str
    pos: Pos


# ---- expressions -------------------------------------------------------------


@dataclass(frozen=True)
class Literal:
    """A constant. `type` is INT, DOUBLE, STRING, BOOLEAN, NULL, TIMESTAMP or INTERVAL.

    TIMESTAMP and INTERVAL values are integers in milliseconds (epoch / length).
    """

    value: object
    type: str
    pos: Pos


@dataclass(frozen=True)
class Column:
    """A column reference, optionally qualified by a FROM alias (`t.speed`)."""

    name: str
    qualifier: str | None
    pos: Pos


@dataclass(frozen=True)
class Unary:
    """`-x` or `NOT x`."""

    op: str
    operand: Expr
    pos: Pos


@dataclass(frozen=True)
class Binary:
    """Arithmetic (+ - * / %), comparison (= <> < <= > >=) or logic (AND OR)."""

    op: str
    left: Expr
    right: Expr
    pos: Pos


@dataclass(frozen=True)
class IsNull:
    """`x IS [NOT] NULL`."""

    operand: Expr
    negated: bool
    pos: Pos


@dataclass(frozen=True)
class InList:
    """`x [NOT] IN (a, b, ...)`."""

    operand: Expr
    items: tuple[Expr, ...]
    negated: bool
    pos: Pos


@dataclass(frozen=True)
class Case:
    """`CASE WHEN c THEN v ... [ELSE e] END`."""

    whens: tuple[tuple[Expr, Expr], ...]
    otherwise: Expr | None
    pos: Pos


@dataclass(frozen=True)
class WindowSpec:
    """A window, written either as `agg(...) OVER (...)` (data-driven, origin "over")
    or as `FROM s [...]` (CQL / domain-driven, origin "from").

    kind is one of:
      rows       ROWS n PRECEDING / [ROWS n]             (count-based; n = rows)
                 ROWS UNBOUNDED PRECEDING                (every row so far; rows = None)
      partition_rows  [PARTITION BY k ROWS n]             (CQL partitioned window)
      range      RANGE t PRECEDING / [RANGE t]           (time-based; range_ms)
      unbounded  RANGE UNBOUNDED PRECEDING / [RANGE UNBOUNDED]  (landmark from the
                 start of the stream, or of the current reset period)
      now        [NOW]                                   (CQL, tuples of this instant)
      since      RANGE SINCE TIMESTAMP '..' / [SINCE ..] (lower-bounded landmark)
      until      RANGE UNTIL TIMESTAMP '..' / [UNTIL ..] (upper-bounded landmark)
      band       RANGE BETWEEN a AND b / [BETWEEN a AND b] (fixed band)
    """

    kind: str
    origin: TypingLiteral["over", "from"]
    pos: Pos
    partition: tuple[Ident, ...] = ()
    rows: int | None = None
    range_ms: int | None = None
    slide_rows: int | None = None
    slide_ms: int | None = None
    lag_ms: int | None = None
    reset_ms: int | None = None
    lower_ms: int | None = None
    upper_ms: int | None = None
    active_expiration: bool = False
    modifier_pos: Pos | None = None


@dataclass(frozen=True)
class Call:
    """A function or aggregate call; `star` for `count(*)`; `over` for a window."""

    name: str
    args: tuple[Expr, ...]
    star: bool
    over: WindowSpec | None
    pos: Pos


Expr = Literal | Column | Unary | Binary | IsNull | InList | Case | Call


# ---- queries -------------------------------------------------------------------


@dataclass(frozen=True)
class SelectItem:
    """One entry of a SELECT list; `expr` is None for `*`."""

    expr: Expr | None
    alias: Ident | None
    pos: Pos


@dataclass(frozen=True)
class PatternVar:
    """A pattern variable in PATTERN (...)."""

    name: str
    pos: Pos


@dataclass(frozen=True)
class PatternSeq:
    """Pattern items one after the other."""

    items: tuple[PatternNode, ...]
    pos: Pos


@dataclass(frozen=True)
class PatternAlt:
    """`p | q | ...`: the first option that matches is preferred."""

    options: tuple[PatternNode, ...]
    pos: Pos


@dataclass(frozen=True)
class PatternRepeat:
    """`p*`, `p+`, `p?`, `p{n}`, `p{n,}`, `p{n,m}` (high None: unbounded), greedy or
    reluctant (a trailing `?`)."""

    item: PatternNode
    low: int
    high: int | None
    greedy: bool
    pos: Pos


PatternNode = PatternVar | PatternSeq | PatternAlt | PatternRepeat


@dataclass(frozen=True)
class MatchRecognize:
    """`MATCH_RECOGNIZE (PARTITION BY ... ORDER BY ts MEASURES e AS m, ... [ONE ROW PER
    MATCH] [AFTER MATCH SKIP PAST LAST ROW | TO NEXT ROW] PATTERN (...) [WITHIN d]
    [DEFINE V AS cond, ...])`; `skip` is "PAST LAST ROW" or "TO NEXT ROW"."""

    partition: tuple[Ident, ...]
    order_by: Ident
    measures: tuple[tuple[Expr, Ident], ...]
    skip: str
    pattern: PatternNode
    within_ms: int | None
    defines: tuple[tuple[Ident, Expr], ...]
    pos: Pos


@dataclass(frozen=True)
class SourceRef:
    """A stream or table in FROM, with an optional CQL window or MATCH_RECOGNIZE, and
    an alias."""

    name: Ident
    window: WindowSpec | None
    alias: Ident | None
    match: MatchRecognize | None = None

    @property
    def label(self) -> str:
        """The name columns are qualified with: the alias, else the relation name."""
        return self.alias.name if self.alias else self.name.name


@dataclass(frozen=True)
class Select:
    """One SELECT block; `joins[i]` is the ON condition of `sources[i]` (None for
    the first source and for comma joins) and `left[i]` whether it is a LEFT JOIN."""

    r2s: R2S | None
    items: tuple[SelectItem, ...]
    sources: tuple[SourceRef, ...]
    joins: tuple[Expr | None, ...]
    where: Expr | None
    group_by: tuple[Expr, ...]
    having: Expr | None
    pos: Pos
    left: tuple[bool, ...] = ()


@dataclass(frozen=True)
class Query:
    """One or more SELECT blocks combined by UNION ALL (a sort-merge by timestamp)."""

    selects: tuple[Select, ...]
    pos: Pos


# ---- statements ------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnDef:
    """`name TYPE` in a column list."""

    name: Ident
    type: Ident


@dataclass(frozen=True)
class CreateStream:
    """A base stream read from MQTT: `CREATE STREAM s (...) ORDER BY ts SLACK d
    [PER SOURCE] [IDLE i] SOURCE '...'` (`per_source`: where PER SOURCE stands, None
    without it; `idle_ms`, `idle_pos`: the IDLE clause's duration and place)."""

    name: Ident
    columns: tuple[ColumnDef, ...]
    order_by: Ident
    slack_ms: int
    source: str
    pos: Pos
    file: str = field(default="<string>", compare=False)
    per_source: Pos | None = None
    idle_ms: int | None = None
    idle_pos: Pos | None = None


@dataclass(frozen=True)
class CreateDerived:
    """A derived stream: `CREATE STREAM s AS SELECT ...`."""

    name: Ident
    query: Query
    pos: Pos
    file: str = field(default="<string>", compare=False)


@dataclass(frozen=True)
class CreateTable:
    """A reference relation: `CREATE TABLE t (...) FROM CSV|DELTA 'path'`."""

    name: Ident
    columns: tuple[ColumnDef, ...]
    format: str
    path: str
    pos: Pos
    file: str = field(default="<string>", compare=False)
    path_pos: Pos | None = field(default=None, compare=False)


@dataclass(frozen=True)
class CreateAggregate:
    """A Python UDA: `CREATE AGGREGATE f(args) RETURNS T LANGUAGE PYTHON AS 'mod:Class'`."""

    name: Ident
    params: tuple[ColumnDef, ...]
    returns: Ident
    target: str
    target_pos: Pos
    algebraic: bool
    pos: Pos
    file: str = field(default="<string>", compare=False)


@dataclass(frozen=True)
class IncidentClauses:
    """How an alert's reports become incidents: `[FOR d] [RESOLVE WHEN cond | RESOLVE
    AFTER d] [KEEP FIRING FOR d]` (durations in ms; none given: the defaults)."""

    pending_ms: int = 0
    resolve_when: Expr | None = None
    resolve_after_ms: int | None = None
    keep_firing_ms: int = 0
    resolve_pos: Pos | None = None


@dataclass(frozen=True)
class CreateAlert:
    """`CREATE ALERT a SEVERITY s [MESSAGE '...{col}...'] [incident clauses] AS SELECT ...`."""

    name: Ident
    severity: Severity
    message: str | None
    message_pos: Pos | None
    query: Query
    pos: Pos
    file: str = field(default="<string>", compare=False)
    incidents: IncidentClauses = IncidentClauses()


Statement = CreateStream | CreateDerived | CreateTable | CreateAggregate | CreateAlert


def without_positions(node: object) -> object:
    """`node` as nested tuples with no positions or file names: the same for the same
    rule however its file is laid out (what a rule's saved state is tied to)."""
    if is_dataclass(node) and not isinstance(node, type):
        return (
            type(node).__name__,
            *(
                (f.name, without_positions(getattr(node, f.name)))
                for f in fields(node)
                if f.name not in ("pos", "file") and not f.name.endswith("_pos")
            ),
        )
    if isinstance(node, tuple | list):
        return tuple(without_positions(item) for item in node)
    return node
