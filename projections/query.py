"""Run queries: the grammar `runs list --where` and `Client.list_runs(where=...)` take,
parsed into a tree, and the tree's verdict on one run. Pure: no I/O, no clock.

    query      := disjunct ("or" disjunct)*
    disjunct   := term ("and" term)*
    term       := "(" query ")" | NAME op literal | NAME "in" "(" literal ("," literal)* ")"
                | NAME "starts_with" STRING | NAME "is" ["not"] "null"
    NAME       := name | '"' name '"'   (quoted: never a word, `"And" = 1`)
    op         := "=" | "!=" | "<" | "<=" | ">" | ">="
    literal    := STRING | NUMBER | "true" | "false" | "timestamp" STRING

STRING is single-quoted ('' inside is a quote); NUMBER an integer or a decimal; a
`timestamp '2026-12-01T00:00:00Z'` is a time (ISO 8601 with a zone). Words are
case-insensitive, names are not: an attribute whose name is a word in any case (`Null`,
`AND`) is named in double quotes. NAME is an attribute or a built-in field: run_id, lineage,
flow, status, created, updated, settled (times: a plain string literal is read as a time
there), round (a number), parent, schedule.

Values are typed, and a comparison looks only at values of its literal's type (numbers:
int and float together): `amount > 10` never matches a run whose `amount` is a string. A
list attribute matches when one of its elements does. `a != v` matches runs holding a value
of v's type, none of them v; `a is null` runs holding no value of any type under `a`.
Bounds: MAX_QUERY_CHARS of text, MAX_IN_VALUES per `in`, MAX_DEPTH nested parentheses.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

from runstream.engine.errors import InvalidAttributes, QueryInvalid
from runstream.engine.journal.timetext import epoch_ms
from runstream.projections.attributes import BUILT_IN_FIELDS, parse_time
from runstream.projections.state import RunState, RunStatus

MAX_QUERY_CHARS = 4096
MAX_IN_VALUES = 1000
MAX_DEPTH = 32
# A whole number literal past this is no 64-bit float (the query index holds numbers as
# floats: a larger one cannot be placed in it).
MAX_INT_LITERAL = int(sys.float_info.max)
OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
TIME_FIELDS = frozenset({"created", "updated", "settled"})
STRING_FIELDS = frozenset({"run_id", "lineage", "flow", "status", "parent", "schedule"})

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>'(?:[^']|'')*')
  | (?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<quoted>"[A-Za-z_][A-Za-z0-9_]*")
  | (?P<op>!=|<>|<=|>=|=|<|>)
  | (?P<punct>[(),])
""", re.VERBOSE)


@dataclass(frozen=True, slots=True)
class Literal:
    tag: str  # s (string) | n (number) | b (bool) | t (time, epoch ms)
    value: Any


@dataclass(frozen=True, slots=True)
class Compare:
    field: str
    op: str
    literal: Literal


@dataclass(frozen=True, slots=True)
class In:
    field: str
    literals: tuple[Literal, ...]


@dataclass(frozen=True, slots=True)
class StartsWith:
    field: str
    prefix: str


@dataclass(frozen=True, slots=True)
class IsNull:
    field: str
    negated: bool


@dataclass(frozen=True, slots=True)
class And:
    terms: tuple[Query, ...]


@dataclass(frozen=True, slots=True)
class Or:
    terms: tuple[Query, ...]


Query = Compare | In | StartsWith | IsNull | And | Or


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str
    position: int


def _tokens(text: str) -> list[_Token]:
    found: list[_Token] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            if text[position] == "'":
                raise QueryInvalid("a string is not closed", position)
            if text[position] == '"':
                raise QueryInvalid("a quoted name is a name in double quotes, \"like_this\"",
                                   position)
            raise QueryInvalid(f"unexpected character {text[position]!r}", position)
        kind = match.lastgroup or ""
        if kind != "space":
            found.append(_Token(kind, match.group(), position))
        position = match.end()
    found.append(_Token("end", "", len(text)))
    return found


