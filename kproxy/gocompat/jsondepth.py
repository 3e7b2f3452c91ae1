"""The nesting limit of Go's JSON decoder, for values kproxy decoded by other means.

``encoding/json`` (and its fork sigs.k8s.io/json, which the apiserver decodes bodies with) checks
the whole input before decoding it, and its scanner refuses a value nested deeper than
``maxNestingDepth`` (10000): ``invalid character '[' exceeded max depth``, naming the byte that
opened the 10001st level (scanner.go ``pushParseState``). A YAML body reaches that decoder as the
JSON that sigs.k8s.io/yaml made of it, and go-yaml's own limits (10000 flow levels, 10000
indentations, aliases) let it be deeper than that: :func:`nesting_error` says what the decoder
then answers, from the decoded value and without recursion.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_NESTING_DEPTH", "nesting_error"]

#: scanner.go ``maxNestingDepth``.
MAX_NESTING_DEPTH = 10000


def nesting_error(value: Any, depth: int) -> str | None:
    """Go's syntax error for the JSON encoding of ``value`` (whose nesting is ``depth``; mappings
    with their keys sorted, as Go writes them), or None when it is within the limit."""
    if depth <= MAX_NESTING_DEPTH:
        return None
    # Depth first, in the order the encoder writes: the first container at level 10001 is the
    # byte the scanner stops at.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        if level > MAX_NESTING_DEPTH:
            opener = "{" if isinstance(item, dict) else "["
            return f"invalid character '{opener}' exceeded max depth"
        stack.extend((child, level + 1) for child in reversed(children))
    return None
