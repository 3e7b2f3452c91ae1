"""The clean check compiled to Python source, once per schema root.

Most bodies have no unknown field, and for them the check is the whole per-request cost beyond
parsing. ``validator._clean`` walks the node tree generically (attribute look-ups, a set built
per object); here every node that can hold checked objects becomes one small generated
function with its key set and its children bound as constants: an object is one C-level
``keys() <= KEYS`` plus a ``get`` per child that holds objects (or, for objects with many such
children, one set intersection). The generated functions answer exactly what ``_clean`` answers
(the unit tests compare them on random bodies).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kproxy.validation.schema import LIST, MAP, OBJECT, Node

CleanCheck = Callable[[Any], bool]
_INTERSECT_ABOVE = 6  # children holding objects: above this, intersect key sets instead of get()


def compile_clean(root: Node) -> CleanCheck:
    """A function telling whether a decoded body certainly has no unknown field under ``root``."""
    names: dict[int, str] = {}
    consts: dict[str, Any] = {}
    lines: list[str] = []
    pending: list[Node] = []

    def fn(node: Node) -> str:
        name = names.get(id(node))
        if name is None:
            name = names[id(node)] = f"f{len(names)}"
            pending.append(node)
        return name

    def const(value: Any) -> str:
        name = f"k{len(consts)}"
        consts[name] = value
        return name

    def emit(node: Node) -> None:
        name = names[id(node)]
        if node.kind == OBJECT:
            lines.append(f"def {name}(v):")
            lines.append("    if type(v) is not dict: return True")
            if not node.preserve:
                lines.append(f"    if not v.keys() <= {const(node.keyset)}: return False")
            children = node.containers
            if len(children) > _INTERSECT_ABOVE:
                table: dict[str, Any] = {k: fn(c) for k, c in children.items()}  # names, bound after exec
                lines.append(f"    d = {const(table)}")
                lines.append(f"    for k in v.keys() & {const(frozenset(children))}:")
                lines.append("        if not d[k](v[k]): return False")
                tables.append(table)
            else:
                for key, child in children.items():
                    lines.append(f"    x = v.get({key!r})")
                    lines.append(f"    if x is not None and not {fn(child)}(x): return False")
            lines.append("    return True")
        elif node.kind == MAP:
            assert node.item is not None
            lines.append(f"def {name}(v):")
            lines.append("    if type(v) is not dict: return True")
            lines.append("    for x in v.values():")
            lines.append(f"        if not {fn(node.item)}(x): return False")
            lines.append("    return True")
        else:
            assert node.kind == LIST and node.item is not None
            lines.append(f"def {name}(v):")
            lines.append("    if type(v) is not list: return True")
            lines.append("    for x in v:")
            lines.append(f"        if not {fn(node.item)}(x): return False")
            lines.append("    return True")

    tables: list[dict[str, Any]] = []
    if root.kind not in (OBJECT, MAP, LIST):
        return lambda _v: True
    fn(root)
    while pending:
        emit(pending.pop())
    namespace: dict[str, Any] = dict(consts)
    exec(compile("\n".join(lines), "<kproxy.validation.fastcheck>", "exec"), namespace)
    for table in tables:
        for key, fname in table.items():
            table[key] = namespace[fname]
    return namespace[names[id(root)]]  # type: ignore[no-any-return]