def parse(text: str) -> Query:
    """The tree of a query; QueryInvalid naming the position of what is wrong."""
    if len(text) > MAX_QUERY_CHARS:
        raise QueryInvalid(f"a query is at most {MAX_QUERY_CHARS} characters", MAX_QUERY_CHARS)
    parser = _Parser(_tokens(text))
    if parser.peek().kind == "end":
        raise QueryInvalid("the query is empty", 0)
    tree = parser.query(0)
    token = parser.peek()
    if token.kind != "end":
        raise QueryInvalid(f"expected 'and', 'or' or the end, found {token.text!r}",
                           token.position)
    return tree


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.at = 0

    def peek(self) -> _Token:
        return self.tokens[self.at]

    def take(self) -> _Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def word(self, *words: str) -> bool:
        token = self.peek()
        return token.kind == "name" and token.text.lower() in words

    def expect(self, text: str, what: str) -> _Token:
        token = self.take()
        if token.text.lower() != text:
            raise QueryInvalid(f"expected {what}, found {token.text or 'the end'!r}",
                               token.position)
        return token

    def query(self, depth: int) -> Query:
        terms = [self.conjunction(depth)]
        while self.word("or"):
            self.take()
            terms.append(self.conjunction(depth))
        return terms[0] if len(terms) == 1 else Or(tuple(terms))

    def conjunction(self, depth: int) -> Query:
        terms = [self.term(depth)]
        while self.word("and"):
            self.take()
            terms.append(self.term(depth))
        return terms[0] if len(terms) == 1 else And(tuple(terms))

    def term(self, depth: int) -> Query:
        token = self.peek()
        if token.text == "(":
            if depth >= MAX_DEPTH:
                raise QueryInvalid(f"more than {MAX_DEPTH} nested parentheses",
                                   token.position)
            self.take()
            inner = self.query(depth + 1)
            self.expect(")", "')'")
            return inner
        if token.kind == "quoted":  # (a name that is a word in some case: never taken as one)
            self.take()
            return self.predicate(token.text[1:-1], token.position)
        if token.kind != "name" or token.text.lower() in _WORDS:
            raise QueryInvalid(f"expected a field name, found {token.text or 'the end'!r}",
                               token.position)
        self.take()
        return self.predicate(token.text, token.position)

    def predicate(self, field: str, at: int) -> Query:
        token = self.take()
        word = token.text.lower() if token.kind == "name" else ""
        if token.kind == "op":
            op = "!=" if token.text == "<>" else token.text
            return Compare(field, op, self.literal(field))
        if word == "in":
            return In(field, self.in_list(field))
        if word == "starts_with":
            prefix = self.literal(field, strings_only=True)
            return StartsWith(field, str(prefix.value))
        if word == "is":
            negated = self.word("not")
            if negated:
                self.take()
            self.expect("null", "'null'")
            return IsNull(field, negated)
        raise QueryInvalid(f"expected an operator (= != < <= > >=), 'in', 'starts_with' or "
                           f"'is' after {field!r}, found {token.text or 'the end'!r}",
                           token.position)

    def in_list(self, field: str) -> tuple[Literal, ...]:
        self.expect("(", "'(' after 'in'")
        values = [self.literal(field)]
        while self.peek().text == ",":
            self.take()
            values.append(self.literal(field))
            if len(values) > MAX_IN_VALUES:
                raise QueryInvalid(f"'in' takes at most {MAX_IN_VALUES} values",
                                   self.peek().position)
        self.expect(")", "')' or ','")
        return tuple(values)

    def literal(self, field: str, *, strings_only: bool = False) -> Literal:
        token = self.take()
        word = token.text.lower() if token.kind == "name" else ""
        if token.kind == "string":
            text = token.text[1:-1].replace("''", "'")
            if not text.isascii():
                _check_unicode(text, token.position)
            if field in TIME_FIELDS and not strings_only:
                return Literal("t", _time(text, token.position))
            found = Literal("s", text)
        elif strings_only:
            raise QueryInvalid(f"starts_with takes a string, found {token.text or 'the end'!r}",
                               token.position)
        elif token.kind == "number":
            number = float(token.text) if any(c in token.text for c in ".eE") else int(token.text)
            if isinstance(number, int) and abs(number) > MAX_INT_LITERAL:
                raise QueryInvalid(f"the number {token.text[:20]}... is out of range (an "
                                   f"attribute holds a 64-bit float)", token.position)
            found = Literal("n", number)
        elif word in ("true", "false"):
            found = Literal("b", word == "true")
        elif word == "timestamp":
            text_token = self.take()
            if text_token.kind != "string":
                raise QueryInvalid("expected a quoted time after 'timestamp'",
                                   text_token.position)
            found = Literal("t", _time(text_token.text[1:-1], text_token.position))
        else:
            raise QueryInvalid(f"expected a value, found {token.text or 'the end'!r}",
                               token.position)
        _check_type(field, found, token.position)
        return found


