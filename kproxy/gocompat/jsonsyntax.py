"""The syntax errors of Go's ``encoding/json``, word for word.

The apiserver decodes a body's apiVersion and kind with ``encoding/json`` before anything else, and
a body that is not JSON gets that package's message in its 400 ("couldn't get version/kind; json
parse error: invalid character 'n' looking for beginning of object key string"). Where kproxy must
refuse such a body itself (the ``dryrun`` filter cannot forward a DELETE body it cannot read), it
says what the apiserver would. This is Go's scanner (``encoding/json/scanner.go``) as a table of
states: the first byte it refuses and the context it names, or ``unexpected end of JSON input``.
"""

from __future__ import annotations

from collections.abc import Callable

_SPACE = frozenset(b" \t\r\n")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'bfnrt\\/"')
#: Nesting Go's scanner allows before "exceeded max depth".
_MAX_DEPTH = 10000

# What a value in progress belongs to.
_OBJECT_KEY, _OBJECT_VALUE, _ARRAY_VALUE = 0, 1, 2


class _Error(Exception):
    pass


def quote_char(c: int) -> str:
    """Go's ``quoteChar``: the byte as ``strconv.Quote`` writes the rune of that value, in single quotes."""
    if c == 0x27:
        return "'\\''"
    if c == 0x22:
        return "'\"'"
    r = chr(c)
    if r == "\\":
        return "'\\\\'"
    if r.isprintable():
        return f"'{r}'"
    named = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v"}
    if c in named:
        return f"'{named[c]}'"
    if c < 0x20 or c == 0x7F:
        return f"'\\x{c:02x}'"
    return f"'\\u{c:04x}'"


class _Scanner:
    """One pass over the bytes; ``step`` is the state function for the next byte."""

    def __init__(self) -> None:
        self.stack: list[int] = []
        self.end_top = False
        self.step: Callable[[int], None] = self.begin_value

    def fail(self, c: int, context: str) -> None:
        raise _Error(f"invalid character {quote_char(c)} {context}")

    def push(self, kind: int, c: int) -> None:
        self.stack.append(kind)
        if len(self.stack) > _MAX_DEPTH:
            self.fail(c, "exceeded max depth")  # scanner.go pushParseState

    # -- values
    def begin_value_or_empty(self, c: int) -> None:
        if c in _SPACE:
            return
        if c == 0x5D:  # ]
            self.end_value(c)
            return
        self.begin_value(c)

    def begin_value(self, c: int) -> None:
        if c in _SPACE:
            return
        if c == 0x7B:  # {
            self.step = self.begin_string_or_empty
            self.push(_OBJECT_KEY, c)
        elif c == 0x5B:  # [
            self.step = self.begin_value_or_empty
            self.push(_ARRAY_VALUE, c)
        elif c == 0x22:
            self.step = self.in_string
        elif c == 0x2D:  # -
            self.step = self.neg
        elif c == 0x30:
            self.step = self.zero
        elif c in _DIGITS:
            self.step = self.one
        elif c in b"tfn":
            self.step = self.literal({0x74: b"true", 0x66: b"false", 0x6E: b"null"}[c], 1)
        else:
            self.fail(c, "looking for beginning of value")

    def begin_string_or_empty(self, c: int) -> None:
        if c in _SPACE:
            return
        if c == 0x7D:  # }
            self.stack[-1] = _OBJECT_VALUE
            self.end_value(c)
            return
        self.begin_string(c)

    def begin_string(self, c: int) -> None:
        if c in _SPACE:
            return
        if c == 0x22:
            self.step = self.in_string
            return
        self.fail(c, "looking for beginning of object key string")

    def end_value(self, c: int) -> None:
        if not self.stack:
            self.step = self.end_top_state
            self.end_top = True
            self.end_top_state(c)
            return
        if c in _SPACE:
            self.step = self.end_value
            return
        kind = self.stack[-1]
        if kind == _OBJECT_KEY:
            if c == 0x3A:  # :
                self.stack[-1] = _OBJECT_VALUE
                self.step = self.begin_value
                return
            self.fail(c, "after object key")
        elif kind == _OBJECT_VALUE:
            if c == 0x2C:  # ,
                self.stack[-1] = _OBJECT_KEY
                self.step = self.begin_string
                return
            if c == 0x7D:
                self.pop()
                return
            self.fail(c, "after object key:value pair")
        else:
            if c == 0x2C:
                self.step = self.begin_value
                return
            if c == 0x5D:
                self.pop()
                return
            self.fail(c, "after array element")

    def pop(self) -> None:
        self.stack.pop()
        if not self.stack:
            self.step = self.end_top_state
            self.end_top = True
        else:
            self.step = self.end_value

    def end_top_state(self, c: int) -> None:
        if c not in _SPACE:
            self.fail(c, "after top-level value")

    # -- strings
    def in_string(self, c: int) -> None:
        if c == 0x22:
            self.step = self.end_value
        elif c == 0x5C:
            self.step = self.in_string_esc
        elif c < 0x20:
            self.fail(c, "in string literal")

    def in_string_esc(self, c: int) -> None:
        if c in _ESCAPES:
            self.step = self.in_string
        elif c == 0x75:  # u
            self.step = self.hex_digit(4)
        else:
            self.fail(c, "in string escape code")

    def hex_digit(self, left: int) -> Callable[[int], None]:
        def state(c: int) -> None:
            if c not in _HEX:
                self.fail(c, "in \\u hexadecimal character escape")
            self.step = self.in_string if left == 1 else self.hex_digit(left - 1)

        return state

    # -- numbers
    def neg(self, c: int) -> None:
        if c == 0x30:
            self.step = self.zero
        elif c in _DIGITS:
            self.step = self.one
        else:
            self.fail(c, "in numeric literal")

    def one(self, c: int) -> None:
        if c in _DIGITS:
            return
        self.zero(c)

    def zero(self, c: int) -> None:
        if c == 0x2E:  # .
            self.step = self.dot
        elif c in b"eE":
            self.step = self.exp
        else:
            self.end_value(c)

    def dot(self, c: int) -> None:
        if c in _DIGITS:
            self.step = self.dot0
            return
        self.fail(c, "after decimal point in numeric literal")

    def dot0(self, c: int) -> None:
        if c in _DIGITS:
            return
        if c in b"eE":
            self.step = self.exp
            return
        self.end_value(c)

    def exp(self, c: int) -> None:
        if c in b"+-":
            self.step = self.exp_sign
            return
        self.exp_sign(c)

    def exp_sign(self, c: int) -> None:
        if c in _DIGITS:
            self.step = self.exp0
            return
        self.fail(c, "in exponent of numeric literal")

    def exp0(self, c: int) -> None:
        if c in _DIGITS:
            return
        self.end_value(c)

    # -- true, false, null
    def literal(self, word: bytes, at: int) -> Callable[[int], None]:
        def state(c: int) -> None:
            if c != word[at]:
                self.fail(c, f"in literal {word.decode()} (expecting {quote_char(word[at])})")
            self.step = self.end_value if at == len(word) - 1 else self.literal(word, at + 1)

        return state


def syntax_error(data: bytes) -> str | None:
    """The message of the ``SyntaxError`` Go's ``json.Unmarshal`` returns for ``data``, or None
    when ``data`` is syntactically valid JSON (as Go's scanner sees it: it does not check UTF-8)."""
    scanner = _Scanner()
    try:
        for c in data:
            scanner.step(c)
        if not scanner.end_top:
            scanner.step(0x20)  # Go's eof(): a number ends at a space
        if not scanner.end_top:
            return "unexpected end of JSON input"
    except _Error as err:
        return str(err)
    return None
