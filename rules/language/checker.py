"""Static checks of parsed rules: names, types and windows.

The checker walks the statements of all rule files, each after the declarations it
reads wherever they are (so neither the order of the files nor of the statements in
them matters), builds the catalog (streams, tables, aggregates, alerts) and records,
per query, what the compiler needs: the input stream, the window, the aggregate calls
and the output columns. Every problem becomes a `RuleError` at the line and column of
the offending text.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass

from engine.core.aggregates import BUILTINS, IncrementalAggregate, WindowAggregate
from engine.core.plan import DEFAULT_SOURCE_IDLE_MS
from rules.language import ast
from rules.language.access import Access, AccessError
from rules.language.ast import Pos
from rules.language.errors import RuleError, make_error
from rules.language.recognize import (
    match_reads,
    matches_empty,
    pattern_size,
    pattern_variables,
    unbounded,
)

READING_COLUMNS = (
    "source", "epoch", "seq", "topic", "received_at", "arrival_watermark", "heartbeat"
)  # fmt: skip
"""What a reading carries besides its stream's columns (its id, where and when it
arrived, whether it is a heartbeat): a stream column of one of these names would meet
it in the readings table and in every stage's rows."""

TYPE_ALIASES = {
    "INT": "INT",
    "INTEGER": "INT",
    "BIGINT": "BIGINT",
    "LONG": "BIGINT",
    "DOUBLE": "DOUBLE",
    "FLOAT": "DOUBLE",
    "REAL": "DOUBLE",
    "STRING": "STRING",
    "VARCHAR": "STRING",
    "TEXT": "STRING",
    "BOOLEAN": "BOOLEAN",
    "BOOL": "BOOLEAN",
    "TIMESTAMP": "TIMESTAMP",
}
NUMERIC = {"INT", "BIGINT", "DOUBLE"}
UNKNOWN = "UNKNOWN"
"""The type of a column whose definition has an error already reported: whatever reads
it is not checked against it (one mistake, one error)."""
PSEUDO_COLUMNS = ("window_start", "window_end")
# Built-in aggregates whose argument must be a number.
NUMERIC_AGGREGATES = {"sum", "avg", "var", "stddev"}
# Scalar functions: name -> (min args, max args); result typing is in _scalar_type.
SCALARS = {
    "abs": (1, 1),
    "round": (1, 2),
    "floor": (1, 1),
    "ceil": (1, 1),
    "lower": (1, 1),
    "upper": (1, 1),
    "concat": (1, 99),
    "coalesce": (1, 99),
    "greatest": (2, 99),
    "least": (2, 99),
    "time_bucket": (2, 2),
}
MESSAGE_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass
class Relation:
    """A stream (base or derived) or a reference table, as the checker knows it."""

    name: str
    kind: str  # "stream" or "table"
    columns: dict[str, str]
    timestamp: str | None
    statement: ast.Statement
    slack_ms: int = 0
    topic: str | None = None
    source_idle_ms: int | None = None
    """PER SOURCE: each source's own clock, idle after this long; None: one clock."""


@dataclass
class Aggregate:
    """A user-defined aggregate declared with CREATE AGGREGATE."""

    name: str
    params: tuple[str, ...]
    returns: str
    cls: type[WindowAggregate] | None
    algebraic: bool
    statement: ast.CreateAggregate

    @property
    def blocking(self) -> bool:
        """ESL §3: a UDA with a TERMINATE state is blocking (needs a window on a stream)."""
        return self.cls is None or _overrides(self.cls, "terminate")


@dataclass
class AggUse:
    """One aggregate call in a SELECT block and the alias its value travels under."""

    call: ast.Call
    alias: str
    uda: Aggregate | None


@dataclass
class SelectInfo:
    """What the checker learned about one SELECT block."""

    select: ast.Select
    stream: Relation | None = None
    tables: list[Relation] = field(default_factory=list)
    window: ast.WindowSpec | None = None
    aggregates: list[AggUse] = field(default_factory=list)
    outputs: list[tuple[str, str, ast.Expr]] = field(default_factory=list)
    timestamp: str | None = None
    scope: list[tuple[ast.SourceRef, Relation]] = field(default_factory=list)
    """The FROM items the block's expressions may read (an alert's RESOLVE WHEN too)."""
    match: ast.MatchRecognize | None = None
    """The stream's MATCH_RECOGNIZE: the block's expressions read its rows instead."""


@dataclass
class QueryInfo:
    """A checked CREATE STREAM ... AS or CREATE ALERT statement."""

    statement: ast.CreateDerived | ast.CreateAlert
    selects: list[SelectInfo]


@dataclass
class Catalog:
    """Everything declared by a set of rule files."""

    relations: dict[str, Relation] = field(default_factory=dict)
    aggregates: dict[str, Aggregate] = field(default_factory=dict)
    alerts: dict[str, ast.CreateAlert] = field(default_factory=dict)
    queries: list[QueryInfo] = field(default_factory=list)


def _overrides(cls: type, method: str) -> bool:
    """Whether `cls` defines `method` below the engine's base classes."""
    for klass in cls.__mro__:
        if klass in (WindowAggregate, IncrementalAggregate, object):
            return False
        if method in vars(klass):
            return True
    return False


def describe(spec: ast.WindowSpec) -> str:
    return {
        "rows": "ROWS",
        "partition_rows": "PARTITION BY ... ROWS",
        "range": "RANGE",
        "unbounded": "UNBOUNDED",
        "now": "NOW",
        "since": "SINCE",
        "until": "UNTIL",
        "band": "BETWEEN ... AND ...",
    }[spec.kind]