def _check_unicode(text: str, position: int) -> None:
    try:
        text.encode()
    except UnicodeEncodeError:
        raise QueryInvalid("a string must be valid Unicode (it holds a lone surrogate)",
                           position) from None


_WORDS = frozenset({"and", "or", "in", "is", "not", "null", "starts_with", "true", "false",
                    "timestamp"})


def _time(text: str, position: int) -> int:
    try:
        return epoch_ms(parse_time(text, what="time"))
    except InvalidAttributes as exc:
        raise QueryInvalid(str(exc), position) from None


def _check_type(field: str, literal: Literal, position: int) -> None:
    """Built-in fields have one type each; a literal of another is an error, not a query
    that matches nothing."""
    if field not in BUILT_IN_FIELDS:
        return
    wanted = "t" if field in TIME_FIELDS else "n" if field == "round" else "s"
    if literal.tag != wanted:
        kind = {"t": "a time", "n": "a number", "s": "a string"}[wanted]
        raise QueryInvalid(f"{field} is compared with {kind}", position)
    if field == "status" and literal.value not in RunStatus.__members__:
        raise QueryInvalid(f"{literal.value!r} is not a status (one of "
                           f"{', '.join(RunStatus.__members__)})", position)


# -- a verdict on one run -------------------------------------------------------------------


def field_values(run: RunState, field: str) -> list[tuple[str, Any]]:
    """(tag, value) of everything `run` holds under `field`."""
    built_in = _BUILT_IN.get(field)
    if built_in is not None:
        value = built_in(run)
        if value is None:
            return []
        tag = "t" if field in TIME_FIELDS else "n" if field == "round" else "s"
        return [(tag, value)]
    for item in run.attributes:
        if item.name == field:
            if item.kind == "list":
                return [("s", element) for element in item.value]
            tag = {"str": "s", "int": "n", "float": "n", "bool": "b", "time": "t"}[item.kind]
            return [(tag, item.value)]
    return []


_BUILT_IN: dict[str, Any] = {
    "run_id": lambda run: run.run_id, "lineage": lambda run: run.lineage_id,
    "flow": lambda run: run.flow, "status": lambda run: run.status.value,
    "created": lambda run: run.created_at_ms, "updated": lambda run: run.updated_at_ms,
    "settled": lambda run: run.settled_at_ms, "round": lambda run: run.round,
    "parent": lambda run: run.parent_run_id, "schedule": lambda run: run.schedule_id,
}


def matches(query: Query, run: RunState) -> bool:
    if isinstance(query, And):
        return all(matches(term, run) for term in query.terms)
    if isinstance(query, Or):
        return any(matches(term, run) for term in query.terms)
    values = field_values(run, query.field)
    if isinstance(query, IsNull):
        return bool(values) == query.negated
    if isinstance(query, StartsWith):
        return any(tag == "s" and value.startswith(query.prefix) for tag, value in values)
    if isinstance(query, In):
        return any(_compare(values, "=", literal) for literal in query.literals)
    return _compare(values, query.op, query.literal)


def _compare(values: list[tuple[str, Any]], op: str, literal: Literal) -> bool:
    typed = [value for tag, value in values if tag == literal.tag]
    if op == "!=":
        return bool(typed) and all(value != literal.value for value in typed)
    test = _TESTS[op]
    return any(test(value, literal.value) for value in typed)


_TESTS: dict[str, Any] = {
    "=": lambda a, b: a == b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}
