"""Label selectors exactly as kube-apiserver parses and matches them.

The cache answers ``labelSelector`` LISTs itself, so it must accept exactly the strings the apiserver
accepts and select exactly the objects it selects; anything the apiserver rejects raises
:class:`SelectorError` so the request goes upstream and the client sees the apiserver's own error.

Ported from ``staging/src/k8s.io/apimachinery/pkg/labels/selector.go`` (the lexer, the recursive-descent
parser, ``NewRequirement`` validation, ``Requirement.Matches``) and
``staging/src/k8s.io/apimachinery/pkg/api/validate/content/kube.go`` / ``dns.go`` (``IsLabelKey``,
``IsLabelValue``, ``IsDNS1123Subdomain``).  The apiserver reaches the parser through
``staging/src/k8s.io/apimachinery/pkg/apis/meta/internalversion/conversion.go``
(``Convert_string_To_labels_Selector`` -> ``labels.Parse``) and turns its error into a 400 BadRequest
(``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/get.go``).  Matching happens in
``staging/src/k8s.io/apiserver/pkg/storage/selection_predicate.go`` (``SelectionPredicate.Matches``:
``Label.Matches(labels.Set(obj.labels))``).

Facts worth knowing (each from selector.go):

* ``!=`` and ``notin`` match objects WITHOUT the key; ``=``, ``==``, ``in``, ``>``, ``<`` need it.
* ``x in ()`` is valid and means the value set ``{""}``; ``x=`` means ``x == ""``.
* ``>``/``<`` take one decimal int64 that must also be a valid label value (so no sign); a label whose
  value does not parse as a Go int64 never matches them.
* A NUL byte reads like the end of the input to the lexer (``read()`` returns 0 at the end).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kproxy.cacher.selector_errors import SelectorError
from kproxy.gocompat.strconv import go_quote

__all__ = ["LabelSelector", "Requirement", "SelectorError", "parse_label_selector", "validate_label_value"]

# selection.Operator values (staging/src/k8s.io/apimachinery/pkg/selection/operator.go)
EXISTS = "exists"
DOES_NOT_EXIST = "!"
EQUALS = "="
DOUBLE_EQUALS = "=="
NOT_EQUALS = "!="
IN = "in"
NOT_IN = "notin"
GREATER_THAN = "gt"
LESS_THAN = "lt"
_BINARY_OPERATORS = (IN, NOT_IN, EQUALS, DOUBLE_EQUALS, NOT_EQUALS, GREATER_THAN, LESS_THAN)

# ---------------------------------------------------------------------------------------------------
# Validation: staging/src/k8s.io/apimachinery/pkg/api/validate/content/{kube,dns,errors}.go
# Go's regexp "$" only matches at the very end, hence fullmatch (Python's "$" also matches before "\n").

_LABEL_KEY_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_KEY_RE = re.compile(_LABEL_KEY_FMT, re.ASCII)
_LABEL_KEY_ERR = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
)
_LABEL_VALUE_FMT = "(" + _LABEL_KEY_FMT + ")?"
_LABEL_VALUE_RE = re.compile(_LABEL_VALUE_FMT, re.ASCII)
_LABEL_VALUE_ERR = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = _DNS1123_LABEL_FMT + "(\\." + _DNS1123_LABEL_FMT + ")*"
_DNS1123_SUBDOMAIN_RE = re.compile(_DNS1123_SUBDOMAIN_FMT, re.ASCII)
_DNS1123_SUBDOMAIN_ERR = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_MAX_LABEL = 63
_MAX_SUBDOMAIN = 253


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """content.RegexError: the message, examples joined by ``,  or``, and the regex."""
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    shown = ",  or ".join(f"'{e}'" for e in examples)
    return f"{msg} (e.g. {shown}, regex used for validation is '{fmt}')"


def _max_len_error(n: int) -> str:
    return f"must be no more than {n} bytes"


def _blen(s: str) -> int:
    """Go's len(): UTF-8 bytes."""
    return len(s.encode("utf-8", "surrogatepass"))