class Checker:
    """Checks statements from several files against one shared catalog."""

    def __init__(self, texts: dict[str, str], access: Access) -> None:
        self.texts = texts
        self.access = access
        self.errors: list[RuleError] = []
        self.catalog = Catalog()
        # Top-level name (lower case) -> the statement declaring it first in file order.
        self._first: dict[str, ast.Statement] = {}
        self._relations: set[str] = set()  # names declared as streams or tables
        # Derived streams whose definition is in error (an unknown input or output
        # column): their columns and timestamp are unsure, so readers are not told.
        self.unresolved: set[str] = set()

    # -- reporting
    def error(self, file: str, pos: Pos, message: str) -> None:
        """Record one located error."""
        self.errors.append(make_error(file, self.texts.get(file, ""), pos, message))

    def _claim(self, stmt: ast.Statement, what: str) -> bool:
        """Register a top-level name; report a duplicate (names are case-insensitive).
        Of two statements declaring one name, the first in file order keeps it."""
        file, ident = stmt.file, stmt.name
        key = ident.name.lower()
        if key in BUILTINS and what == "aggregate":
            self.error(
                file, ident.pos, f"duplicate name '{ident.name}': it is a built-in aggregate"
            )
            return False
        first = self._first[key]
        if first is not stmt:
            where = f"{first.file}:{first.name.pos.line}:{first.name.pos.col}"
            self.error(
                file, ident.pos, f"duplicate name '{ident.name}': already defined at {where}"
            )
            return False
        return True

    def _type(self, file: str, ident: ast.Ident) -> str | None:
        resolved = TYPE_ALIASES.get(ident.name.upper())
        if resolved is None:
            self.error(
                file,
                ident.pos,
                f"unknown type '{ident.name}'; use one of INT, BIGINT, "
                "DOUBLE, STRING, BOOLEAN or TIMESTAMP",
            )
        return resolved

    def _columns(self, file: str, defs: tuple[ast.ColumnDef, ...]) -> dict[str, str]:
        columns: dict[str, str] = {}
        for col in defs:
            typ = self._type(file, col.type)
            if col.name.name in columns:
                self.error(file, col.name.pos, f"duplicate column '{col.name.name}'")
            else:
                columns[col.name.name] = typ or UNKNOWN
        return columns

    # -- statements
    def check(self, statements: list[ast.Statement]) -> Catalog:
        """Check all statements (given in file order), each after what it reads, and
        return the catalog they declare."""
        for stmt in statements:
            self._first.setdefault(stmt.name.name.lower(), stmt)
            if isinstance(stmt, ast.CreateStream | ast.CreateDerived | ast.CreateTable):
                self._relations.add(stmt.name.name.lower())
        for stmt in dependency_order(statements, self._first):
            if isinstance(stmt, ast.CreateStream):
                self._create_stream(stmt)
            elif isinstance(stmt, ast.CreateTable):
                self._create_table(stmt)
            elif isinstance(stmt, ast.CreateAggregate):
                self._create_aggregate(stmt)
            else:
                self._create_query(stmt)
        return self.catalog

    def _create_stream(self, stmt: ast.CreateStream) -> None:
        columns = self._columns(stmt.file, stmt.columns)
        for col in stmt.columns:
            if col.name.name.lower() in READING_COLUMNS:
                self.error(
                    stmt.file,
                    col.name.pos,
                    f"column '{col.name.name}' is reserved: every reading carries "
                    f"{', '.join(READING_COLUMNS)} beside its stream's columns; name it "
                    "otherwise",
                )
        ts = stmt.order_by.name
        if ts not in columns:
            self.error(
                stmt.file,
                stmt.order_by.pos,
                f"unknown column '{ts}': ORDER BY must name a TIMESTAMP column of "
                f"'{stmt.name.name}'",
            )
        elif columns[ts] != "TIMESTAMP":
            self.error(
                stmt.file,
                stmt.order_by.pos,
                f"type mismatch: ORDER BY column '{ts}' is {columns[ts]}, not TIMESTAMP",
            )
        idle = stmt.idle_ms
        if idle is not None and stmt.idle_pos is not None:
            if stmt.per_source is None:
                self.error(
                    stmt.file,
                    stmt.idle_pos,
                    "IDLE needs PER SOURCE: only a stream whose sources keep clocks of "
                    "their own has idle sources (SLACK 2 SECONDS PER SOURCE IDLE 1 MINUTE)",
                )
            elif idle <= 0:
                self.error(
                    stmt.file,
                    stmt.idle_pos,
                    "IDLE must be positive: a source is idle once another has been heard "
                    "over this much of its event time without it",
                )
        source_idle = None
        if stmt.per_source is not None:
            source_idle = DEFAULT_SOURCE_IDLE_MS if idle is None else idle
        if self._claim(stmt, "stream"):
            self.catalog.relations[stmt.name.name] = Relation(
                stmt.name.name,
                "stream",
                columns,
                ts,
                stmt,
                stmt.slack_ms,
                stmt.source,
                source_idle,
            )

    def _create_table(self, stmt: ast.CreateTable) -> None:
        columns = self._columns(stmt.file, stmt.columns)
        if self._claim(stmt, "table"):
            self.catalog.relations[stmt.name.name] = Relation(
                stmt.name.name, "table", columns, None, stmt
            )

    def _create_aggregate(self, stmt: ast.CreateAggregate) -> None:
        params = tuple(self._type(stmt.file, p.type) or "STRING" for p in stmt.params)
        returns = self._type(stmt.file, stmt.returns) or "STRING"
        cls = self._import_uda(stmt)
        if (
            stmt.algebraic
            and cls is not None
            and not (issubclass(cls, IncrementalAggregate) and _overrides(cls, "merge"))
        ):
            self.error(
                stmt.file,
                stmt.target_pos,
                f"'{stmt.target}' is declared ALGEBRAIC but has no merge: an algebraic "
                "aggregate is an IncrementalAggregate whose partials merge (ESL §5.1)",
            )
        if self._claim(stmt, "aggregate"):
            self.catalog.aggregates[stmt.name.name.lower()] = Aggregate(
                stmt.name.name, params, returns, cls, stmt.algebraic, stmt
            )

    def _import_uda(self, stmt: ast.CreateAggregate) -> type[WindowAggregate] | None:
        """Import 'module:Class' (a module import, never eval) and check its states."""
        file, pos, target = stmt.file, stmt.target_pos, stmt.target
        module_name, sep, class_name = target.partition(":")
        if not sep or not module_name or not class_name:
            self.error(file, pos, f"'{target}' is not of the form 'module:Class'")
            return None
        try:
            self.access.check_module(module_name)
        except AccessError as exc:
            self.error(file, pos, f"cannot import Python aggregate '{target}': {exc}")
            return None
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # any failure while importing user code is a rule error
            self.error(file, pos, f"cannot import Python aggregate '{target}': {exc}")
            return None
        cls = getattr(module, class_name, None)
        if not isinstance(cls, type):
            self.error(
                file,
                pos,
                f"cannot import Python aggregate '{target}': module "
                f"'{module_name}' has no class '{class_name}'",
            )
            return None
        if not issubclass(cls, WindowAggregate):
            self.error(
                file,
                pos,
                f"Python aggregate '{target}' must subclass engine.core.aggregates.WindowAggregate",
            )
            return None
        needed: tuple[str, ...]
        if issubclass(cls, IncrementalAggregate):
            needed = ("accumulate", "retract", "get_value")
        else:
            needed = ("iterate",)
        missing = [m for m in needed if not _overrides(cls, m)]
        if missing:
            self.error(
                file,
                pos,
                f"Python aggregate '{target}' lacks the "
                f"{' and '.join(missing)} state"
                f"{'s' if len(missing) > 1 else ''} (ESL: initialize, "
                "iterate, expire, terminate)",
            )
            return None
        return cls

    def _create_query(self, stmt: ast.CreateDerived | ast.CreateAlert) -> None:
        selects = [self._select(stmt, sel) for sel in stmt.query.selects]
        if len(selects) > 1:
            self._union(stmt.file, selects)
        first = selects[0]
        if isinstance(stmt, ast.CreateAlert) and stmt.message is not None:
            self._message(stmt, {name for name, _, _ in first.outputs})
        if isinstance(stmt, ast.CreateAlert):
            self._incidents(stmt, selects)
        if not self._claim(stmt, "stream"):
            return
        self.catalog.queries.append(QueryInfo(stmt, selects))
        # An unknown input, or an output column in error (perhaps the misspelled
        # timestamp): whether the stream has an event time is unknown, so readers are
        # not told it has none.
        if any(
            sel.stream is None or any(typ == UNKNOWN for _, typ, _ in sel.outputs)
            for sel in selects
        ):
            self.unresolved.add(stmt.name.name)
        if isinstance(stmt, ast.CreateAlert):
            self.catalog.alerts[stmt.name.name] = stmt
        else:
            self.catalog.relations[stmt.name.name] = Relation(
                stmt.name.name,
                "stream",
                {n: t for n, t, _ in first.outputs},
                _union_timestamp(selects),
                stmt,
            )

    def _union(self, file: str, selects: list[SelectInfo]) -> None:
        first = selects[0]
        for other in selects[1:]:
            if len(other.outputs) != len(first.outputs):
                self.error(
                    file,
                    other.select.pos,
                    f"UNION ALL branches must have the same number of columns: "
                    f"{len(first.outputs)} and {len(other.outputs)}",
                )
                continue
            for (name, a, _), (other_name, b, expr) in zip(
                first.outputs, other.outputs, strict=True
            ):
                if not _compatible(a, b):
                    self.error(
                        file,
                        expr_pos(expr),
                        f"type mismatch: column '{name}' is {a} in the first branch "
                        f"of UNION ALL and {b} here",
                    )
                elif name == first.timestamp and other_name != other.timestamp:
                    # The union's rows are merged by event time, so the column that
                    # carries it must carry it in every branch.
                    self.error(
                        file,
                        expr_pos(expr),
                        f"column '{name}' is the event time of the first branch of UNION "
                        f"ALL, so here it must be this branch's timestamp column"
                        + (f" '{other.timestamp}'" if other.timestamp else ""),
                    )

    def _incidents(self, stmt: ast.CreateAlert, selects: list[SelectInfo]) -> None:
        """The incident clauses: RESOLVE WHEN is a condition on the alert's input rows;
        an alert whose rows are not its input rows (a window, aggregates, a union) must
        say how its incidents resolve."""
        clauses, first = stmt.incidents, selects[0]
        where = clauses.resolve_pos or stmt.name.pos
        if clauses.resolve_when is not None:
            if len(selects) > 1:
                self.error(
                    stmt.file,
                    where,
                    "RESOLVE WHEN reads the alert's input rows, and a UNION ALL has several "
                    "inputs: use RESOLVE AFTER a quiet interval",
                )
            elif first.stream is not None:
                ctx = _Ctx(self, stmt.file, first.scope, pseudo=False)
                ctx.clause = "RESOLVE WHEN"
                ctx.expect_boolean(clauses.resolve_when, "RESOLVE WHEN")
        elif clauses.resolve_after_ms is not None:
            if clauses.resolve_after_ms <= 0:
                self.error(stmt.file, where, "RESOLVE AFTER needs a positive duration")
        elif len(selects) > 1:
            self.error(
                stmt.file,
                where,
                f"alert '{stmt.name.name}' reports from a UNION ALL of several inputs: say "
                "how its incidents resolve (RESOLVE AFTER a quiet interval)",
            )
        elif first.window is not None or first.aggregates or first.match is not None:
            self.error(
                stmt.file,
                where,
                f"alert '{stmt.name.name}' reports from a window, so a row its WHERE drops "
                "does not mean its condition stopped: say how its incidents resolve "
                "(RESOLVE WHEN condition on its input rows, or RESOLVE AFTER a quiet "
                "interval)",
            )

    def _message(self, stmt: ast.CreateAlert, columns: set[str]) -> None:
        assert stmt.message is not None and stmt.message_pos is not None
        for match in MESSAGE_FIELD.finditer(stmt.message):
            if match.group(1) not in columns:
                # +1 for the opening quote; assumes the message is on one line.
                pos = Pos(stmt.message_pos.line, stmt.message_pos.col + 1 + match.start())
                self.error(
                    stmt.file,
                    pos,
                    f"unknown column '{match.group(1)}' in MESSAGE; the alert's "
                    f"columns are {', '.join(sorted(columns))}",
                )

    # -- SELECT
    def _select(self, stmt: ast.CreateDerived | ast.CreateAlert, sel: ast.Select) -> SelectInfo:
        file = stmt.file
        info = SelectInfo(sel)
        scope: list[tuple[ast.SourceRef, Relation]] = []
        for src in sel.sources:
            rel = self.catalog.relations.get(src.name.name)
            if rel is None and src.name.name.lower() in self._relations:
                self.error(file, src.name.pos, self._cycle(stmt, src.name.name))
                continue
            if rel is None:
                self.error(
                    file,
                    src.name.pos,
                    f"unknown stream '{src.name.name}'" + self._known("stream or table"),
                )
                continue
            scope.append((src, rel))
            if rel.kind == "stream":
                if info.stream is not None:
                    self.error(
                        file,
                        src.name.pos,
                        f"this query reads two streams ('{info.stream.name}' and "
                        f"'{rel.name}'); a stream can only be joined with reference "
                        "tables (CREATE TABLE)",
                    )
                info.stream = rel
                info.window = src.window
                info.match = src.match
                if rel.timestamp is None and rel.name not in self.unresolved:
                    # Replay could feed it at its emission instants, but its table keeps
                    # none: live and replay would disagree, so nobody reads it.
                    self.error(
                        file,
                        src.name.pos,
                        f"stream '{rel.name}' has no timestamp column, so no rule can read "
                        "it (the live runtime orders and windows a stream by its "
                        "timestamp); select its timestamp where it is derived",
                    )
            else:
                info.tables.append(rel)
                if src.window is not None:
                    self.error(
                        file,
                        src.window.pos,
                        f"'{rel.name}' is a table, and only streams can have a window",
                    )
        if info.stream is None and scope:
            self.error(
                file, sel.sources[0].name.pos, "a query must read a stream; FROM names only tables"
            )
        if info.window is not None and info.stream is not None:
            self._window(file, info.window, info.stream)
        pseudo = info.window is not None and info.window.kind in ("range", "now")

        info.scope = scope
        ctx = _Ctx(self, file, scope, pseudo)
        if info.match is not None and info.stream is not None:
            # The block reads the matches' rows; RESOLVE WHEN still reads the stream's.
            matches = self._match(file, info.match, info.stream)
            ctx = _Ctx(self, file, [(sel.sources[0], matches)], pseudo)
            self._match_select(file, info)
        for src, on in zip(sel.sources, sel.joins, strict=True):
            if on is not None:
                ctx.clause = f"the ON condition of '{src.name.name}'"
                ctx.expect_boolean(on, ctx.clause)
        if sel.where is not None:
            ctx.clause = "WHERE"
            ctx.expect_boolean(sel.where, "WHERE")
        ctx.clause = "GROUP BY"
        for key in sel.group_by:
            if not isinstance(key, ast.Column):
                self.error(file, expr_pos(key), "GROUP BY takes column names")
            else:
                ctx.type_of(key)

        ctx.clause = None  # aggregates are allowed from here on: SELECT list and HAVING
        self._outputs(file, info, ctx)
        if sel.having is not None:
            if not sel.group_by and info.window is None:
                self.error(file, expr_pos(sel.having), "HAVING needs GROUP BY or a window in FROM")
            ctx.expect_boolean(sel.having, "HAVING")
        info.aggregates = ctx.aggregates
        self._aggregate_rules(file, info)
        if sel.r2s is not None and info.window is not None and not _stamped_at_own_time(info):
            info.timestamp = None  # rows are (re)emitted at other instants than their time
        return info

    def _match(self, file: str, match: ast.MatchRecognize, stream: Relation) -> Relation:
        """Check a MATCH_RECOGNIZE over ``stream``; return the relation of its rows: the
        partition columns, the measures and the stream's timestamp column."""
        if match.order_by.name != stream.timestamp:
            self.error(
                file,
                match.order_by.pos,
                f"MATCH_RECOGNIZE orders rows by the stream's timestamp: ORDER BY "
                f"{stream.timestamp}",
            )
        columns: dict[str, str] = {}
        for key in match.partition:
            if key.name not in stream.columns:
                self.error(file, key.pos, f"unknown column '{key.name}' in PARTITION BY")
            columns[key.name] = stream.columns.get(key.name, UNKNOWN)
        self._pattern(file, match)
        variables = {v.name for v in pattern_variables(match.pattern)}
        scope = [(ast.SourceRef(ast.Ident(stream.name, match.pos), None, None), stream)]
        defined: set[str] = set()
        for var, condition in match.defines:
            if var.name not in variables:
                self.error(file, var.pos, f"DEFINE of '{var.name}', which is not in PATTERN")
            elif var.name in defined:
                self.error(file, var.pos, f"'{var.name}' is defined twice")
            defined.add(var.name)
            reads = self._reads(file, condition, variables, final=False)
            ctx = _Ctx(self, file, scope, pseudo=False)
            ctx.clause = "DEFINE"
            ctx.expect_boolean(reads, f"DEFINE {var.name}")
        assert stream.timestamp is not None  # a stream without one is refused before
        for expr, name in match.measures:
            reads = self._reads(file, expr, variables, final=True)
            ctx = _Ctx(self, file, scope, pseudo=False)
            ctx.clause = "MEASURES"
            typ = ctx.type_of(reads) or UNKNOWN
            if name.name in columns or name.name == stream.timestamp:
                self.error(file, name.pos, f"duplicate column name '{name.name}' in MEASURES")
            columns[name.name] = typ
        columns[stream.timestamp] = "TIMESTAMP"
        return Relation(stream.name, "stream", columns, stream.timestamp, stream.statement)

    def _reads(self, file: str, expr: ast.Expr, variables: set[str], final: bool) -> ast.Expr:
        """``expr`` with its reads of the match typed (and their errors reported)."""
        reads = match_reads(expr, variables, final)
        for problem in reads.errors:
            self.error(file, problem.pos, problem.message)
        return reads.typed

    def _pattern(self, file: str, match: ast.MatchRecognize) -> None:
        """A pattern the matcher can run: every match has rows, every quantifier has
        sensible bounds, and a match's length is bounded, in rows or by WITHIN."""
        pattern = match.pattern
        if matches_empty(pattern):
            self.error(file, pattern.pos, "this pattern can match no rows at all")
        stack: list[ast.PatternNode] = [pattern]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.PatternRepeat):
                if node.high is not None and (node.high < node.low or node.high == 0):
                    self.error(file, node.pos, "a quantifier {n,m} needs 0 <= n <= m and m >= 1")
                if matches_empty(node.item):
                    self.error(file, node.pos, "a quantified part of the pattern must match a row")
                stack.append(node.item)
            elif isinstance(node, ast.PatternSeq):
                stack.extend(node.items)
            elif isinstance(node, ast.PatternAlt):
                stack.extend(node.options)
        if pattern_size(pattern) > 1000:
            self.error(
                file, pattern.pos, "this pattern is too large (bounds of at most ~1000 rows)"
            )
        if match.within_ms is not None and match.within_ms <= 0:
            self.error(file, match.pos, "WITHIN must be positive")
        if match.within_ms is None and unbounded(pattern):
            self.error(
                file,
                pattern.pos,
                "a pattern with * + or {n,} needs WITHIN d: without it a partial match "
                "could grow without bound",
            )

    def _match_select(self, file: str, info: SelectInfo) -> None:
        """What a SELECT over MATCH_RECOGNIZE cannot have yet."""
        sel = info.select
        if sel.r2s is not None:
            self.error(file, sel.pos, f"MATCH_RECOGNIZE's rows are a stream: no {sel.r2s}")
        if sel.group_by:
            self.error(
                file,
                expr_pos(sel.group_by[0]),
                "GROUP BY over MATCH_RECOGNIZE: aggregate in a stream derived from this one",
            )
        if len(sel.sources) > 1:
            self.error(
                file, sel.sources[1].name.pos, "a join next to MATCH_RECOGNIZE is not supported"
            )

    def _cycle(self, stmt: ast.Statement, read: str) -> str:
        """The error of `stmt` reading `read`, a stream not checked yet because it reads,
        directly or through other streams, what `stmt` defines: every statement of the
        cycle, as file:line:col."""
        chain = cycle_path(self._first[read.lower()], stmt, self._first)
        links = [stmt, *chain]
        steps = ", which reads ".join(
            f"'{s.name.name}' ({s.file}:{s.name.pos.line}:{s.name.pos.col})" for s in links
        )
        return f"a cycle: {steps}, which reads '{stmt.name.name}'"

    def _known(self, what: str) -> str:
        names = sorted(self.catalog.relations)
        return f"; known {what}s: {', '.join(names)}" if names else f" (no {what} is defined)"

    def _outputs(self, file: str, info: SelectInfo, ctx: _Ctx) -> None:
        seen: set[str] = set()
        for item in info.select.items:
            if item.expr is None:  # SELECT *: every column of every source, stream first
                for _, rel in sorted(ctx.scope, key=lambda sr: sr[1].kind != "stream"):
                    for name, typ in rel.columns.items():
                        self._output(
                            file, info, seen, name, typ, ast.Column(name, None, item.pos), item.pos
                        )
                continue
            typ = ctx.type_of(item.expr) or UNKNOWN
            if item.alias is not None:
                name = item.alias.name
            elif isinstance(item.expr, ast.Column):
                name = item.expr.name
            else:
                self.error(file, item.pos, "name this column with AS (e.g. ... AS avg_speed)")
                continue
            self._output(
                file, info, seen, name, typ, item.expr, item.alias.pos if item.alias else item.pos
            )

    def _output(
        self,
        file: str,
        info: SelectInfo,
        seen: set[str],
        name: str,
        typ: str,
        expr: ast.Expr,
        pos: Pos,
    ) -> None:
        if name in seen:
            self.error(file, pos, f"duplicate column name '{name}' in the SELECT list")
            return
        seen.add(name)
        info.outputs.append((name, typ, expr))
        # The output carries the event time if it is the input's timestamp column
        # (or the end of a domain window's extent).
        if (
            isinstance(expr, ast.Column)
            and info.timestamp is None
            and (
                (info.stream is not None and expr.name == info.stream.timestamp)
                or (expr.name == "window_end" and info.window is not None)
            )
        ):
            info.timestamp = name

    def _aggregate_rules(self, file: str, info: SelectInfo) -> None:
        """Windows and blocking (ESL §3): aggregates need a window on a stream."""
        overs = [use.call.over for use in info.aggregates if use.call.over is not None]
        if overs and info.window is not None:
            self.error(
                file, overs[0].pos, "a query has either a window in FROM or OVER windows, not both"
            )
        if overs and info.select.group_by:
            self.error(
                file,
                expr_pos(info.select.group_by[0]),
                "GROUP BY cannot be combined with OVER windows; use PARTITION BY",
            )
        if len({window_key(spec) for spec in overs}) > 1:
            for spec in overs:
                if spec.slide_rows or spec.slide_ms or spec.active_expiration:
                    # Which tuples have outputs (a slide's yield tuples, an expiration's
                    # instants) is one window's choice, not the SELECT's.
                    self.error(
                        file,
                        spec.modifier_pos or spec.pos,
                        "a SELECT with several OVER windows cannot SLIDE or use ACTIVE "
                        "EXPIRATION; compute this aggregate in a stream of its own",
                    )
        if info.stream is not None:
            for spec in overs:
                self._window(file, spec, info.stream)
        for use in info.aggregates:
            self._aggregate_use(file, info, use)
        if info.window is not None and (info.aggregates or info.select.group_by):
            self._grouping(file, info)

    def _aggregate_use(self, file: str, info: SelectInfo, use: AggUse) -> None:
        call, spec = use.call, use.call.over or info.window
        blocking = use.uda.blocking if use.uda is not None else True
        if spec is None and info.stream is not None and blocking:
            stream = info.stream.name
            self.error(
                file,
                call.pos,
                f"'{call.name}' is a blocking aggregate and '{stream}' is an unbounded "
                f"stream: give it a window, e.g. {call.name}(...) OVER (RANGE 5 "
                f"MINUTES PRECEDING) or FROM {stream} [RANGE 5 MINUTES] (ESL §3)",
            )
        if (
            spec is not None
            and spec.active_expiration
            and use.uda is not None
            and use.uda.cls is not None
            and not _overrides(use.uda.cls, "expire")
            and not issubclass(use.uda.cls, IncrementalAggregate)
        ):
            self.error(
                file,
                call.pos,
                f"'{call.name}' is used with ACTIVE EXPIRATION but its Python class "
                f"lacks the expire state, so expiring tuples cannot emit",
            )

    def _grouping(self, file: str, info: SelectInfo) -> None:
        """With a domain window, plain output columns must be grouped (or the extent)."""
        keys = {k.name for k in info.select.group_by if isinstance(k, ast.Column)}
        for name, _, expr in info.outputs:
            for col in plain_columns(expr):
                if col.name not in keys and col.name not in PSEUDO_COLUMNS:
                    self.error(
                        file,
                        col.pos,
                        f"column '{col.name}' must appear in GROUP BY or inside an "
                        f"aggregate (output column '{name}')",
                    )

    def _window(self, file: str, spec: ast.WindowSpec, stream: Relation) -> None:
        """A window the stream can have, with sensible sizes."""
        # `ROWS 0 PRECEDING` is the current row alone; a CQL `[ROWS 0]` is empty.
        rows = spec.rows if spec.origin == "from" else None
        for value, what in (
            (rows, "ROWS"),
            (spec.range_ms, "RANGE"),
            (spec.slide_rows, "SLIDE"),
            (spec.slide_ms, "SLIDE"),
            (spec.reset_ms, "RESET EVERY"),
        ):
            if value is not None and value <= 0:
                self.error(file, spec.pos, f"{what} must be positive")
        if spec.active_expiration and spec.kind != "range":
            self.error(
                file,
                spec.modifier_pos or spec.pos,
                f"ACTIVE EXPIRATION needs a time-based window (RANGE t PRECEDING), not "
                f"{describe(spec)}: only tuples of a logical window expire on their "
                "own (ESL §5.2)",
            )
        if (
            spec.kind == "band"
            and spec.lower_ms is not None
            and spec.upper_ms is not None
            and spec.lower_ms >= spec.upper_ms
        ):
            self.error(file, spec.pos, "the band's lower bound must be before its upper bound")
        cols = stream.columns
        for key in spec.partition:
            if key.name not in cols:
                self.error(
                    file,
                    key.pos,
                    f"unknown column '{key.name}' in PARTITION BY; "
                    f"'{stream.name}' has {', '.join(cols)}",
                )


