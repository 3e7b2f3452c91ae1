"""OpenAPI v3 documents compiled once into ``Node`` trees that the validator walks.

Compiling turns every ``$ref``/``allOf`` indirection and every ``x-kubernetes-*`` extension into
plain attributes, so that validating a request is a walk over small slotted objects and dict
look-ups, never a schema interpretation per request. A group-version document is indexed when
it is loaded (which resource and subresource take which kind) and each kind is compiled on
first use, then kept.

Two families of documents behave differently at the apiserver and are compiled differently:
built-in types are decoded into Go structs (an object without declared properties, such as
``RawExtension``, accepts anything), custom resources are pruned by their structural schema
(an object without properties and without ``x-kubernetes-preserve-unknown-fields`` keeps
nothing). ``GroupVersionSchemas.custom`` says which one a document is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ANY, OBJECT, MAP, LIST, SCALAR = range(5)

_SCALAR_TYPES: dict[str, frozenset[type]] = {
    "string": frozenset({str}),
    "integer": frozenset({int}),
    "number": frozenset({int, float}),
    "boolean": frozenset({bool}),
}
_INT_OR_STRING = frozenset({int, str})


class Base64(str):
    """Marker type: a ``format: byte`` string, which Go decodes as base64 into ``[]byte``."""

    __slots__ = ()


_BYTES = frozenset({Base64})
_REF_PREFIX = "#/components/schemas/"
CRD_DOC_TITLE = "Kubernetes CRD Swagger"


class Node:
    """One compiled schema node.

    ``kind`` is ANY (accept anything below), OBJECT (``props`` are the declared fields;
    ``preserve`` keeps unknown ones), MAP (``item`` for every value), LIST (``item`` for every
    element) or SCALAR (``types`` are the Python types the Go decoder accepts; ``None`` always is).
    ``embedded`` marks ``x-kubernetes-embedded-resource`` objects (their ``metadata`` is checked as
    ObjectMeta, ``apiVersion`` and ``kind`` are implied).
    """

    __slots__ = (
        "check",
        "containers",
        "embedded",
        "fast",
        "item",
        "keyset",
        "kind",
        "meta",
        "preserve",
        "props",
        "types",
    )

    def __init__(self) -> None:
        self.kind = ANY
        self.props: dict[str, Node] = {}
        self.item: Node | None = None
        self.types: frozenset[type] = frozenset()
        self.preserve = False
        self.embedded = False
        self.meta: Node | None = None  # the ObjectMeta node for embedded resources
        # Filled by ``finish``: the keys an OBJECT accepts and the children worth descending into.
        self.keyset: frozenset[str] = frozenset()
        self.containers: dict[str, Node] = {}
        self.check: Callable[[Any], bool] | None = None  # the compiled clean check, for roots
        # The msgspec clean check (``structs``), for roots: the body's (apiVersion, kind) when proven clean.
        self.fast: Callable[[bytes], tuple[str | None, str | None] | None] | None = None

    def __repr__(self) -> str:
        names = ("ANY", "OBJECT", "MAP", "LIST", "SCALAR")
        return f"Node({names[self.kind]}, props={sorted(self.props)})"


@dataclass(slots=True)
class Endpoint:
    """What a resource (or subresource) path accepts as a body."""

    group: str
    version: str
    kind: str
    ref: str  # component schema name
    #: The writes the apiserver routes here, as (namespaced, named, method) from the document's
    #: paths: a write to another shape of path (a cluster-scoped resource under a namespace, a
    #: POST naming an object, a PUT to a collection) is its 404 or 405, answered before decoding.
    routes: frozenset[tuple[bool, bool, str]] = frozenset()

    def routes_to(self, namespaced: bool, named: bool, method: str) -> bool:
        return (namespaced, named, method) in self.routes

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclass(slots=True)
class GroupVersionSchemas:
    """One ``/openapi/v3/<gv>`` document: its endpoints, and nodes compiled on demand."""

    custom: bool
    endpoints: dict[tuple[str, str], Endpoint]
    schemas: dict[str, Any]
    compiled: dict[str, Node] = field(default_factory=dict)

    def endpoint(self, resource: str, subresource: str = "") -> Endpoint | None:
        return self.endpoints.get((resource, subresource))

    def node(self, ref: str) -> Node:
        """The compiled node of a component schema (compiled once)."""
        node = self.compiled.get(ref)
        if node is None:
            node = _Compiler(self.schemas, self.custom, self.compiled).ref(ref)
            finish(node)
        return node

    def object_meta(self) -> Node | None:
        name = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        return self.node(name) if name in self.schemas else None


def load_group_version(doc: dict[str, Any]) -> GroupVersionSchemas:
    """Index a parsed OpenAPI v3 group-version document (nothing is compiled yet)."""
    custom = doc.get("info", {}).get("title") == CRD_DOC_TITLE
    endpoints: dict[tuple[str, str], Endpoint] = {}
    routes: dict[tuple[str, str], set[tuple[bool, bool, str]]] = {}
    for path, item in (doc.get("paths") or {}).items():
        key = _resource_key(path)
        if key is None:
            continue
        shape = _path_shape(path)
        for method in ("post", "put"):
            if item.get(method):
                routes.setdefault(key, set()).add((*shape, method.upper()))
        for method in ("post", "put"):
            op = item.get(method)
            if not op:
                continue
            gvk = op.get("x-kubernetes-group-version-kind")
            ref = _body_ref(op)
            if gvk and ref:
                endpoints[key] = Endpoint(gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", ""), ref)
                break
        else:
            op = item.get("patch")
            if op and (gvk := op.get("x-kubernetes-group-version-kind")) and key not in endpoints:
                ref = _kind_ref(doc, gvk)
                if ref:
                    endpoints[key] = Endpoint(gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", ""), ref)
    for key, endpoint in endpoints.items():
        endpoint.routes = frozenset(routes.get(key, ()))
    schemas = (doc.get("components") or {}).get("schemas") or {}
    return GroupVersionSchemas(custom, endpoints, schemas)


def _path_shape(path: str) -> tuple[bool, bool]:
    """(namespaced, named) of a resource path: ``{namespace}`` and ``{name}`` segments in it."""
    segs = path.strip("/").split("/")
    return "{namespace}" in segs, "{name}" in segs


def _resource_key(path: str) -> tuple[str, str] | None:
    segs = path.strip("/").split("/")
    if segs[:2] == ["api", "v1"]:
        segs = segs[2:]
    elif segs and segs[0] == "apis" and len(segs) >= 3:
        segs = segs[3:]
    else:
        return None
    if len(segs) > 2 and segs[0] == "namespaces" and segs[1] == "{namespace}":
        segs = segs[2:]
    if not segs or segs[0].startswith("{") or segs[0] == "watch":
        return None
    if len(segs) == 1:
        return (segs[0], "")
    if len(segs) == 2 and segs[1] == "{name}":
        return (segs[0], "")
    if len(segs) == 3 and segs[1] == "{name}":
        return (segs[0], segs[2])
    return None


def _body_ref(op: dict[str, Any]) -> str | None:
    content = ((op.get("requestBody") or {}).get("content")) or {}
    for media in content.values():
        ref = (media.get("schema") or {}).get("$ref", "")
        if ref.startswith(_REF_PREFIX):
            return str(ref[len(_REF_PREFIX) :])
    return None


def _kind_ref(doc: dict[str, Any], gvk: dict[str, str]) -> str | None:
    for name, schema in ((doc.get("components") or {}).get("schemas") or {}).items():
        for candidate in schema.get("x-kubernetes-group-version-kind") or ():
            if candidate == gvk:
                return str(name)
    return None


class _Compiler:
    """Turns schema dicts into Nodes; recursive types (JSONSchemaProps) share one node."""

    def __init__(self, schemas: dict[str, Any], custom: bool, memo: dict[str, Node]) -> None:
        self.schemas = schemas
        self.custom = custom
        self.memo = memo

    def ref(self, name: str) -> Node:
        node = self.memo.get(name)
        if node is not None:
            return node
        node = Node()
        self.memo[name] = node
        # Types the apiserver itself defines (ObjectMeta inside a custom resource) are decoded
        # into Go structs; only the CRD's own schema is pruned structurally.
        outer = self.custom
        self.custom = outer and not name.startswith("io.k8s.")
        try:
            self._fill(node, self.schemas.get(name) or {})
        finally:
            self.custom = outer
        return node

    def compile(self, schema: dict[str, Any]) -> Node:
        target = _alias(schema)
        if target is not None:
            return self.ref(target)
        node = Node()
        self._fill(node, schema)
        return node

    def _flatten(self, schema: dict[str, Any]) -> dict[str, Any]:
        """``$ref`` and ``allOf`` merged into one dict (the outer keys win)."""
        out: dict[str, Any] = {}
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF_PREFIX):
            out.update(self._flatten(self.schemas.get(ref[len(_REF_PREFIX) :]) or {}))
        for part in schema.get("allOf") or ():
            out.update(self._flatten(part))
        out.update({k: v for k, v in schema.items() if k not in ("$ref", "allOf")})
        return out

    def _fill(self, node: Node, raw: dict[str, Any]) -> None:
        schema = self._flatten(raw)
        node.preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        node.embedded = bool(schema.get("x-kubernetes-embedded-resource"))
        if schema.get("x-kubernetes-int-or-string") or schema.get("format") == "int-or-string":
            node.kind, node.types = SCALAR, _INT_OR_STRING
            return
        one_of = schema.get("oneOf") or schema.get("anyOf")
        typ = schema.get("type")
        if typ is None and one_of:
            types: set[type] = set()
            for alt in one_of:
                types |= _SCALAR_TYPES.get(self._flatten(alt).get("type", ""), frozenset())
            if types:
                node.kind, node.types = SCALAR, frozenset(types)
            return
        props = schema.get("properties")
        additional = schema.get("additionalProperties")
        if typ == "array":
            node.kind = LIST
            node.item = self.compile(schema.get("items") or {})
        elif typ in _SCALAR_TYPES:
            node.kind, node.types = SCALAR, _SCALAR_TYPES[typ]
            if typ == "string" and schema.get("format") == "byte" and not self.custom:
                node.types = _BYTES
        elif props or (typ == "object" and self.custom and not node.preserve and not isinstance(additional, dict)):
            node.kind = OBJECT
            node.props = {k: self.compile(v) for k, v in (props or {}).items()}
        elif isinstance(additional, dict):
            node.kind = MAP
            node.item = self.compile(additional)
        if node.embedded:
            node.kind = OBJECT
            for name in ("apiVersion", "kind"):
                node.props.setdefault(name, _any())
            node.props.pop("metadata", None)
            if "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in self.schemas:
                node.meta = self.ref("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")


def finish(root: Node) -> None:
    """Precompute ``keyset`` and ``containers`` on every node reachable from ``root`` (once the
    whole tree is compiled, recursive references included)."""
    stack = [root]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.kind == OBJECT:
            extra = {"metadata"} if node.embedded and node.meta is not None else set()
            node.keyset = frozenset(node.props) | frozenset(extra)
            node.containers = {k: c for k, c in node.props.items() if _holds_objects(c)}
            if extra and node.meta is not None:
                node.containers["metadata"] = node.meta
        stack.extend(node.props.values())
        if node.item is not None:
            stack.append(node.item)
        if node.meta is not None:
            stack.append(node.meta)


def _holds_objects(node: Node) -> bool:
    """Whether a value of this node can contain an object whose keys are checked (maps of
    strings and lists of scalars cannot: the clean check does not descend into them)."""
    seen: set[int] = set()
    while node.kind in (MAP, LIST) and node.item is not None and id(node) not in seen:
        seen.add(id(node))
        node = node.item
    return node.kind == OBJECT or id(node) in seen


def _any() -> Node:
    return Node()


_SHAPING = ("properties", "type", "additionalProperties", "items", "oneOf", "anyOf", "format")
_EXTENSIONS = ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string")


def _alias(schema: dict[str, Any]) -> str | None:
    """The component a schema only points at (``$ref``, or ``allOf: [{$ref}]`` plus description
    and default), so that every use shares one compiled node and recursion terminates."""
    ref = schema.get("$ref")
    parts = schema.get("allOf")
    if ref is None and parts and len(parts) == 1 and set(parts[0]) == {"$ref"}:
        ref = parts[0]["$ref"]
    elif ref is None or parts:
        return None
    if not isinstance(ref, str) or not ref.startswith(_REF_PREFIX):
        return None
    if any(k in schema for k in _SHAPING) or any(schema.get(k) for k in _EXTENSIONS):
        return None
    return ref[len(_REF_PREFIX) :]


def no_schema_root() -> Node:
    """The root of a custom resource version the CRD does not define: the apiserver prunes it
    with no schema (``structuralSchemas[version]`` is nil), keeping ``apiVersion``, ``kind`` and
    ``metadata`` only (the resource root is an embedded resource)."""
    root = Node()
    root.kind = OBJECT
    for name in ("apiVersion", "kind"):
        prop = Node()
        prop.kind = SCALAR
        prop.types = frozenset({str})
        root.props[name] = prop
    finish(root)
    return root
