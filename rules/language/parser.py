"""Parse rule text into the syntax tree of `rules.language.ast`.

The grammar is `grammar.lark` (LALR(1)). Syntax errors from lark are turned into
`RuleError`s in the same `file:line:col: message` form as the checker's, naming
what was expected in plain words.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any, NamedTuple, cast

from lark import Lark, Token, Transformer, Tree, UnexpectedInput, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedToken, VisitError

from rules.language import ast
from rules.language.ast import Pos
from rules.language.errors import RuleError, RuleFileError, make_error, source_lines

UNIT_MS = {
    "millisecond": 1,
    "second": 1_000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
}

# Plain words for lark's terminal names, used in "expected ..." messages.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "INT": "a whole number",
    "DECIMAL": "a number",
    "STRING": "a quoted string",
    "UNIT": "a time unit (MILLISECONDS, SECONDS, MINUTES, HOURS, DAYS)",
    "COMP_OP": "a comparison",
    "ADD_OP": "'+' or '-'",
    "MUL_OP": "'*', '/' or '%'",
    "STAR": "'*'",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "COMMA": "','",
    "SEMICOLON": "';'",
    "DOT": "'.'",
    "$END": "the end of the file",
}
# Tokens that can start an expression: when most of them are expected, say "an expression".
_OPERATORS = {
    "ADD_OP",
    "MUL_OP",
    "STAR",
    "COMP_OP",
    "AND",
    "OR",
    "IS",
    "IN",
    "NOT",
    "DOT",
    "LPAR",
    "OVER",
}
_EXPR_START = {"NAME", "INT", "DECIMAL", "STRING", "TRUE", "FALSE", "NULL", "CASE", "LPAR"}
# Tokens that begin a statement: one found where ';' could end the previous statement
# means that ';' is missing.
_STATEMENT_START = {"CREATE"}
# Tokens that begin a value: one found where ',' could come means that ',' is missing.
_VALUE_START = {"NAME", "INT", "DECIMAL", "STRING"}
# At most this many expectations are named; punctuation first, the most likely fix.
_MAX_EXPECTED = 5
_PUNCTUATION_FIRST = ["';'", "','", "')'", "']'"]


@cache
def _parser() -> Lark:
    grammar = resources.files("rules.language").joinpath("grammar.lark").read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=False)


def _pos(item: Token | Tree | Any) -> Pos:
    if isinstance(item, Token):
        return Pos(item.line or 1, item.column or 1)
    if isinstance(item, Tree):
        return Pos(item.meta.line, item.meta.column)
    return item.pos


def _unquote(token: Token) -> str:
    return str(token)[1:-1].replace("''", "'")


def _words(expected: set[str]) -> str:
    names = set(expected)
    parts: list[str] = []
    if len(names & _EXPR_START) >= 4:
        parts.append("an expression")
        names -= _EXPR_START | {"ADD_OP", "NOT", "INTERVAL", "TIMESTAMP"}
    if len(names) > 6 and names & _OPERATORS:
        # After a complete expression nearly anything may follow; operators are noise.
        parts.append("an operator")
        names -= _OPERATORS
    for name in sorted(names):
        word = _TERMINAL_WORDS.get(name)
        if word is None:
            word = name if name.isupper() and name.isalpha() else f"'{name}'"
        parts.append(word)
    if not parts:
        return "something else"
    if len(parts) == 1:
        return parts[0]
    first = [p for p in _PUNCTUATION_FIRST if p in parts]
    parts = first + [p for p in parts if p not in first]
    if len(parts) > _MAX_EXPECTED:
        rest = len(parts) - _MAX_EXPECTED + 1
        parts = [*parts[: _MAX_EXPECTED - 1], f"{rest} more"]
    return "one of " + ", ".join(parts[:-1]) + " or " + parts[-1]


def _code_end(line: str) -> int:
    """The length of ``line`` without its ``--`` comment and trailing blanks."""
    quoted = False
    for i, char in enumerate(line):
        if char == "'":
            quoted = not quoted
        elif not quoted and line.startswith("--", i):
            return len(line[:i].rstrip())
    return len(line.rstrip())


def _after_previous_token(text: str, offset: int) -> Pos:
    """The position just after the last token before character ``offset`` (blank lines
    and comments skipped): where a missing ``;`` or ``,`` belongs."""
    lines = source_lines(text[:offset])
    for number in range(len(lines), 0, -1):
        end = _code_end(lines[number - 1])
        if end:
            return Pos(number, end + 1)
    return Pos(1, 1)


def _syntax_error(file: str, text: str, exc: UnexpectedInput) -> RuleError:
    pos = Pos(exc.line if exc.line > 0 else 1, exc.column if exc.column > 0 else 1)
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        if tok.type == "$END":
            lines = source_lines(text.removesuffix("\n"))
            pos = Pos(len(lines), len(lines[-1]) + 1)
            found = "the end of the file"
        else:
            found = f"'{tok}'"
        expected = set(exc.expected)
        if tok.type in _STATEMENT_START and "SEMICOLON" in expected:
            pos = _after_previous_token(text, tok.start_pos or 0)
            message = (
                f"syntax error: missing ';' at the end of this statement (the next one "
                f"begins at line {tok.line})"
            )
        elif tok.type in _VALUE_START and "COMMA" in expected:
            pos = _after_previous_token(text, tok.start_pos or 0)
            message = f"syntax error: probably a missing ',' here, before {found}"
        else:
            message = f"syntax error: unexpected {found}; expected {_words(expected)}"
    elif isinstance(exc, UnexpectedCharacters):
        # lark types it None (the base class's default); UnexpectedCharacters sets an int
        at: int = exc.pos_in_stream  # type: ignore[assignment]
        char = text[at] if at < len(text) else "?"
        message = f"syntax error: unexpected character '{char}'"
        if exc.allowed:
            message += f"; expected {_words(set(exc.allowed))}"
    elif isinstance(exc, UnexpectedEOF):
        message = f"syntax error: the file ends too early; expected {_words(set(exc.expected))}"
    else:  # pragma: no cover - lark has no other UnexpectedInput kinds
        message = f"syntax error: {exc}"
    return make_error(file, text, pos, message)


def _duration_ms(children: list[Token]) -> int:
    amount, unit = children
    word = str(unit).lower().rstrip("s")
    return int(amount) * UNIT_MS[word]


def _timestamp_ms(token: Token) -> int:
    text = _unquote(token).strip()
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise RuleFileError(
            _pos(token), f"'{text}' is not an ISO-8601 timestamp (e.g. '2026-01-01T00:00:00Z')"
        ) from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # rule timestamps without an offset are UTC
    return int(when.timestamp() * 1000)


def _strip(children: list[Any]) -> list[Any]:
    """Drop keyword tokens, keep names, literals and subtrees."""
    return [
        c
        for c in children
        if not (
            isinstance(c, Token) and c.type.isupper() and c.type not in ("INT", "STRING", "UNIT")
        )
    ]


def _quantifier(token: Token, expected: str) -> None:
    """Refuse an operator token where the grammar took a quantifier (`A-`, `A/`)."""
    if str(token) != expected:
        raise RuleFileError(_pos(token), f"syntax error: '{token}' is not a quantifier")


class _R2S(NamedTuple):
    """`ISTREAM(list)` and friends, on its way into `ast.Select`."""

    operator: ast.R2S
    items: tuple[ast.SelectItem, ...]


class _Clause(NamedTuple):
    """One optional clause of a statement on its way into its node: an incident clause
    of `CREATE ALERT` (into `ast.IncidentClauses`), PER SOURCE or IDLE of `CREATE
    STREAM`."""

    field: str
    value: Any
    pos: Pos


class _Build(Transformer[Token, Any]):
    """Bottom-up conversion of lark's parse tree into `ast` nodes."""

    def __init__(self, file: str) -> None:
        super().__init__()
        self.file = file

    # -- leaves
    def name(self, children: list[Token]) -> ast.Ident:
        return ast.Ident(str(children[0]), _pos(children[0]))

    def string(self, children: list[Token]) -> Token:
        return children[0]

    def duration(self, children: list[Token]) -> tuple[int, Pos]:
        return _duration_ms(children), _pos(children[0])

    def timestamp_lit(self, children: list[Token]) -> ast.Literal:
        return ast.Literal(_timestamp_ms(children[1]), "TIMESTAMP", _pos(children[0]))

    def name_list(self, children: list[ast.Ident]) -> tuple[ast.Ident, ...]:
        return tuple(children)

    def type_name(self, children: list[Token]) -> ast.Ident:
        return ast.Ident(str(children[0]).upper(), _pos(children[0]))

    def column_def(self, children: list[ast.Ident]) -> ast.ColumnDef:
        return ast.ColumnDef(children[0], children[1])

    def column_defs(self, children: list[ast.ColumnDef]) -> tuple[ast.ColumnDef, ...]:
        return tuple(children)

    # -- statements
    def start(self, children: list[ast.Statement]) -> list[ast.Statement]:
        return list(children)

    @v_args(meta=True)
    def create_stream(self, meta: Any, children: list[Any]) -> ast.CreateStream:
        name, cols, order_by, (slack, _), *clauses, source = _strip(children)
        found = {c.field: c for c in clauses}
        per_source, idle = found.get("per_source"), found.get("idle_ms")
        return ast.CreateStream(
            name,
            cols,
            order_by,
            slack,
            _unquote(source),
            Pos(meta.line, meta.column),
            self.file,
            per_source=per_source.pos if per_source else None,
            idle_ms=idle.value if idle else None,
            idle_pos=idle.pos if idle else None,
        )

    def per_source(self, children: list[Token]) -> _Clause:
        return _Clause("per_source", True, _pos(children[0]))

    def idle(self, children: list[Any]) -> _Clause:
        ms, _ = children[1]
        return _Clause("idle_ms", ms, _pos(children[0]))

    @v_args(meta=True)
    def create_derived(self, meta: Any, children: list[Any]) -> ast.CreateDerived:
        name, query = _strip(children)
        return ast.CreateDerived(name, query, Pos(meta.line, meta.column), self.file)

    @v_args(meta=True)
    def create_table(self, meta: Any, children: list[Any]) -> ast.CreateTable:
        name, cols, fmt, path = _strip(children)
        return ast.CreateTable(
            name, cols, fmt, _unquote(path), Pos(meta.line, meta.column), self.file, _pos(path)
        )

    def table_format(self, children: list[Token]) -> str:
        return str(children[0]).upper()

    def severity(self, children: list[Token]) -> str:
        return str(children[0]).lower()

    def algebraic(self, children: list[Token]) -> bool:
        return True

    def message(self, children: list[Token]) -> Token:
        return children[1]

    @v_args(meta=True)
    def create_aggregate(self, meta: Any, children: list[Any]) -> ast.CreateAggregate:
        parts = _strip(children)
        name, params, returns, target = parts[:4]
        return ast.CreateAggregate(
            name,
            params,
            returns,
            _unquote(target),
            _pos(target),
            len(parts) > 4,
            Pos(meta.line, meta.column),
            self.file,
        )

    @v_args(meta=True)
    def create_alert(self, meta: Any, children: list[Any]) -> ast.CreateAlert:
        parts = _strip(children)
        name, severity, query, middle = parts[0], parts[1], parts[-1], parts[2:-1]
        message = next((p for p in middle if isinstance(p, Token)), None)
        clauses: dict[str, Any] = {}
        for part in middle:
            if isinstance(part, _Clause):
                clauses[part.field] = part.value
                if part.field in ("resolve_when", "resolve_after_ms"):
                    clauses["resolve_pos"] = part.pos
        return ast.CreateAlert(
            name,
            severity,
            _unquote(message) if message is not None else None,
            _pos(message) if message is not None else None,
            query,
            Pos(meta.line, meta.column),
            self.file,
            ast.IncidentClauses(**clauses),
        )

    def pending(self, children: list[Any]) -> _Clause:
        ms, pos = children[1]
        return _Clause("pending_ms", ms, pos)

    def keep_firing(self, children: list[Any]) -> _Clause:
        ms, pos = children[3]
        return _Clause("keep_firing_ms", ms, pos)

    def resolve_when(self, children: list[Any]) -> _Clause:
        return _Clause("resolve_when", children[2], _pos(children[0]))

    def resolve_after(self, children: list[Any]) -> _Clause:
        ms, _ = children[2]
        return _Clause("resolve_after_ms", ms, _pos(children[0]))

    # -- queries
    @v_args(meta=True)
    def query(self, meta: Any, children: list[Any]) -> ast.Query:
        return ast.Query(tuple(_strip(children)), Pos(meta.line, meta.column))

    @v_args(meta=True)
    def select(self, meta: Any, children: list[Any]) -> ast.Select:
        parts = _strip(children)
        # The projection is a plain select list, or (operator, list) for ISTREAM(...) etc.
        r2s, items = parts[0] if isinstance(parts[0], _R2S) else (None, parts[0])
        sources, joins, left = parts[1]
        clauses = {kind: value for kind, value in parts[2:]}
        return ast.Select(
            r2s,
            items,
            sources,
            joins,
            clauses.get("where"),
            clauses.get("group_by", ()),
            clauses.get("having"),
            Pos(meta.line, meta.column),
            left,
        )

    def r2s(self, children: list[Token]) -> ast.R2S:
        return cast(ast.R2S, str(children[0]).upper())  # the grammar's three tokens

    def r2s_projection(self, children: list[Any]) -> _R2S:
        return _R2S(children[0], children[1])

    def select_list(self, children: list[ast.SelectItem]) -> tuple[ast.SelectItem, ...]:
        return tuple(children)

    @v_args(meta=True)
    def select_expr(self, meta: Any, children: list[Any]) -> ast.SelectItem:
        parts = _strip(children)
        alias = parts[1] if len(parts) > 1 else None
        return ast.SelectItem(parts[0], alias, Pos(meta.line, meta.column))

    def select_star(self, children: list[Token]) -> ast.SelectItem:
        return ast.SelectItem(None, None, _pos(children[0]))

    def from_clause(
        self, children: list[Any]
    ) -> tuple[tuple[ast.SourceRef, ...], tuple[ast.Expr | None, ...], tuple[bool, ...]]:
        sources: list[ast.SourceRef] = []
        joins: list[ast.Expr | None] = []
        left: list[bool] = []
        for child in children:
            if isinstance(child, ast.SourceRef):
                sources.append(child)
                joins.append(None)
                left.append(False)
            elif isinstance(child, tuple):  # a [LEFT | INNER] JOIN ... ON ...
                sources.append(child[0])
                joins.append(child[1])
                left.append(child[2])
        return tuple(sources), tuple(joins), tuple(left)

    def join(self, children: list[Any]) -> tuple[ast.SourceRef, ast.Expr, bool]:
        parts = _strip(children)
        is_left = isinstance(parts[0], str) and parts[0] == "LEFT"
        source, on = parts[-2:]
        return source, on, is_left

    def join_kind(self, children: list[Token]) -> str:
        return str(children[0]).upper()

    def source_ref(self, children: list[Any]) -> ast.SourceRef:
        name = children[0]
        window = next((c for c in children[1:] if isinstance(c, ast.WindowSpec)), None)
        alias = next((c for c in children[1:] if isinstance(c, ast.Ident)), None)
        return ast.SourceRef(name, window, alias)

    def match_source(self, children: list[Any]) -> ast.SourceRef:
        alias = children[2] if len(children) > 2 else None
        return ast.SourceRef(children[0], None, alias, children[1])

    # -- MATCH_RECOGNIZE
    def match_recognize(self, children: list[Any]) -> ast.MatchRecognize:
        parts = _strip(children)
        partition = parts.pop(0) if isinstance(parts[0], tuple) else ()
        order_by, *rest = parts
        # The optional clauses come as (clause, value); the pattern as itself.
        clauses = {c[0]: c[1] for c in rest if isinstance(c, tuple)}
        pattern = next(p for p in rest if not isinstance(p, tuple))
        return ast.MatchRecognize(
            partition,
            order_by,
            clauses["measures"],
            clauses.get("skip", "PAST LAST ROW"),
            pattern,
            clauses.get("within"),
            clauses.get("defines", ()),
            _pos(children[0]),
        )

    def measures(self, children: list[Any]) -> tuple[str, tuple[tuple[ast.Expr, ast.Ident], ...]]:
        return "measures", tuple(_strip(children))

    def measure(self, children: list[Any]) -> tuple[ast.Expr, ast.Ident]:
        expr, name = _strip(children)
        return expr, name

    def one_row(self, children: list[Token]) -> tuple[str, None]:
        return "one_row", None

    def skip_past_last_row(self, children: list[Token]) -> tuple[str, str]:
        return "skip", "PAST LAST ROW"

    def skip_to_next_row(self, children: list[Token]) -> tuple[str, str]:
        return "skip", "TO NEXT ROW"

    def within(self, children: list[Any]) -> tuple[str, int]:
        return "within", children[-1][0]

    def defines(self, children: list[Any]) -> tuple[str, tuple[tuple[ast.Ident, ast.Expr], ...]]:
        return "defines", tuple(_strip(children))

    def define(self, children: list[Any]) -> tuple[ast.Ident, ast.Expr]:
        name, expr = _strip(children)
        return name, expr

    def pattern_alt(self, children: list[Any]) -> ast.PatternAlt:
        left, right = children
        options = left.options if isinstance(left, ast.PatternAlt) else (left,)
        return ast.PatternAlt((*options, right), left.pos)

    def pattern_seq(self, children: list[Any]) -> ast.PatternNode:
        if len(children) == 1:
            return cast(ast.PatternNode, children[0])
        return ast.PatternSeq(tuple(children), children[0].pos)

    def pattern_term(self, children: list[Any]) -> ast.PatternNode:
        item = children[0]
        if len(children) == 1:
            return cast(ast.PatternNode, item)
        low, high, greedy = children[1]
        return ast.PatternRepeat(item, low, high, greedy, item.pos)

    def pattern_var(self, children: list[Token]) -> ast.PatternVar:
        return ast.PatternVar(str(children[0]), _pos(children[0]))

    def reluctant(self, children: list[Token]) -> bool:
        return True

    def q_star(self, children: list[Any]) -> tuple[int, int | None, bool]:
        _quantifier(children[0], "*")
        return 0, None, len(children) == 1

    def q_plus(self, children: list[Any]) -> tuple[int, int | None, bool]:
        _quantifier(children[0], "+")
        return 1, None, len(children) == 1

    def q_optional(self, children: list[Any]) -> tuple[int, int | None, bool]:
        return 0, 1, len(children) == 1

    def _bounds(self, children: list[Any]) -> list[int]:
        return [int(c) for c in children if isinstance(c, Token) and c.type == "INT"]

    def q_exact(self, children: list[Any]) -> tuple[int, int | None, bool]:
        (n,) = self._bounds(children)
        return n, n, children[-1] is not True

    def q_at_least(self, children: list[Any]) -> tuple[int, int | None, bool]:
        (n,) = self._bounds(children)
        return n, None, children[-1] is not True

    def q_between(self, children: list[Any]) -> tuple[int, int | None, bool]:
        n, m = self._bounds(children)
        return n, m, children[-1] is not True

    def alias(self, children: list[Any]) -> ast.Ident:
        return _strip(children)[0]

    def where(self, children: list[Any]) -> tuple[str, ast.Expr]:
        return "where", children[1]

    def having(self, children: list[Any]) -> tuple[str, ast.Expr]:
        return "having", children[1]

    def group_by(self, children: list[Any]) -> tuple[str, tuple[ast.Expr, ...]]:
        return "group_by", tuple(_strip(children))

    # -- CQL windows in FROM
    def cql_window(self, children: list[ast.WindowSpec]) -> ast.WindowSpec:
        return children[0]

    def _window(
        self, kind: str, origin: str, first: Token, parts: list[Any], **fields: Any
    ) -> ast.WindowSpec:
        for part in parts:
            if isinstance(part, tuple) and len(part) == 2 and isinstance(part[0], str):
                fields[part[0]] = part[1]
        return ast.WindowSpec(kind, origin, _pos(first), **fields)  # type: ignore[arg-type]

    def cql_now(self, children: list[Token]) -> ast.WindowSpec:
        return ast.WindowSpec("now", "from", _pos(children[0]))

    def cql_rows(self, children: list[Any]) -> ast.WindowSpec:
        return self._window("rows", "from", children[0], children[2:], rows=int(children[1]))

    def cql_partition_rows(self, children: list[Any]) -> ast.WindowSpec:
        keys, rows = _strip(children)
        return ast.WindowSpec(
            "partition_rows", "from", _pos(children[0]), partition=keys, rows=int(rows)
        )

    def cql_range(self, children: list[Any]) -> ast.WindowSpec:
        return self._window("range", "from", children[0], children[2:], range_ms=children[1][0])

    def cql_unbounded(self, children: list[Any]) -> ast.WindowSpec:
        return self._window("unbounded", "from", children[0], children[2:])

    def cql_since(self, children: list[Any]) -> ast.WindowSpec:
        return ast.WindowSpec("since", "from", _pos(children[0]), lower_ms=children[1].value)

    def cql_until(self, children: list[Any]) -> ast.WindowSpec:
        return ast.WindowSpec("until", "from", _pos(children[0]), upper_ms=children[1].value)

    def cql_band(self, children: list[Any]) -> ast.WindowSpec:
        return ast.WindowSpec(
            "band",
            "from",
            _pos(children[0]),
            lower_ms=children[1].value,
            upper_ms=children[3].value,
        )

    def slide_rows(self, children: list[Token]) -> tuple[str, Any]:
        return "slide_rows", int(children[1])

    def slide_time(self, children: list[Any]) -> tuple[str, Any]:
        return "slide_ms", children[1][0]

    def lag(self, children: list[Any]) -> tuple[str, Any]:
        return "lag_ms", children[1][0]

    def reset(self, children: list[Any]) -> tuple[str, Any]:
        return "reset_ms", children[2][0]

    # -- OVER windows
    def over(self, children: list[Any]) -> ast.WindowSpec:
        parts = _strip(children)
        partition: tuple[ast.Ident, ...] = ()
        frame: ast.WindowSpec | None = None
        modifier: tuple[Pos, dict[str, Any]] | None = None
        for part in parts:
            if isinstance(part, tuple) and part and isinstance(part[0], ast.Ident):
                partition = part
            elif isinstance(part, ast.WindowSpec):
                frame = part
            elif isinstance(part, tuple) and len(part) == 2 and isinstance(part[0], Pos):
                modifier = part
        assert frame is not None  # the grammar requires a frame
        extra: dict[str, Any] = {"partition": partition}
        if modifier is not None:
            extra.update(modifier[1], modifier_pos=modifier[0])
        return ast.WindowSpec(**{**frame.__dict__, **extra})

    def partition(self, children: list[Any]) -> tuple[ast.Ident, ...]:
        return children[2]

    def frame_rows(self, children: list[Any]) -> ast.WindowSpec:
        return ast.WindowSpec("rows", "over", _pos(children[0]), rows=int(children[1]))

    def frame_rows_unbounded(self, children: list[Any]) -> ast.WindowSpec:
        # A physical frame of every row so far: ROWS with no count, not a RANGE landmark
        # (a later row with the same timestamp is not in it).
        return ast.WindowSpec("rows", "over", _pos(children[0]))

    def frame_range(self, children: list[Any]) -> ast.WindowSpec:
        return self._window("range", "over", children[0], children[3:], range_ms=children[1][0])

    def frame_unbounded(self, children: list[Any]) -> ast.WindowSpec:
        return self._window("unbounded", "over", children[0], children[3:])

    def frame_since(self, children: list[Any]) -> ast.WindowSpec:
        return ast.WindowSpec("since", "over", _pos(children[0]), lower_ms=children[2].value)

    def frame_until(self, children: list[Any]) -> ast.WindowSpec:
        return ast.WindowSpec("until", "over", _pos(children[0]), upper_ms=children[2].value)

    def frame_band(self, children: list[Any]) -> ast.WindowSpec:
        return ast.WindowSpec(
            "band",
            "over",
            _pos(children[0]),
            lower_ms=children[2].value,
            upper_ms=children[4].value,
        )

    def mod_slide_rows(self, children: list[Token]) -> tuple[Pos, dict[str, Any]]:
        return _pos(children[0]), {"slide_rows": int(children[1])}

    def mod_slide_time(self, children: list[Any]) -> tuple[Pos, dict[str, Any]]:
        return _pos(children[0]), {"slide_ms": children[1][0]}

    def mod_active(self, children: list[Token]) -> tuple[Pos, dict[str, Any]]:
        return _pos(children[0]), {"active_expiration": True}

    # -- expressions
    def int_lit(self, children: list[Token]) -> ast.Literal:
        return ast.Literal(int(children[0]), "INT", _pos(children[0]))

    def float_lit(self, children: list[Token]) -> ast.Literal:
        return ast.Literal(float(children[0]), "DOUBLE", _pos(children[0]))

    def str_lit(self, children: list[Token]) -> ast.Literal:
        return ast.Literal(_unquote(children[0]), "STRING", _pos(children[0]))

    def true_lit(self, children: list[Token]) -> ast.Literal:
        return ast.Literal(True, "BOOLEAN", _pos(children[0]))

    def false_lit(self, children: list[Token]) -> ast.Literal:
        return ast.Literal(False, "BOOLEAN", _pos(children[0]))

    def null_lit(self, children: list[Token]) -> ast.Literal:
        return ast.Literal(None, "NULL", _pos(children[0]))

    def interval_lit(self, children: list[Any]) -> ast.Literal:
        return ast.Literal(children[1][0], "INTERVAL", _pos(children[0]))

    def column(self, children: list[ast.Ident]) -> ast.Column:
        return ast.Column(children[0].name, None, children[0].pos)

    def qualified_column(self, children: list[ast.Ident]) -> ast.Column:
        return ast.Column(children[1].name, children[0].name, children[0].pos)

    def call(self, children: list[Any]) -> ast.Call:
        name, *rest = children
        over = rest.pop() if rest and isinstance(rest[-1], ast.WindowSpec) else None
        return ast.Call(name.name.lower(), tuple(rest), False, over, name.pos)

    def call_star(self, children: list[Any]) -> ast.Call:
        name = children[0]
        over = children[-1] if isinstance(children[-1], ast.WindowSpec) else None
        return ast.Call(name.name.lower(), (), True, over, name.pos)

    def call_var_star(self, children: list[Any]) -> ast.Call:
        name, var = children[0], children[1]
        return ast.Call(
            name.name.lower(), (ast.Column("*", var.name, var.pos),), True, None, name.pos
        )

    def case(self, children: list[Any]) -> ast.Case:
        whens = tuple(c for c in children if isinstance(c, tuple))
        has_else = isinstance(children[-3], Token) and children[-3].type == "ELSE"
        return ast.Case(whens, children[-2] if has_else else None, _pos(children[0]))

    def when(self, children: list[Any]) -> tuple[ast.Expr, ast.Expr]:
        return children[1], children[3]

    def logic(self, children: list[Any]) -> ast.Binary:
        left, op, right = children
        return ast.Binary(str(op).upper(), left, right, _pos(left))

    def not_op(self, children: list[Any]) -> ast.Unary:
        return ast.Unary("NOT", children[1], _pos(children[0]))

    def compare(self, children: list[Any]) -> ast.Binary:
        left, op, right = children
        return ast.Binary("<>" if op == "!=" else str(op), left, right, _pos(op))

    def arith(self, children: list[Any]) -> ast.Binary:
        left, op, right = children
        return ast.Binary(str(op), left, right, _pos(op))

    def neg(self, children: list[Any]) -> ast.Expr:
        op, operand = children
        if op == "+":
            return operand
        return ast.Unary("-", operand, _pos(op))

    def is_null(self, children: list[Any]) -> ast.IsNull:
        return ast.IsNull(children[0], False, _pos(children[1]))

    def is_not_null(self, children: list[Any]) -> ast.IsNull:
        return ast.IsNull(children[0], True, _pos(children[1]))

    def in_list(self, children: list[Any]) -> ast.InList:
        return ast.InList(children[0], tuple(children[2:]), False, _pos(children[1]))

    def not_in_list(self, children: list[Any]) -> ast.InList:
        return ast.InList(children[0], tuple(children[3:]), True, _pos(children[1]))


def parse_text(text: str, file: str = "<string>") -> tuple[list[ast.Statement], list[RuleError]]:
    """Parse rule text. Returns the statements and, on a syntax error, that one error
    (and no statements: parsing stops at the first syntax error)."""
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        return [], [_syntax_error(file, text, exc)]
    try:
        return _Build(file).transform(tree), []
    except VisitError as exc:
        if isinstance(exc.orig_exc, RuleFileError):
            return [], [make_error(file, text, exc.orig_exc.pos, exc.orig_exc.message)]
        raise
