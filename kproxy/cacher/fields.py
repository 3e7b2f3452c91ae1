"""Field selectors and each resource's selectable fields, exactly as kube-apiserver v1.37 has them.

Three pieces, each ported from the apiserver:

1. **Parsing** (``staging/src/k8s.io/apimachinery/pkg/fields/selector.go`` ``ParseSelector``): the text is
   split on commas not escaped by a backslash, the terms are sorted, empty terms skipped, each term is
   split at its first ``!=``, ``==`` or ``=`` (left side taken literally), and the right side is
   unescaped (``\\\\``, ``\\,``, ``\\=``; any other escape, a lone trailing backslash, or an unescaped
   ``,``/``=`` is an error).  No ``in``, no whitespace trimming: ``a = b`` selects field ``"a "``.
2. **Field-label conversion** (``ListResource`` in ``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/
   get.go`` calls ``opts.FieldSelector.Transform(scope.Convertor.ConvertFieldLabel)``): every term's field
   must be one the kind's conversion function accepts, possibly renamed (pods' ``spec.host`` ->
   ``spec.nodeName``); kinds without one get ``runtime.DefaultMetaV1FieldSelectorConversion``
   (``staging/src/k8s.io/apimachinery/pkg/runtime/conversion.go``: ``metadata.name``,
   ``metadata.namespace``).  A rejected field is a 400 with the conversion's own message.
3. **Matching** (``storage.SelectionPredicate.Matches``, ``staging/src/k8s.io/apiserver/pkg/storage/
   selection_predicate.go``): the registry's ``GetAttrs`` renders the object's selectable fields as
   strings (``pkg/registry/**/strategy.go``); ``a=b`` matches when ``fields[a] == b`` and ``a!=b`` when it
   differs, a field the set lacks reading as ``""``.

Which fields each kind accepts was read from the sources named in :data:`_BUILTIN` and checked against
the v1.37.1 apiserver itself (``tests/e2e/test_selectors_apiserver.py`` asks it for every name).
"""

from __future__ import annotations

import copy
import functools
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kproxy.cacher.selector_errors import SelectorError
from kproxy.codegen import generate
from kproxy.gocompat.floatfmt import format_float_g
from kproxy.gocompat.strconv import go_quote

__all__ = [
    "FieldSelector",
    "SelectableFields",
    "SelectorError",
    "builtin_fields",
    "builtin_resources",
    "crd_fields",
    "escape_value",
    "parse_field_selector",
    "parse_terms",
    "unescape_value",
]

NAME = "metadata.name"
NAMESPACE = "metadata.namespace"

# ---------------------------------------------------------------------------------------------------
# Parsing: staging/src/k8s.io/apimachinery/pkg/fields/selector.go