def _stamped_at_own_time(info: SelectInfo) -> bool:
    """Under ISTREAM / DSTREAM / RSTREAM over a window in FROM, whether every row is
    emitted at the instant its event-time column (the input's timestamp, or
    ``window_end``) says, so that the column can stay the derived stream's event time.
    Tuples of a raw relation enter at their own time except under a lag or an extent
    slide, and ISTREAM emits them only then (RSTREAM too for ``[NOW]``); an extent's row
    enters R at its ``window_end``. DSTREAM emits rows when they leave, RSTREAM repeats
    them, and a ``[RANGE r]`` group's row also changes when a tuple leaves."""
    spec, r2s = info.window, info.select.r2s
    assert spec is not None
    raw = not info.aggregates and not info.select.group_by
    if raw:
        own_time = spec.kind != "range" or (spec.slide_ms is None and spec.lag_ms is None)
        return (r2s == "ISTREAM" and own_time) or (r2s == "RSTREAM" and spec.kind == "now")
    if r2s == "DSTREAM":
        return False
    return not (spec.kind == "range" and spec.slide_ms is None)


def _union_timestamp(selects: list[SelectInfo]) -> str | None:
    """The derived stream's timestamp column: the first branch's, if every branch
    carries its own event time in that position (`_union` reports those that do not)."""
    names = [[name for name, _, _ in s.outputs] for s in selects]
    first = selects[0].timestamp
    if first is None:
        return None
    index = names[0].index(first)
    for sel, cols in zip(selects, names, strict=True):
        if len(cols) <= index or cols[index] != sel.timestamp:
            return None
    return first


