"""The clean check compiled to Python source, once per schema root.

Most bodies have no unknown field, and for them the check is the whole per-request cost beyond
parsing. ``validator._clean`` walks the node tree generically (a call per node, attribute
look-ups, a set built per object). Here the tree becomes generated code with the key sets bound
as constants: an object is one C-level ``keys() <= KEYS`` plus a ``get`` per child that can hold
objects (one set intersection when there are many such children), and lists, maps and nested
objects are inlined as loops and blocks of the same function. Recursive types and very deep
schemas fall back to calls. The generated code answers exactly what ``_clean`` answers (the unit
tests compare them on random bodies, both ways of visiting children).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kproxy.codegen import generate
from kproxy.filters.validation.schemanodes import LIST, MAP, OBJECT, Node

CleanCheck = Callable[[Any], bool]
_INTERSECT_ABOVE = 6  # children holding objects: above this, intersect key sets instead of get()
_INLINE_DEPTH = 8  # nesting inlined into one function before a call


class _Gen:
    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.consts: dict[str, Any] = {}
        self.pending: list[Node] = []
        self.lines: list[str] = []
        self.tables: list[dict[str, Any]] = []
        self.vars = 0

    def fn(self, node: Node) -> str:
        name = self.names.get(id(node))
        if name is None:
            name = self.names[id(node)] = f"f{len(self.names)}"
            self.pending.append(node)
        return name

    def const(self, value: Any) -> str:
        name = f"k{len(self.consts)}"
        self.consts[name] = value
        return name

    def var(self) -> str:
        self.vars += 1
        return f"x{self.vars}"

    def node(self, node: Node, var: str, pad: str, chain: tuple[int, ...], out: list[str]) -> None:
        """Code that returns False from the function when ``var`` has an unknown field."""
        if len(chain) >= _INLINE_DEPTH or id(node) in chain:
            out.append(f"{pad}if not {self.fn(node)}({var}): return False")
            return
        chain = (*chain, id(node))
        if node.kind == OBJECT:
            out.append(f"{pad}if type({var}) is dict:")
            inner = pad + "    "
            body_start = len(out)
            if not node.preserve:
                out.append(f"{inner}if not {var}.keys() <= {self.const(node.keyset)}: return False")
            children = node.containers
            if len(children) > _INTERSECT_ABOVE:
                table: dict[str, Any] = {k: self.fn(c) for k, c in children.items()}  # bound after exec
                self.tables.append(table)
                out.append(f"{inner}for k in {var}.keys() & {self.const(frozenset(children))}:")
                out.append(f"{inner}    if not {self.const(table)}[k]({var}[k]): return False")
            else:
                for key, child in children.items():
                    x = self.var()
                    out.append(f"{inner}{x} = {var}.get({key!r})")
                    out.append(f"{inner}if {x} is not None:")
                    self.node(child, x, inner + "    ", chain, out)
            if len(out) == body_start:
                out.append(f"{inner}pass")
        elif node.kind in (MAP, LIST):
            assert node.item is not None
            x = self.var()
            if node.kind == MAP:
                out.append(f"{pad}if type({var}) is dict:")
                out.append(f"{pad}    for {x} in {var}.values():")
            else:
                out.append(f"{pad}if type({var}) is list:")
                out.append(f"{pad}    for {x} in {var}:")
            self.node(node.item, x, pad + "        ", chain, out)
        else:
            out.append(f"{pad}pass")

    def function(self, node: Node) -> None:
        name = self.names[id(node)]
        self.lines.append(f"def {name}(v):")
        self.node(node, "v", "    ", (), self.lines)
        self.lines.append("    return True")


def compile_clean(root: Node, name: str = "schema") -> CleanCheck:
    """A function telling whether a decoded body certainly has no unknown field under ``root``;
    the generated module is ``kproxy.filters.validation.fastcheck:<name>`` (``name@<digest>``
    when another schema took the name first)."""
    if root.kind not in (OBJECT, MAP, LIST):
        return lambda _v: True
    gen = _Gen()
    gen.fn(root)
    while gen.pending:
        gen.function(gen.pending.pop())
    namespace: dict[str, Any] = dict(gen.consts)
    # The source holds only generated names and repr()s of schema property names.
    generate(f"kproxy.filters.validation.fastcheck:{name}", gen.lines, namespace)
    for table in gen.tables:
        for key, fname in table.items():
            table[key] = namespace[fname]
    return namespace[gen.names[id(root)]]  # type: ignore[no-any-return]
