"""Go's ``regexp`` (RE2 syntax, ``regexp.Compile`` flags) for patterns an operator writes, as Python ``re``.

kproxy takes regular expressions with the meaning ``kubectl proxy`` gives them (its ``--accept-hosts``,
``--reject-paths``, ... are compiled with Go's ``regexp.Compile`` and tried with ``MatchString``, an
unanchored search). Python's ``re`` reads some of the same text differently: ``$`` also matches before
a final newline (Go's, without ``(?m)``, only at the end of the text), ``\\d``, ``\\w``, ``\\s`` are
Unicode-aware (Go's are ASCII; Go's ``\\s`` has no ``\\v``), ``{,n}`` is a repeat (in Go, literal text),
and each accepts syntax the other refuses or reads otherwise (lookarounds and back-references; Go's
``\\pL``, ``[[:alpha:]]``, ``\\Q..\\E``, flag groups).

:func:`compile_go_regexp` accepts the subset of RE2 syntax whose meaning is the same in both, and
translates it to a Python pattern that matches exactly the strings Go's would; anything outside the
subset is refused with a :class:`ValueError` saying what (a config key naming the pattern is then
refused at load). The subset, ASCII only:

* literal characters; ``.``; ``^`` and ``$`` (start and end of the text, Go's default ``OneLine``);
  ``\\A`` and ``\\z``;
* escapes: ``\\`` before any ASCII punctuation; ``\\d \\D \\w \\W \\s \\S \\b \\B``;
  ``\\t \\n \\r \\f \\v \\a``;
* character classes ``[...]`` and ``[^...]`` of literals, ranges and the escapes above (``\\d \\w
  \\s`` but not their negations inside a class; ``[`` inside a class must be escaped);
* groups ``(...)`` and ``(?:...)``; alternation ``|``;
* repetition ``* + ? {n} {n,} {n,m}`` (counts up to Go's 1000), each optionally lazy (``?``), after
  something repeatable (not after another repetition, an anchor or a group opening).

Both engines then see the same strings: text kproxy matches is ``str`` whose non-UTF-8 bytes are one
``surrogateescape`` code point each, as Go sees each such byte as one ``utf8.RuneError``; an ASCII
pattern treats both alike (``.`` and negated classes match them, nothing else does).
"""

from __future__ import annotations

import re
import string

__all__ = ["compile_go_regexp", "translate"]

#: ``syntax.maxRepeat`` in Go's regexp/syntax/parse.go.
_MAX_REPEAT = 1000
_PUNCT = frozenset(string.punctuation)
# Escapes that mean the same in both engines once Python runs with re.ASCII.
_SAME = frozenset("dDwWtnrfva")
_GO_SPACE = r"\t\n\f\r "  # Go's \s: [\t\n\f\r ] (perl_groups.go), Python's ASCII \s adds \v
_REPEAT = re.compile(r"\{(\d+)(,(\d*))?\}")


def compile_go_regexp(pattern: str) -> re.Pattern[str]:
    """A Python pattern that ``search``-es exactly as Go's ``regexp.MustCompile(pattern).MatchString``."""
    return re.compile(translate(pattern), re.ASCII)