def window_key(spec: ast.WindowSpec) -> tuple[object, ...]:
    """A window's meaning, without positions."""
    return (
        spec.kind,
        tuple(p.name for p in spec.partition),
        spec.rows,
        spec.range_ms,
        spec.slide_rows,
        spec.slide_ms,
        spec.lag_ms,
        spec.reset_ms,
        spec.lower_ms,
        spec.upper_ms,
        spec.active_expiration,
    )


def plain_columns(expr: ast.Expr | None) -> Iterator[ast.Column]:
    """Column references outside aggregate calls (any call but a scalar function's:
    built-in and Python aggregates alike)."""
    if expr is None:
        return
    if isinstance(expr, ast.Column):
        yield expr
    elif isinstance(expr, ast.Call):
        if expr.name not in SCALARS or expr.over is not None:
            return
        for arg in expr.args:
            yield from plain_columns(arg)
    elif isinstance(expr, ast.Unary | ast.IsNull):
        yield from plain_columns(expr.operand)
    elif isinstance(expr, ast.Binary):
        yield from plain_columns(expr.left)
        yield from plain_columns(expr.right)
    elif isinstance(expr, ast.InList):
        yield from plain_columns(expr.operand)
        for item in expr.items:
            yield from plain_columns(item)
    elif isinstance(expr, ast.Case):
        for cond, value in expr.whens:
            yield from plain_columns(cond)
            yield from plain_columns(value)
        yield from plain_columns(expr.otherwise)