def _is_dns1123_subdomain(value: str) -> list[str]:
    errs: list[str] = []
    if _blen(value) > _MAX_SUBDOMAIN:
        errs.append(_max_len_error(_MAX_SUBDOMAIN))
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        errs.append(_regex_error(_DNS1123_SUBDOMAIN_ERR, _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errs


def _is_label_key(value: str) -> list[str]:
    """content.IsLabelKey: ``[prefix/]name``, prefix a DNS-1123 subdomain, name a 63-byte label."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in _is_dns1123_subdomain(prefix))
    else:
        return [
            "a valid label key "
            + _regex_error(_LABEL_KEY_ERR, _LABEL_KEY_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif _blen(name) > _MAX_LABEL:
        errs.append("name part " + _max_len_error(_MAX_LABEL))
    if not _LABEL_KEY_RE.fullmatch(name):
        errs.append("name part " + _regex_error(_LABEL_KEY_ERR, _LABEL_KEY_FMT, "MyName", "my.name", "123-abc"))
    return errs


def _is_label_value(value: str) -> list[str]:
    errs: list[str] = []
    if _blen(value) > _MAX_LABEL:
        errs.append(_max_len_error(_MAX_LABEL))
    if not _LABEL_VALUE_RE.fullmatch(value):
        errs.append(_regex_error(_LABEL_VALUE_ERR, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def validate_label_value(value: str) -> bool:
    """True when ``value`` is a label value the apiserver would store."""
    return not _is_label_value(value)


def _field_invalid(path: str, value: str, detail: str) -> str:
    """field.Invalid(...).Error(): ``<path>: Invalid value: "<value>": <detail>`` (nil path -> ``<nil>``)."""
    return f"{path or '<nil>'}: Invalid value: {go_quote(value)}: {detail}"


def _aggregate(errs: list[str]) -> str:
    """utilerrors.Aggregate.Error(): one message as is, several as ``[a, b]`` (duplicates dropped)."""
    seen: list[str] = []
    for e in errs:
        if e not in seen:
            seen.append(e)
    return seen[0] if len(seen) == 1 else "[" + ", ".join(seen) + "]"


# strconv.ParseInt(s, 10, 64): optional sign, ASCII digits, int64 range.
_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _parse_int64(s: str) -> int | None:
    if not _INT_RE.fullmatch(s):
        return None
    n = int(s)
    return n if _INT64_MIN <= n <= _INT64_MAX else None


# ---------------------------------------------------------------------------------------------------
# Requirements and the selector


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``key op values`` term; ``values`` sorted as ``sets.String.List()`` gives them."""

    key: str
    operator: str
    values: tuple[str, ...]

    def matcher(self) -> Callable[[Mapping[str, str]], bool]:
        """A closure doing ``Requirement.Matches`` for this term without re-inspecting the operator."""
        key, op = self.key, self.operator
        if op in (IN, EQUALS, DOUBLE_EQUALS):
            if len(self.values) == 1:
                want = self.values[0]
                return lambda ls: ls.get(key) == want
            allowed = frozenset(self.values)
            return lambda ls: key in ls and ls[key] in allowed
        if op in (NOT_IN, NOT_EQUALS):
            banned = frozenset(self.values)
            return lambda ls: key not in ls or ls[key] not in banned
        if op == EXISTS:
            return lambda ls: key in ls
        if op == DOES_NOT_EXIST:
            return lambda ls: key not in ls
        bound = _parse_int64(self.values[0])
        assert bound is not None  # NewRequirement rejected anything else
        greater = op == GREATER_THAN

        def compare(ls: Mapping[str, str]) -> bool:
            raw = ls.get(key)
            if raw is None:
                return False
            n = _parse_int64(raw)
            if n is None:
                return False
            return n > bound if greater else n < bound

        return compare

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self.matcher()(labels)


def _new_requirement(key: str, op: str, vals: list[str]) -> Requirement:
    """labels.NewRequirement: the key was validated by the parser; check the values for the operator."""
    errs: list[str] = []
    if op in (IN, NOT_IN):
        if not vals:
            errs.append(_field_invalid("values", "[]", "for 'in', 'notin' operators, values set can't be empty"))
    elif op in (EQUALS, DOUBLE_EQUALS, NOT_EQUALS):
        if len(vals) != 1:
            errs.append(_field_invalid("values", str(vals), "exact-match compatibility requires one single value"))
    elif op in (EXISTS, DOES_NOT_EXIST):
        if vals:
            errs.append(_field_invalid("values", str(vals), "values set must be empty for exists and does not exist"))
    elif op in (GREATER_THAN, LESS_THAN):
        if len(vals) != 1:
            errs.append(_field_invalid("values", str(vals), "for 'Gt', 'Lt' operators, exactly one value is required"))
        for i, v in enumerate(vals):
            if _parse_int64(v) is None:
                errs.append(_field_invalid(f"values[{i}]", v, "for 'Gt', 'Lt' operators, the value must be an integer"))
    for i, v in enumerate(vals):
        msgs = _is_label_value(v)
        if msgs:
            errs.append(_field_invalid(f"values[{i}][{key}]", v, "; ".join(msgs)))
    if errs:
        raise SelectorError(_aggregate(errs))
    return Requirement(key, op, tuple(vals))


class LabelSelector:
    """A parsed label selector: an AND of requirements, matched against an object's labels."""

    __slots__ = ("_matchers", "empty", "requirements")

    def __init__(self, requirements: tuple[Requirement, ...]) -> None:
        self.requirements = requirements
        self.empty = not requirements
        self._matchers = tuple(r.matcher() for r in requirements)

    def matches(self, labels: Mapping[str, str]) -> bool:
        for m in self._matchers:  # noqa: SIM110 (a plain loop: no generator per object)
            if not m(labels):
                return False
        return True

    def __repr__(self) -> str:
        return f"LabelSelector({self.requirements!r})"


# ---------------------------------------------------------------------------------------------------
# Lexer (Lexer, Token, string2token in selector.go).  Token names follow Go's.

_ERROR, _EOS, _CLOSED_PAR, _COMMA, _NOT, _DOUBLE_EQ, _EQ, _GT, _IDENT, _IN, _LT, _NOT_EQ, _NOT_IN, _OPEN_PAR = range(14)
_STRING2TOKEN = {
    ")": _CLOSED_PAR,
    ",": _COMMA,
    "!": _NOT,
    "==": _DOUBLE_EQ,
    "=": _EQ,
    ">": _GT,
    "in": _IN,
    "<": _LT,
    "!=": _NOT_EQ,
    "notin": _NOT_IN,
    "(": _OPEN_PAR,
}
_SPECIAL = frozenset("=!(),><")
_WHITESPACE = frozenset(" \t\r\n")
_NUL = "\x00"


def _lex(s: str) -> list[tuple[int, str]]:
    """Every token up to and including the first end-of-string token (Parser.scan)."""
    pos = 0
    n = len(s)
    out: list[tuple[int, str]] = []

    def read() -> str:
        nonlocal pos
        if pos < n:
            ch = s[pos]
            pos += 1
            return ch
        return _NUL

    while True:
        ch = read()
        while ch in _WHITESPACE:
            ch = read()
        if ch == _NUL:
            out.append((_EOS, ""))
            return out
        pos -= 1
        buf: list[str] = []
        if ch in _SPECIAL:
            # scanSpecialSymbol: the longest run of special characters that is still a token.
            last: tuple[int, str] | None = None
            while True:
                c = read()
                if c == _NUL:
                    break
                if c in _SPECIAL:
                    buf.append(c)
                    tok = _STRING2TOKEN.get("".join(buf))
                    if tok is not None:
                        last = (tok, "".join(buf))
                    elif last is not None:
                        pos -= 1
                        break
                else:
                    pos -= 1
                    break
            out.append(last if last is not None else (_ERROR, f"error expected: keyword found '{''.join(buf)}'"))
        else:
            # scanIDOrKeyword
            while True:
                c = read()
                if c == _NUL:
                    break
                if c in _SPECIAL or c in _WHITESPACE:
                    pos -= 1
                    break
                buf.append(c)
            word = "".join(buf)
            out.append((_STRING2TOKEN.get(word, _IDENT), word))


# ---------------------------------------------------------------------------------------------------
# Parser (Parser in selector.go)

_KEY_AND_OPERATOR, _VALUES = 0, 1


class _Parser:
    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.position = 0

    def lookahead(self, context: int) -> tuple[int, str]:
        tok, lit = self.items[self.position]
        if context == _VALUES and tok in (_IN, _NOT_IN):
            tok = _IDENT
        return tok, lit

    def consume(self, context: int) -> tuple[int, str]:
        self.position += 1
        tok, lit = self.items[self.position - 1]
        if context == _VALUES and tok in (_IN, _NOT_IN):
            tok = _IDENT
        return tok, lit

    def parse(self) -> list[Requirement]:
        requirements: list[Requirement] = []
        while True:
            tok, lit = self.lookahead(_VALUES)
            if tok in (_IDENT, _NOT):
                try:
                    requirements.append(self.parse_requirement())
                except SelectorError as err:
                    raise SelectorError(f"unable to parse requirement: {err.message}") from None
                t, lit2 = self.consume(_VALUES)
                if t == _EOS:
                    return requirements
                if t == _COMMA:
                    t2, l2 = self.lookahead(_VALUES)
                    if t2 not in (_IDENT, _NOT):
                        raise SelectorError(f"found '{l2}', expected: identifier after ','")
                else:
                    raise SelectorError(f"found '{lit2}', expected: ',' or 'end of string'")
            elif tok == _EOS:
                return requirements
            else:
                raise SelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")

    def parse_requirement(self) -> Requirement:
        key, op = self.parse_key_and_infer_operator()
        if op in (EXISTS, DOES_NOT_EXIST):
            return _new_requirement(key, op, [])
        op = self.parse_operator()
        values = self.parse_values() if op in (IN, NOT_IN) else self.parse_exact_value()
        return _new_requirement(key, op, sorted(values))

    def parse_key_and_infer_operator(self) -> tuple[str, str]:
        op = ""
        tok, literal = self.consume(_VALUES)
        if tok == _NOT:
            op = DOES_NOT_EXIST
            tok, literal = self.consume(_VALUES)
        if tok != _IDENT:
            raise SelectorError(f"found '{literal}', expected: identifier")
        errs = _is_label_key(literal)
        if errs:
            raise SelectorError(_field_invalid("", literal, "; ".join(errs)))
        t, _ = self.lookahead(_VALUES)
        if t in (_EOS, _COMMA) and op != DOES_NOT_EXIST:
            op = EXISTS
        return literal, op

    def parse_operator(self) -> str:
        tok, lit = self.consume(_KEY_AND_OPERATOR)
        op = {
            _IN: IN,
            _EQ: EQUALS,
            _DOUBLE_EQ: DOUBLE_EQUALS,
            _GT: GREATER_THAN,
            _LT: LESS_THAN,
            _NOT_IN: NOT_IN,
            _NOT_EQ: NOT_EQUALS,
        }.get(tok)
        if op is None:
            raise SelectorError(f"found '{lit}', expected: {', '.join(_BINARY_OPERATORS)}")
        return op

    def parse_values(self) -> set[str]:
        tok, lit = self.consume(_VALUES)
        if tok != _OPEN_PAR:
            raise SelectorError(f"found '{lit}' expected: '('")
        tok, lit = self.lookahead(_VALUES)
        if tok in (_IDENT, _COMMA):
            s = self.parse_identifiers_list()
            tok, _ = self.consume(_VALUES)
            if tok != _CLOSED_PAR:
                raise SelectorError(f"found '{lit}', expected: ')'")
            return s
        if tok == _CLOSED_PAR:
            self.consume(_VALUES)
            return {""}
        raise SelectorError(f"found '{lit}', expected: ',', ')' or identifier")

    def parse_identifiers_list(self) -> set[str]:
        s: set[str] = set()
        while True:
            tok, lit = self.consume(_VALUES)
            if tok == _IDENT:
                s.add(lit)
                tok2, lit2 = self.lookahead(_VALUES)
                if tok2 == _COMMA:
                    continue
                if tok2 == _CLOSED_PAR:
                    return s
                raise SelectorError(f"found '{lit2}', expected: ',' or ')'")
            if tok == _COMMA:
                if not s:
                    s.add("")
                tok2, _ = self.lookahead(_VALUES)
                if tok2 == _CLOSED_PAR:
                    s.add("")
                    return s
                if tok2 == _COMMA:
                    s.add("")
                continue
            raise SelectorError(f"found '{lit}', expected: ',', or identifier")

    def parse_exact_value(self) -> set[str]:
        tok, _ = self.lookahead(_VALUES)
        if tok in (_EOS, _COMMA):
            return {""}
        tok, lit = self.consume(_VALUES)
        if tok == _IDENT:
            return {lit}
        raise SelectorError(f"found '{lit}', expected: identifier")


@functools.lru_cache(maxsize=1024)
def parse_label_selector(text: str) -> LabelSelector:
    """``labels.Parse(text)``; raises :class:`SelectorError` with the apiserver's message when it would.

    Memoised (selectors are immutable and clients repeat the same few strings; errors are not cached)."""
    requirements = _Parser(text).parse()
    requirements.sort(key=lambda r: r.key)  # sort.Sort(ByKey(items)); order does not change matching
    return LabelSelector(tuple(requirements))