def translate(pattern: str) -> str:
    """The Python spelling of ``pattern`` (compile with ``re.ASCII``); ValueError outside the subset."""
    if not pattern.isascii():
        raise ValueError(f"{pattern!r}: only ASCII patterns are supported")
    out: list[str] = []
    repeatable = False
    depth = 0
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            piece, repeatable = _escape(pattern, i)
            out.append(piece)
            i += 2
        elif c == "[":
            piece, i = _char_class(pattern, i)
            out.append(piece)
            repeatable = True
        elif c == "(":
            if pattern.startswith("(?", i):
                if not pattern.startswith("(?:", i):
                    raise ValueError(f"{pattern!r}: only (...) and (?:...) groups are supported")
                out.append("(?:")
                i += 3
            else:
                out.append("(")
                i += 1
            depth += 1
            repeatable = False
        elif c == ")":
            if depth == 0:
                raise ValueError(f"{pattern!r}: unexpected )")
            depth -= 1
            out.append(")")
            repeatable = True
            i += 1
        elif c == "|":
            out.append("|")
            repeatable = False
            i += 1
        elif c in "*+?" or (c == "{" and _REPEAT.match(pattern, i)):
            if not repeatable:
                raise ValueError(f"{pattern!r}: repetition {c!r} at offset {i} has nothing it may repeat")
            if c == "{":
                m = _REPEAT.match(pattern, i)
                assert m is not None
                lo, hi = m.group(1), m.group(3)
                if int(lo) > _MAX_REPEAT or (hi and int(hi) > _MAX_REPEAT) or (hi and int(hi) < int(lo)):
                    raise ValueError(f"{pattern!r}: invalid repeat count {m.group(0)}")
                out.append(m.group(0))
                i = m.end()
            else:
                out.append(c)
                i += 1
            if i < n and pattern[i] == "?":
                out.append("?")
                i += 1
            repeatable = False
        elif c == "^":
            out.append(r"\A")
            repeatable = False
            i += 1
        elif c == "$":
            out.append(r"\Z")
            repeatable = False
            i += 1
        elif c == ".":
            out.append(".")
            repeatable = True
            i += 1
        else:
            out.append(re.escape(c))
            repeatable = True
            i += 1
    if depth:
        raise ValueError(f"{pattern!r}: missing )")
    return "".join(out)


def _escape(pattern: str, i: int) -> tuple[str, bool]:
    """A backslash escape outside a class: its Python spelling and whether it may be repeated."""
    if i + 1 >= len(pattern):
        raise ValueError(f"{pattern!r}: trailing backslash")
    e = pattern[i + 1]
    if e in _PUNCT:
        return "\\" + e, True
    if e in _SAME:
        return "\\" + e, True
    if e == "s":
        return f"[{_GO_SPACE}]", True
    if e == "S":
        return f"[^{_GO_SPACE}]", True
    if e in "bB":
        return "\\" + e, False
    if e == "A":
        return r"\A", False
    if e == "z":
        return r"\Z", False
    raise ValueError(f"{pattern!r}: escape \\{e} is not supported")


def _char_class(pattern: str, start: int) -> tuple[str, int]:
    """``[...]`` from ``start``: its Python spelling (every literal escaped) and the offset after it."""
    n = len(pattern)
    i = start + 1
    out = ["["]
    if i < n and pattern[i] == "^":
        out.append("^")
        i += 1
    first = True
    while True:
        if i >= n:
            raise ValueError(f"{pattern!r}: missing ] in character class")
        c = pattern[i]
        if c == "]" and not first:
            out.append("]")
            return "".join(out), i + 1
        first = False
        if c == "[":
            raise ValueError(f"{pattern!r}: [ inside a character class must be escaped (\\[)")
        if c == "\\" and i + 1 < n and pattern[i + 1] in "dwsDWS":
            e = pattern[i + 1]
            if e in "DWS":
                raise ValueError(f"{pattern!r}: \\{e} inside a character class is not supported")
            out.append(_GO_SPACE if e == "s" else "\\" + e)
            i += 2
            continue
        lo, i = _class_char(pattern, i)
        if i + 1 < n and pattern[i] == "-" and pattern[i + 1] != "]":
            hi, i = _class_char(pattern, i + 1)
            if hi < lo:
                raise ValueError(f"{pattern!r}: invalid character class range {lo}-{hi}")
            out.append(f"{re.escape(lo)}-{re.escape(hi)}")
        else:
            out.append(re.escape(lo) if lo.isalnum() else "\\" + lo)


_CONTROL = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}


def _class_char(pattern: str, i: int) -> tuple[str, int]:
    """One character of a class (a literal or an escaped one) and the offset after it."""
    c = pattern[i]
    if c != "\\":
        return c, i + 1
    if i + 1 >= len(pattern):
        raise ValueError(f"{pattern!r}: trailing backslash")
    e = pattern[i + 1]
    if e in _PUNCT:
        return e, i + 2
    if e in _CONTROL:
        return _CONTROL[e], i + 2
    raise ValueError(f"{pattern!r}: escape \\{e} is not supported in a character class")