def expr_pos(expr: ast.Expr) -> Pos:
    """Where an expression starts (a binary node's pos is its operator)."""
    while isinstance(expr, ast.Binary):
        expr = expr.left
    if isinstance(expr, ast.IsNull | ast.InList):
        return expr_pos(expr.operand)
    return expr.pos


def _compatible(a: str, b: str) -> bool:
    return a == b or "NULL" in (a, b) or UNKNOWN in (a, b) or (a in NUMERIC and b in NUMERIC)


def _known_type(typ: str) -> str | None:
    """A column's type for typing what reads it; None (nothing more to report) for a
    column whose own definition was in error."""
    return None if typ == UNKNOWN else typ


def _numeric_result(a: str, b: str) -> str:
    if "DOUBLE" in (a, b):
        return "DOUBLE"
    return "BIGINT" if "BIGINT" in (a, b) else "INT"


class _Ctx:
    """Expression typing within one SELECT's scope."""

    def __init__(
        self, checker: Checker, file: str, scope: list[tuple[ast.SourceRef, Relation]], pseudo: bool
    ) -> None:
        self.checker = checker
        self.file = file
        self.scope = scope
        self.pseudo = pseudo
        # The clause being typed while aggregates are not allowed there; None in SELECT
        # and HAVING, where they are.
        self.clause: str | None = "FROM"
        self.aggregates: list[AggUse] = []
        self._in_aggregate = False

    def err(self, pos: Pos, message: str) -> None:
        self.checker.error(self.file, pos, message)

    def expect_boolean(self, expr: ast.Expr, where: str) -> None:
        typ = self.type_of(expr)
        if typ is not None and typ not in ("BOOLEAN", "NULL"):
            self.err(
                expr_pos(expr),
                f"type mismatch: {where} needs a true/false condition, not a {typ} value",
            )

    def type_of(self, expr: ast.Expr) -> str | None:
        """The type of `expr`, or None after reporting an error inside it."""
        if isinstance(expr, ast.Literal):
            return expr.type
        if isinstance(expr, ast.Column):
            return self._column(expr)
        if isinstance(expr, ast.Unary):
            return self._unary(expr)
        if isinstance(expr, ast.Binary):
            return self._binary(expr)
        if isinstance(expr, ast.IsNull):
            self.type_of(expr.operand)
            return "BOOLEAN"
        if isinstance(expr, ast.InList):
            left = self.type_of(expr.operand)
            for item in expr.items:
                right = self.type_of(item)
                if left and right and not _compatible(left, right):
                    self.err(
                        item.pos,
                        f"type mismatch: IN list item is {right}, but the value tested is {left}",
                    )
            return "BOOLEAN"
        if isinstance(expr, ast.Case):
            return self._case(expr)
        return self._call(expr)

    def _column(self, col: ast.Column) -> str | None:
        if col.qualifier is not None:
            for src, rel in self.scope:
                if src.label == col.qualifier:
                    if col.name in rel.columns:
                        return _known_type(rel.columns[col.name])
                    self.err(
                        col.pos,
                        f"unknown column '{col.name}' in '{rel.name}'; it has "
                        f"{', '.join(rel.columns)}",
                    )
                    return None
            self.err(col.pos, f"unknown stream '{col.qualifier}' (not named in FROM)")
            return None
        found = [(src, rel) for src, rel in self.scope if col.name in rel.columns]
        if len(found) > 1:
            self.err(
                col.pos,
                f"ambiguous column '{col.name}': it is in "
                f"{' and '.join(s.label for s, _ in found)}; qualify it "
                f"(e.g. {found[0][0].label}.{col.name})",
            )
            return None
        if found:
            return _known_type(found[0][1].columns[col.name])
        if col.name in PSEUDO_COLUMNS and self.pseudo:
            return "TIMESTAMP"
        if not self.scope:
            return None  # FROM already reported
        if any(rel.name in self.checker.unresolved for _, rel in self.scope):
            return None  # its columns are unsure: the error is where it is defined
        names = ", ".join(f"'{rel.name}'" for _, rel in self.scope)
        have = ", ".join(c for _, rel in self.scope for c in rel.columns)
        hint = (
            " (window_start/window_end need a FROM s [RANGE r SLIDE s] window)"
            if col.name in PSEUDO_COLUMNS
            else ""
        )
        self.err(col.pos, f"unknown column '{col.name}' in {names}; known columns: {have}{hint}")
        return None

    def _unary(self, expr: ast.Unary) -> str | None:
        typ = self.type_of(expr.operand)
        if typ is None:
            return None
        if expr.op == "NOT":
            if typ not in ("BOOLEAN", "NULL"):
                self.err(expr.pos, f"type mismatch: NOT needs a true/false value, not {typ}")
            return "BOOLEAN"
        if typ not in NUMERIC and typ not in ("INTERVAL", "NULL"):
            self.err(expr.pos, f"type mismatch: '-' needs a number, not {typ}")
            return None
        return typ

    def _binary(self, expr: ast.Binary) -> str | None:
        left, right = self.type_of(expr.left), self.type_of(expr.right)
        if left is None or right is None:
            return "BOOLEAN" if expr.op in ("AND", "OR", "=", "<>", "<", "<=", ">", ">=") else None
        op = expr.op
        if op in ("AND", "OR"):
            for side, typ in ((expr.left, left), (expr.right, right)):
                if typ not in ("BOOLEAN", "NULL"):
                    self.err(
                        expr_pos(side), f"type mismatch: {op} needs true/false values, not {typ}"
                    )
            return "BOOLEAN"
        if op in ("=", "<>", "<", "<=", ">", ">="):
            if not _compatible(left, right):
                self.err(expr.pos, f"type mismatch: cannot compare {left} with {right}")
            return "BOOLEAN"
        # arithmetic
        if left in NUMERIC and right in NUMERIC:
            return "DOUBLE" if op == "/" else _numeric_result(left, right)
        if "NULL" in (left, right):
            return right if left == "NULL" else left
        if op in ("+", "-") and left == "TIMESTAMP" and right == "INTERVAL":
            return "TIMESTAMP"
        if op == "+" and left == "INTERVAL" and right == "TIMESTAMP":
            return "TIMESTAMP"
        if op == "-" and left == right == "TIMESTAMP":
            return "INTERVAL"
        if op in ("+", "-") and left == right == "INTERVAL":
            return "INTERVAL"
        self.err(expr.pos, f"type mismatch: '{op}' cannot combine {left} and {right}")
        return None

    def _case(self, expr: ast.Case) -> str | None:
        result: str | None = None
        values = [v for _, v in expr.whens] + ([expr.otherwise] if expr.otherwise else [])
        for cond, _ in expr.whens:
            self.expect_boolean(cond, "WHEN")
        for value in values:
            typ = self.type_of(value)
            if typ is None or typ == "NULL":
                continue
            if result is None:
                result = typ
            elif not _compatible(result, typ):
                self.err(expr_pos(value), f"type mismatch: CASE branches give {result} and {typ}")
            elif result in NUMERIC and typ in NUMERIC:
                result = _numeric_result(result, typ)
        return result or "NULL"

    def _call(self, call: ast.Call) -> str | None:
        name = call.name
        uda = self.checker.catalog.aggregates.get(name)
        if name in BUILTINS or uda is not None:
            return self._aggregate(call, uda)
        if call.over is not None:
            self.err(call.pos, f"unknown aggregate '{name}'; OVER applies to aggregates only")
            return None
        arity = SCALARS.get(name)
        if arity is None or call.star:
            self.err(call.pos, f"unknown function '{name}'")
            return None
        if not arity[0] <= len(call.args) <= arity[1]:
            self.err(
                call.pos,
                f"'{name}' takes {arity[0]}"
                f"{'' if arity[0] == arity[1] else ' or more'} argument"
                f"{'s' if arity[1] > 1 else ''}, got {len(call.args)}",
            )
            return None
        types = [self.type_of(arg) for arg in call.args]
        if any(t is None for t in types):
            return None
        return self._scalar_type(call, [t for t in types if t is not None])

    def _scalar_type(self, call: ast.Call, types: list[str]) -> str | None:
        name = call.name
        if name in ("abs", "round", "floor", "ceil"):
            if types[0] not in NUMERIC | {"NULL"}:
                self.err(
                    call.args[0].pos, f"type mismatch: '{name}' needs a number, not {types[0]}"
                )
                return None
            return "BIGINT" if name in ("floor", "ceil") else types[0]
        if name in ("lower", "upper", "concat"):
            return "STRING"
        if name == "time_bucket":
            if (types[0], types[1]) != ("INTERVAL", "TIMESTAMP"):
                self.err(
                    call.pos,
                    f"type mismatch: time_bucket takes an INTERVAL and a "
                    f"TIMESTAMP, not {types[0]} and {types[1]}",
                )
                return None
            return "TIMESTAMP"
        known = [t for t in types if t != "NULL"]
        for typ, arg in zip(types, call.args, strict=True):
            if known and typ != "NULL" and not _compatible(known[0], typ):
                self.err(expr_pos(arg), f"type mismatch: '{name}' mixes {known[0]} and {typ}")
                return None
        if known and all(t in NUMERIC for t in known):
            result = known[0]
            for typ in known[1:]:
                result = _numeric_result(result, typ)
            return result
        return known[0] if known else "NULL"

    def _aggregate(self, call: ast.Call, uda: Aggregate | None) -> str | None:
        if self.clause is not None:
            self.err(
                call.pos,
                f"aggregate '{call.name}' is not allowed in {self.clause}; "
                "filter on it in HAVING or in a stream derived from this one",
            )
            return None
        if self._in_aggregate:
            self.err(call.pos, f"aggregate '{call.name}' cannot be nested in another aggregate")
            return None
        self._in_aggregate = True
        try:
            types = [self.type_of(arg) for arg in call.args]
        finally:
            self._in_aggregate = False
        self.aggregates.append(AggUse(call, f"__agg{len(self.aggregates)}", uda))
        if uda is not None:
            return self._uda_args(call, uda, types)
        if call.star and call.name != "count":
            self.err(call.pos, f"'{call.name}(*)' is not an aggregate; only count(*) is")
            return None
        if not call.star and len(call.args) != 1:
            self.err(call.pos, f"'{call.name}' takes one argument, got {len(call.args)}")
            return None
        if call.name == "count":
            return "BIGINT"
        typ = types[0]
        if typ is None:
            return None
        if call.name in NUMERIC_AGGREGATES and typ not in NUMERIC | {"NULL"}:
            self.err(
                expr_pos(call.args[0]), f"type mismatch: '{call.name}' needs a number, not {typ}"
            )
            return None
        return "DOUBLE" if call.name in ("avg", "var", "stddev") else typ

    def _uda_args(self, call: ast.Call, uda: Aggregate, types: list[str | None]) -> str:
        if call.star or len(call.args) != len(uda.params):
            self.err(
                call.pos,
                f"'{uda.name}' takes {len(uda.params)} argument"
                f"{'s' if len(uda.params) != 1 else ''}, got "
                f"{0 if call.star else len(call.args)}",
            )
            return uda.returns
        for arg, typ, want in zip(call.args, types, uda.params, strict=True):
            if typ is not None and not _compatible(want, typ):
                self.err(
                    expr_pos(arg), f"type mismatch: '{uda.name}' expects {want} here, got {typ}"
                )
        return uda.returns