def escape_value(value: str) -> str:
    """fields.EscapeValue: backslash-escape ``\\``, ``,`` and ``=``."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def unescape_value(value: str) -> str:
    """fields.UnescapeValue, with its two error messages."""
    if "\\" not in value and "," not in value and "=" not in value:
        return value
    out: list[str] = []
    in_slash = False
    for c in value:
        if in_slash:
            if c not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{c}")
            out.append(c)
            in_slash = False
        elif c == "\\":
            in_slash = True
        elif c in ",=":
            raise SelectorError(f"invalid field selector: unescaped character in value: {ord(c)}")
        else:
            out.append(c)
    if in_slash:
        raise SelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def _split_terms(selector: str) -> list[str]:
    """splitTerms: split on commas not preceded by an unconsumed backslash (escapes kept in the terms)."""
    if not selector:
        return []
    terms: list[str] = []
    start = 0
    in_slash = False
    for i, c in enumerate(selector):
        if in_slash:
            in_slash = False
        elif c == "\\":
            in_slash = True
        elif c == ",":
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return terms


_OPERATORS = ("!=", "==", "=")


def _split_term(term: str) -> tuple[str, str, str] | None:
    """splitTerm: the first position where ``!=``, ``==`` or ``=`` starts (tried in that order)."""
    for i in range(len(term)):
        for op in _OPERATORS:
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op) :]
    return None


class FieldSelector:
    """An AND of ``field=value`` / ``field!=value`` terms over the canonical (converted) field names."""

    __slots__ = ("empty", "fields", "terms")

    def __init__(self, terms: tuple[tuple[str, str, bool], ...]) -> None:
        self.terms = terms  # (field, value, equal?)
        self.empty = not terms
        self.fields = frozenset(t[0] for t in terms)

    def matches(self, fields: Mapping[str, str]) -> bool:
        for name, value, equal in self.terms:  # noqa: SIM110 (a plain loop: no generator per object)
            if (fields.get(name, "") == value) is not equal:
                return False
        return True

    def __repr__(self) -> str:
        return f"FieldSelector({self.terms!r})"


@functools.lru_cache(maxsize=1024)
def parse_field_selector(text: str, selectable: SelectableFields) -> FieldSelector:
    """``fields.ParseSelector`` then ``Transform(ConvertFieldLabel)`` for the resource ``selectable`` is of.

    Memoised per (text, resource) like :func:`kproxy.cacher.labels.parse_label_selector`.  Raises
    :class:`SelectorError` where the apiserver answers 400: a syntax or escape error (all terms are
    parsed, in sorted order, before any field name is checked), then the first rejected field.
    """
    return FieldSelector(tuple((selectable.convert(f), v, eq) for f, v, eq in parse_terms(text)))


def parse_terms(text: str) -> list[tuple[str, str, bool]]:
    """``fields.ParseSelector``'s syntax alone: (field, unescaped value, equal?) per term, in Go's
    sorted term order; SelectorError for what it rejects. No field name is checked here."""
    parsed: list[tuple[str, str, bool]] = []
    for part in sorted(_split_terms(text)):
        if not part:
            continue
        split = _split_term(part)
        if split is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        lhs, op, rhs = split
        parsed.append((lhs, unescape_value(rhs), op != "!="))
    return parsed


# ---------------------------------------------------------------------------------------------------
# Selectable fields: extractors over the apiserver's JSON object and over the decoded protobuf message

DictGetter = Callable[[Mapping[str, Any]], str]
MessageGetter = Callable[[Any], str]


def _go_bool(v: object) -> str:
    """strconv.FormatBool / fmt.Sprint of a bool."""
    return "true" if v else "false"


def _dict_path(path: tuple[str, ...], default: Any) -> Callable[[Mapping[str, Any]], Any]:
    """Read ``obj[a][b]...``; a missing key, null or non-object on the way gives ``default`` (Go's zero)."""
    if len(path) == 1:
        (a,) = path

        def get1(obj: Mapping[str, Any]) -> Any:
            v = obj.get(a)
            return default if v is None else v

        return get1
    if len(path) == 2:
        a, b = path

        def get2(obj: Mapping[str, Any]) -> Any:
            v = obj.get(a)
            if not isinstance(v, dict):
                return default
            v = v.get(b)
            return default if v is None else v

        return get2

    def get_n(obj: Mapping[str, Any]) -> Any:
        v: Any = obj
        for p in path:
            if not isinstance(v, dict):
                return default
            v = v.get(p)
        return default if v is None else v

    return get_n


@dataclass(frozen=True, slots=True)
class _Spec:
    """One selectable field: its canonical name, the JSON/proto path to it and how Go renders it."""

    name: str
    path: tuple[str, ...]
    render: str = "str"  # "str" (string(x)), "bool" (FormatBool), "int" (strconv.Itoa)
    since: int = 0  # the Kubernetes minor whose conversion function first accepts it (0: all supported)

    def getters(self) -> tuple[DictGetter, MessageGetter]:
        attr = operator.attrgetter(".".join(self.path))
        if self.render == "bool":
            dget = _dict_path(self.path, False)
            return (lambda o: "true" if dget(o) else "false"), (lambda m: "true" if attr(m) else "false")
        if self.render == "int":
            dget = _dict_path(self.path, 0)
            return (lambda o: str(int(dget(o)))), (lambda m: str(attr(m)))
        dget = _dict_path(self.path, "")
        return dget, attr


def _pod_ip_dict(obj: Mapping[str, Any]) -> str:
    """status.podIP: the internal PodIPs[0].IP, which v1 conversion builds from podIP, else podIPs[0]
    (pkg/apis/core/v1/conversion.go Convert_v1_PodStatus_To_core_PodStatus)."""
    status = obj.get("status")
    if not isinstance(status, dict):
        return ""
    ip = status.get("podIP")
    if ip:
        return str(ip)
    ips = status.get("podIPs")
    if ips and isinstance(ips[0], dict):
        return str(ips[0].get("ip") or "")
    return ""


def _pod_ip_msg(msg: Any) -> str:
    status = msg.status
    if status.podIP:
        return str(status.podIP)
    return str(status.podIPs[0].ip) if len(status.podIPs) else ""


def _first_nonempty(
    a: tuple[DictGetter, MessageGetter], b: tuple[DictGetter, MessageGetter]
) -> tuple[DictGetter, MessageGetter]:
    """Events' ``source``: Source.Component, or ReportingController when that is empty."""
    da, ma = a
    db, mb = b
    return (lambda o: da(o) or db(o)), (lambda m: ma(m) or mb(m))


class SelectableFields:
    """What one resource's field selectors may name and how its objects' field values are read.

    ``accepted`` maps every field name a selector may use to its canonical name (the conversion
    function's rename); ``names`` are the canonical names :meth:`from_dict`/:meth:`from_message` fill.
    A canonical name the extractors do not fill (pods' ``status.podIPs`` in v1.37) reads as ``""``,
    as in the apiserver, where ``fields.Set.Get`` of a missing key is ``""``.
    """

    __slots__ = ("_from_dict", "_from_message", "_reject", "_views", "accepted", "names", "newer", "protobuf")

    def __init__(
        self,
        accepted: Mapping[str, str],
        getters: Sequence[tuple[str, tuple[DictGetter, MessageGetter] | None]],
        reject: Callable[[str], str],
        protobuf: bool = True,
        compiled: tuple[Callable[[Mapping[str, Any]], dict[str, str]], Callable[[Any], dict[str, str]]] | None = None,
        newer: Mapping[str, int] | None = None,
    ) -> None:
        self.accepted: dict[str, str] = dict(accepted)
        #: Accepted names an older supported minor refuses: name -> the minor that accepts it.
        self.newer: dict[str, int] = dict(newer or {})
        self._views: dict[frozenset[str], SelectableFields] = {}
        self.protobuf = protobuf  # False for custom resources: they have no protobuf form
        self._reject = reject
        filled = [(n, g) for n, g in getters if g is not None]
        self.names: frozenset[str] = frozenset(n for n, _ in filled)
        if compiled is not None:
            self._from_dict, self._from_message = compiled
        else:
            dict_getters = tuple((n, g[0]) for n, g in filled)
            msg_getters = tuple((n, g[1]) for n, g in filled)
            self._from_dict = lambda obj: {n: g(obj) for n, g in dict_getters}
            self._from_message = lambda msg: {n: g(msg) for n, g in msg_getters}

    def at(self, minor: int | None) -> SelectableFields:
        """The same fields as an apiserver of 1.``minor`` accepts them (``None``: the newest);
        objects' field sets are the same, only the names a selector may use differ."""
        if minor is None or not self.newer:
            return self
        refused = frozenset(name for name, since in self.newer.items() if minor < since)
        if not refused:
            return self
        view = self._views.get(refused)
        if view is None:
            view = self._views[refused] = copy.copy(self)
            view.accepted = {k: v for k, v in self.accepted.items() if k not in refused}
            view.newer, view._views = {}, {}
        return view

    def __copy__(self) -> SelectableFields:
        clone = SelectableFields.__new__(SelectableFields)
        for slot in SelectableFields.__slots__:
            setattr(clone, slot, getattr(self, slot))
        return clone

    def convert(self, label: str) -> str:
        """ConvertFieldLabel: the canonical name, or :class:`SelectorError` with the apiserver's text."""
        name = self.accepted.get(label)
        if name is None:
            raise SelectorError(self._reject(label))
        return name

    def from_dict(self, obj: Mapping[str, Any]) -> dict[str, str]:
        """The field set of an object as the apiserver serves it in JSON."""
        return self._from_dict(obj)

    def from_message(self, msg: Any) -> dict[str, str]:
        """The field set of a decoded protobuf message of the kind (unset fields read as Go's zero)."""
        if not self.protobuf:
            raise TypeError("custom resources have no protobuf form")
        return self._from_message(msg)


def _compile(
    fields: Sequence[_Spec | tuple[str, tuple[DictGetter, MessageGetter] | None]],
    name: str,
) -> tuple[Callable[[Mapping[str, Any]], dict[str, str]], Callable[[Any], dict[str, str]]]:
    """One straight-line function per direction for a built-in kind: each sub-object (``metadata``,
    ``spec``...) is fetched once and the field set built as one dict literal.  These run for every
    object the cache stores; reading a upb sub-message once instead of once per field halves the cost.
    Only the literal paths of :data:`_BUILTIN` are compiled (never a CRD's paths).  ``name`` is the
    resource's (``pods``, ``events.events.k8s.io``): the generated module is
    ``kproxy.cacher.fields:<name>``."""
    env: dict[str, Any] = {"_E": {}}
    tops: dict[str, str] = {}
    d_items: list[str] = []
    m_items: list[str] = []
    for i, f in enumerate(fields):
        if not isinstance(f, _Spec):
            label, pair = f
            if pair is None:
                continue
            env[f"_cd{i}"], env[f"_cm{i}"] = pair
            d_items.append(f"{label!r}: _cd{i}(o)")
            m_items.append(f"{label!r}: _cm{i}(m)")
            continue
        assert all(p.isidentifier() for p in f.path), f.path
        top = f.path[0]
        if len(f.path) == 1:
            d_raw, m_raw = f"o.get({top!r})", f"m.{top}"
        else:
            var = tops.setdefault(top, f"s{len(tops)}")
            d_raw = var
            for p in f.path[1:-1]:
                d_raw = f"({d_raw}.get({p!r}) or _E)"
            d_raw = f"{d_raw}.get({f.path[-1]!r})"
            m_raw = f"{var}." + ".".join(f.path[1:])
        if f.render == "bool":
            d_expr, m_expr = f"('true' if {d_raw} else 'false')", f"('true' if {m_raw} else 'false')"
        elif f.render == "int":
            d_expr, m_expr = f"str(int({d_raw} or 0))", f"str({m_raw})"
        else:
            d_expr, m_expr = f"({d_raw} or '')", m_raw
        d_items.append(f"{f.name!r}: {d_expr}")
        m_items.append(f"{f.name!r}: {m_expr}")
    d_src = "def from_dict(o):\n"
    d_src += "".join(f"    {var} = o.get({top!r}) or _E\n" for top, var in tops.items())
    d_src += "    return {" + ", ".join(d_items) + "}\n"
    m_src = "def from_message(m):\n"
    m_src += "".join(f"    {var} = m.{top}\n" for top, var in tops.items())
    m_src += "    return {" + ", ".join(m_items) + "}\n"
    generate(f"kproxy.cacher.fields:{name}", d_src + m_src, env)
    return env["from_dict"], env["from_message"]


def _not_supported(label: str) -> str:
    return f"field label not supported: {label}"


def _default_reject(label: str) -> str:
    """runtime.DefaultMetaV1FieldSelectorConversion's error."""
    return f"{go_quote(label)} is not a known field selector: only {go_quote(NAME)}, {go_quote(NAMESPACE)}"


_META_SPECS = (_Spec(NAME, ("metadata", "name")), _Spec(NAMESPACE, ("metadata", "namespace")))
_META = tuple((spec.name, spec.getters()) for spec in _META_SPECS)


def _kind(
    name: str,
    fields: Sequence[_Spec | tuple[str, tuple[DictGetter, MessageGetter] | None]],
    *,
    extra_accepted: Mapping[str, str] | None = None,
    namespace: bool = True,
    reject: Callable[[str], str] = _not_supported,
    only_accepted: Mapping[str, str] | None = None,
) -> SelectableFields:
    """A kind with its own conversion function: metadata.name (always), metadata.namespace when the
    function accepts it, the listed fields, and renames in ``extra_accepted`` -- or exactly
    ``only_accepted`` when the API version names its fields differently from the storage's field set."""
    getters: list[tuple[str, tuple[DictGetter, MessageGetter] | None]] = list(_META)
    accepted = {NAME: NAME}
    newer: dict[str, int] = {}
    if namespace:
        accepted[NAMESPACE] = NAMESPACE
    for f in fields:
        if isinstance(f, _Spec):
            getters.append((f.name, f.getters()))
            accepted[f.name] = f.name
            if f.since:
                newer[f.name] = f.since
        else:
            getters.append(f)
            accepted[f[0]] = f[0]
    accepted.update(extra_accepted or {})
    if only_accepted is not None:
        accepted = dict(only_accepted)
    compiled = _compile([_META_SPECS[0], _META_SPECS[1], *fields], name)
    return SelectableFields(accepted, getters, reject, compiled=compiled, newer=newer)


def _core_event_fields(prefix: str, reporting: str, source: tuple[str, ...]) -> list[_Spec | tuple[str, Any]]:
    """pkg/registry/core/event/strategy.go ToSelectableFields; ``prefix`` is where the involved object
    lives in this API version (core v1 ``involvedObject``, events.k8s.io/v1 ``regarding``)."""
    out: list[_Spec | tuple[str, Any]] = [
        _Spec(f"involvedObject.{k}", (prefix, k))
        for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
    ]
    out.append(_Spec("reason", ("reason",)))
    out.append(_Spec("reportingComponent", (reporting,)))
    out.append(
        (
            "source",
            _first_nonempty(_Spec("source", source).getters(), _Spec("reportingComponent", (reporting,)).getters()),
        )
    )
    out.append(_Spec("type", ("type",)))
    return out


def _build_builtin() -> dict[tuple[str, str], Callable[[str], SelectableFields]]:
    """Each built-in resource's factory, called with the resource's name (``pods``,
    ``events.events.k8s.io``) for its generated accessors' module."""
    return {
        # pkg/apis/core/v1/conversion.go (Pod); pkg/registry/core/pod/strategy.go ToSelectableFields.
        # spec.hostNetwork: FormatBool(SecurityContext.HostNetwork), "false" without one.
        # status.podIPs: accepted by the conversion, absent from ToSelectableFields -> always "" (v1.37.1).
        ("", "pods"): lambda name: _kind(
            name,
            [
                _Spec("spec.nodeName", ("spec", "nodeName")),
                _Spec("spec.restartPolicy", ("spec", "restartPolicy")),
                _Spec("spec.schedulerName", ("spec", "schedulerName")),
                _Spec("spec.serviceAccountName", ("spec", "serviceAccountName")),
                _Spec("spec.hostNetwork", ("spec", "hostNetwork"), "bool"),
                _Spec("status.phase", ("status", "phase")),
                ("status.podIP", (_pod_ip_dict, _pod_ip_msg)),
                ("status.podIPs", None),
                _Spec("status.nominatedNodeName", ("status", "nominatedNodeName")),
            ],
            extra_accepted={"spec.host": "spec.nodeName"},
        ),
        # pkg/apis/core/v1/conversion.go (Node: metadata.name, spec.unschedulable; no metadata.namespace);
        # pkg/registry/core/node/strategy.go NodeToSelectableFields: fmt.Sprint(Spec.Unschedulable).
        ("", "nodes"): lambda name: _kind(
            name, [_Spec("spec.unschedulable", ("spec", "unschedulable"), "bool")], namespace=False
        ),
        # pkg/apis/core/v1/conversion.go (ReplicationController);
        # pkg/registry/core/replicationcontroller/strategy.go: strconv.Itoa(int(Status.Replicas)).
        ("", "replicationcontrollers"): lambda name: _kind(
            name, [_Spec("status.replicas", ("status", "replicas"), "int")]
        ),
        # pkg/apis/core/v1/conversion.go AddFieldLabelConversionsForEvent; pkg/registry/core/event/strategy.go.
        ("", "events"): lambda name: _kind(
            name, _core_event_fields("involvedObject", "reportingComponent", ("source", "component"))
        ),
        # events.k8s.io/v1 Event (same storage as core events): the conversion accepts regarding.*,
        # reportingController, reason, type, metadata.* and maps them onto the core names (measured on
        # v1.37.1 by the e2e test); source and the core names (involvedObject.*, reportingComponent) are
        # rejected.
        ("events.k8s.io", "events"): lambda name: _kind(
            name,
            _core_event_fields("regarding", "reportingController", ("deprecatedSource", "component")),
            only_accepted={
                NAME: NAME,
                NAMESPACE: NAMESPACE,
                **{
                    f"regarding.{k}": f"involvedObject.{k}"
                    for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
                },
                "reportingController": "reportingComponent",
                "reason": "reason",
                "type": "type",
            },
        ),
        # pkg/apis/core/v1/conversion.go AddFieldLabelConversionsForNamespace (status.phase, metadata.name).
        ("", "namespaces"): lambda name: _kind(name, [_Spec("status.phase", ("status", "phase"))], namespace=False),
        # pkg/apis/core/v1/conversion.go AddFieldLabelConversionsForSecret; registry: string(secret.Type).
        ("", "secrets"): lambda name: _kind(name, [_Spec("type", ("type",))]),
        # pkg/apis/core/v1/conversion.go AddFieldLabelConversionsForService.
        ("", "services"): lambda name: _kind(
            name, [_Spec("spec.clusterIP", ("spec", "clusterIP")), _Spec("spec.type", ("spec", "type"))]
        ),
        # pkg/apis/batch/v1/conversion.go (Job: status.successful = strconv.Itoa(int(Status.Succeeded)),
        # pkg/registry/batch/job/strategy.go JobToSelectableFields); its own error text.
        ("batch", "jobs"): lambda name: _kind(
            name,
            [_Spec("status.successful", ("status", "succeeded"), "int")],
            reject=lambda label: f"field label {go_quote(label)} not supported for Job",
        ),
        # pkg/apis/certificates/v1/conversion.go (CertificateSigningRequest, ClusterTrustBundle,
        # PodCertificateRequest; none accepts metadata.namespace).
        ("certificates.k8s.io", "certificatesigningrequests"): lambda name: _kind(
            name, [_Spec("spec.signerName", ("spec", "signerName"))], namespace=False
        ),
        ("certificates.k8s.io", "clustertrustbundles"): lambda name: _kind(
            name, [_Spec("spec.signerName", ("spec", "signerName"))], namespace=False
        ),
        ("certificates.k8s.io", "podcertificaterequests"): lambda name: _kind(
            name,
            [
                _Spec("spec.signerName", ("spec", "signerName")),
                _Spec("spec.podName", ("spec", "podName")),
                _Spec("spec.nodeName", ("spec", "nodeName")),
            ],
            namespace=False,
        ),
        # pkg/apis/resource/v1/conversion.go (ResourceSlice: metadata.name, spec.nodeName (a *string: nil is
        # ""), spec.driver, spec.pool.name (from 1.37)), with its own error text.
        ("resource.k8s.io", "resourceslices"): lambda name: _kind(
            name,
            [
                _Spec("spec.nodeName", ("spec", "nodeName")),
                _Spec("spec.driver", ("spec", "driver")),
                _Spec("spec.pool.name", ("spec", "pool", "name"), since=37),
            ],
            namespace=False,
            reject=lambda label: f"field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: {label}",
        ),
    }


_BUILTIN = _build_builtin()
_DEFAULT: SelectableFields | None = None
_CACHE: dict[tuple[str, str], SelectableFields] = {}


def builtin_resources() -> list[tuple[str, str]]:
    """The built-in (group, resource) pairs with a conversion function of their own."""
    return sorted(_BUILTIN)


def builtin_fields(group: str, resource: str) -> SelectableFields:
    """The selectable fields of a built-in resource (group "" or "core" for the core API).

    Kinds without a conversion function of their own accept ``metadata.name`` and ``metadata.namespace``
    (cluster-scoped ones too: their namespace reads as ``""``).
    """
    key = ("" if group == "core" else group, resource)
    found = _CACHE.get(key)
    if found is None:
        factory = _BUILTIN.get(key)
        if factory is not None:
            found = factory(".".join(filter(None, (resource, key[0]))))
        else:
            found = SelectableFields(
                {NAME: NAME, NAMESPACE: NAMESPACE}, _META, _default_reject, compiled=_compile(_META_SPECS, "default")
            )
        _CACHE[key] = found
    return found


# ---------------------------------------------------------------------------------------------------
# Custom resources: staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/conversion/converter.go
# (crConverter.ConvertFieldLabel: metadata.name, metadata.namespace unless cluster-scoped, the version's
# selectableFields; else "field label not supported: X") and .../registry/customresource/strategy.go
# (selectableFields: jsonpath over the unstructured object, fmt.Sprint of the value, "" when absent or null).

_BRACKET = re.compile(r"\[['\"]([^'\"]*)['\"]\]")


def _json_path_parts(json_path: str) -> tuple[str, tuple[str, ...]]:
    """``.spec.color`` -> (``spec.color``, ("spec", "color")); ``['a.b']`` segments kept whole."""
    name = json_path[1:] if json_path.startswith(".") else json_path
    parts: list[str] = []
    for chunk in re.split(r"(\[['\"][^'\"]*['\"]\])", name):
        m = _BRACKET.fullmatch(chunk)
        if m:
            parts.append(m.group(1))
        else:
            parts.extend(p for p in chunk.split(".") if p)
    return name, tuple(parts)


def _go_sprint(value: Any) -> str:
    """fmt.Sprint of an unstructured JSON value (string, int64, bool, float64)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return _go_bool(value)
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_float_g(value)
    return str(value)


def _cr_getter(path: tuple[str, ...]) -> tuple[DictGetter, MessageGetter]:
    get = _dict_path(path, None)

    def from_dict(obj: Mapping[str, Any]) -> str:
        return _go_sprint(get(obj))

    def from_message(msg: Any) -> str:  # never called: SelectableFields(protobuf=False) refuses first
        raise TypeError("custom resources have no protobuf form")

    return from_dict, from_message


def crd_fields(json_paths: Sequence[str], namespaced: bool = True) -> SelectableFields:
    """A custom resource version's selectable fields: metadata.name, metadata.namespace (namespaced
    kinds only) and the CRD version's ``selectableFields[].jsonPath`` (leading dot dropped)."""
    accepted = {NAME: NAME}
    getters: list[tuple[str, tuple[DictGetter, MessageGetter] | None]] = [_META[0]]
    if namespaced:
        accepted[NAMESPACE] = NAMESPACE
        getters.append(_META[1])
    for jp in json_paths:
        name, path = _json_path_parts(jp)
        accepted[name] = name
        getters.append((name, _cr_getter(path)))
    return SelectableFields(accepted, getters, _not_supported, protobuf=False)