def _reads(node: object) -> Iterator[str]:
    """The names (lower case) a statement reads: the streams and tables in its FROMs and
    the functions it calls (aggregates among them)."""
    if isinstance(node, ast.SourceRef):
        yield node.name.name.lower()
    elif isinstance(node, ast.Call):
        yield node.name
    if isinstance(node, tuple):
        for item in node:
            yield from _reads(item)
    elif is_dataclass(node) and not isinstance(node, type):
        for f in fields(node):
            yield from _reads(getattr(node, f.name))


def dependency_order(
    statements: list[ast.Statement], declared: dict[str, ast.Statement]
) -> list[ast.Statement]:
    """`statements` (in file order) reordered so that each comes after the statements
    in `declared` (name -> its declaration) that it reads, and otherwise keeps its place.
    A statement in a cycle comes before the one it reads, where the check reports it."""
    ordered: list[ast.Statement] = []
    seen: set[int] = set()
    for root in statements:
        # Depth-first, iteratively (a long chain of derived streams must not recurse).
        stack: list[tuple[ast.Statement, Iterator[str]]] = []
        if id(root) not in seen:
            seen.add(id(root))
            stack.append((root, _reads(root)))
        while stack:
            stmt, reads = stack[-1]
            for name in reads:
                dep = declared.get(name)
                if dep is not None and id(dep) not in seen:
                    seen.add(id(dep))
                    stack.append((dep, _reads(dep)))
                    break
            else:
                stack.pop()
                ordered.append(stmt)
    return ordered


def cycle_path(
    start: ast.Statement, target: ast.Statement, declared: dict[str, ast.Statement]
) -> list[ast.Statement]:
    """The statements from `start` on through what each reads (`declared`: name -> its
    declaration), breadth first, to the one that reads `target`; `start` alone if none
    does (then `start` reads `target` itself or not at all)."""
    came_from: dict[int, ast.Statement | None] = {id(start): None}
    queue = [start]
    for stmt in queue:
        if target.name.name.lower() in set(_reads(stmt)):
            path = [stmt]
            while (before := came_from[id(path[-1])]) is not None:
                path.append(before)
            return path[::-1]
        for name in _reads(stmt):
            dep = declared.get(name)
            if dep is not None and id(dep) not in came_from:
                came_from[id(dep)] = stmt
                queue.append(dep)
    return [start]


def check_statements(
    statements: list[ast.Statement], texts: dict[str, str], access: Access
) -> tuple[Catalog, list[RuleError]]:
    """Check parsed statements (from the files whose text is in `texts`, in file order);
    `access` says which Python modules their aggregates may be imported from."""
    checker = Checker(texts, access)
    catalog = checker.check(statements)
    return catalog, checker.errors
