"""Policy rules: who and what a rule applies to, shared by the policy filters (``dryrun``,
``validation``).

A filter's config holds an ordered list of rules; the first rule whose ``match`` selects the
request decides (:func:`first_match`). A ``Match`` selects by the caller (user, groups), the
namespace, the resource and the verb. Every list that is empty matches anything; every entry
is a glob (``fnmatch``: ``*``, ``?``, ``[...]``; case-sensitive, as Kubernetes names are).

Resources are written the way ``kubectl`` and RBAC name them, ``RESOURCE[.GROUP][/SUBRESOURCE]``:

=========================  ==================================================================
``pods``                   core-group pods themselves (not their subresources)
``pods/status``            the ``status`` subresource of core-group pods
``pods/*``                 every subresource of pods (not pods themselves)
``deployments.apps``       apps/deployments
``deployments.apps/scale`` their ``scale`` subresource
``*.apps``                 every resource of the ``apps`` group (not subresources)
``*``                      everything: any resource of any group, subresources included
``*/scale``                the ``scale`` subresource of any resource of any group
=========================  ==================================================================

Without ``.GROUP`` the core group is meant, except for the resource ``*``, which means every
group. The form ``apps/deployments`` (group first) is not accepted: it would read as the
subresource ``deployments`` of a resource ``apps``, so start-up rejects a first part that is a
well-known API group name and explains the form.

Verbs are the apiserver's: ``create``, ``update``, ``patch``, ``delete``, ``deletecollection``,
``get``, ``list``, ``watch``, and ``connect`` for the streaming subresources (``pods/exec``,
``pods/attach``, ``pods/portforward``, ``pods/proxy``, ``services/proxy``, ``nodes/proxy``, and
the deprecated ``/proxy/`` path form), whatever HTTP method carries them. ``*`` is any verb.

Namespaces: a request outside any namespace (cluster-scoped resources, non-resource paths)
never matches a non-empty ``namespaces`` list, with one exception: a Namespace object is in
itself. For ``/api/v1/namespaces/N`` (get, update, patch, delete, ``status``, ``finalize``) the
apiserver's RequestInfo already says namespace ``N``. A create (``POST /api/v1/namespaces``)
names the namespace only in its body, so the policy filters read it there
(:func:`created_namespace`): ``metadata.name``; without one, ``metadata.generateName``, and then
a pattern matches when some generated name could match it (the name is only known once the
apiserver made it); a body kproxy cannot read that far matches every ``namespaces`` pattern, so
that a rule never misses the namespace it names. A rule for ``dry-*`` therefore covers creating,
changing and deleting the Namespace ``dry-x`` as well as everything in it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from fnmatch import fnmatchcase
from functools import cached_property
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, field_validator

from kproxy.core.chain import Identity
from kproxy.core.requestinfo import RequestInfo
from kproxy.gocompat.strings import to_lower, trim_space
from kproxy.gocompat.yaml import GoYAMLError, UnsupportedYAML, yaml_to_json

__all__ = [
    "VERBS",
    "Match",
    "ResourcePattern",
    "Rule",
    "created_namespace",
    "creates_namespace",
    "first_match",
    "first_match_lazy",
    "glob_matches_some_extension",
    "match_verb",
    "needs_identity",
]

#: The verbs a rule may name.
VERBS = frozenset(("create", "update", "patch", "delete", "deletecollection", "get", "list", "watch", "connect", "*"))

# Group names an operator may put first by mistake (``apps/deployments``): refused with a hint.
_WELL_KNOWN_GROUPS = frozenset(
    (
        "apps",
        "batch",
        "autoscaling",
        "policy",
        "networking.k8s.io",
        "rbac.authorization.k8s.io",
        "storage.k8s.io",
        "apiextensions.k8s.io",
        "admissionregistration.k8s.io",
        "coordination.k8s.io",
        "discovery.k8s.io",
        "certificates.k8s.io",
        "scheduling.k8s.io",
        "node.k8s.io",
        "events.k8s.io",
        "flowcontrol.apiserver.k8s.io",
        "resource.k8s.io",
    )
)
_PATTERN_CHARS = re.compile(r"[a-z0-9.\-*?\[\]!]+")


class ResourcePattern:
    """One parsed ``RESOURCE[.GROUP][/SUBRESOURCE]`` pattern (see the module docstring)."""

    __slots__ = ("group", "resource", "subresource", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        if text == "*":
            self.resource, self.group, self.subresource = "*", "*", "*"
            return
        head, slash, sub = text.partition("/")
        if not head or (slash and not sub) or "/" in sub:
            raise ValueError(f"{text!r}: expected RESOURCE[.GROUP][/SUBRESOURCE], e.g. pods, deployments.apps/scale")
        for part in (head, sub) if slash else (head,):
            if _PATTERN_CHARS.fullmatch(part) is None:
                raise ValueError(
                    f"{text!r}: resources are lower-case names or globs (letters, digits, '-', '.', '*', '?', [...])"
                )
        if slash and head in _WELL_KNOWN_GROUPS:
            raise ValueError(f"{text!r}: write the group after the resource, e.g. {sub}.{head}")
        resource, dot, group = head.partition(".")
        if dot and not group:
            raise ValueError(f"{text!r}: empty group after '.'")
        self.resource = resource
        # No group given: the core group, except for the resource "*" (every group).
        self.group = group if dot else ("*" if resource == "*" else "")
        self.subresource = sub if slash else ""

    def matches(self, info: RequestInfo) -> bool:
        if not fnmatchcase(info.resource, self.resource) or not fnmatchcase(info.api_group, self.group):
            return False
        if self.subresource == "":
            return info.subresource == ""
        return info.subresource != "" and fnmatchcase(info.subresource, self.subresource)

    def __repr__(self) -> str:
        return f"ResourcePattern({self.text!r})"


def match_verb(info: RequestInfo) -> str:
    """The verb rules see: the RequestInfo verb, ``connect`` for streaming subresources."""
    if info.is_connect or (info.is_resource_request and info.verb == "proxy"):
        return "connect"
    return info.verb


def _any(patterns: Sequence[str], value: str) -> bool:
    return any(fnmatchcase(value, p) for p in patterns)


def _glob_items(pattern: str) -> list[str]:
    """A glob as its items: ``*``, ``?``, a bracket expression, or one literal character."""
    items: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] == "!":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1
            while j < len(pattern) and pattern[j] != "]":
                j += 1
            if j < len(pattern):  # a closed bracket expression (fnmatch: else a literal "[")
                items.append(pattern[i : j + 1])
                i = j + 1
                continue
        items.append(c)
        i += 1
    return items


def glob_matches_some_extension(pattern: str, prefix: str) -> bool:
    """Whether ``pattern`` (an ``fnmatchcase`` glob) matches some string that starts with
    ``prefix``: the name the apiserver makes from a ``generateName``. Over-approximates only for
    bracket expressions that match nothing."""
    items = _glob_items(pattern)
    states = {0}  # positions in ``items`` reachable after the characters read so far

    def close(found: set[int]) -> set[int]:
        out = set(found)
        for s in found:
            k = s
            while k < len(items) and items[k] == "*":
                k += 1
                out.add(k)
        return out

    states = close(states)
    for ch in prefix:
        nxt: set[int] = set()
        for s in states:
            if s >= len(items):
                continue
            item = items[s]
            if item == "*":
                nxt.add(s)
            elif item == "?" or (len(item) > 1 and fnmatchcase(ch, item)) or item == ch:
                nxt.add(s + 1)
        states = close(nxt)
        if not states:
            return False
    return True  # whatever is left of the pattern, some suffix matches it


def creates_namespace(info: RequestInfo) -> bool:
    """``POST /api/v1/namespaces``: the one write whose namespace is only in its body."""
    return (
        info.is_resource_request
        and info.verb == "create"
        and info.api_group == ""
        and info.resource == "namespaces"
        and not info.subresource
        and not info.namespace
    )


_PROTOBUF_PREFIX = b"k8s\x00"


def created_namespace(data: bytes, content_type: str) -> tuple[str, bool]:
    """The namespace a Namespace create's body names: (name, True) for ``metadata.name``;
    (generateName, False) when only that is given; ("", False) when kproxy cannot read it (the
    prefix every name has). JSON and YAML as the apiserver decodes them (last duplicate wins),
    protobuf from its ``k8s\\0`` envelope (Unknown.raw = 2; Namespace.metadata = 1;
    ObjectMeta.name = 1, generateName = 2; the last occurrence wins)."""
    # mime.ParseMediaType: Go's ToLower then TrimSpace (U+0130 is "i" to it, not to str.lower).
    mt = trim_space(to_lower(content_type.split(";", 1)[0])) or "application/json"
    meta: Any = None
    try:
        if mt == "application/json":
            meta = (orjson.loads(data) or {}).get("metadata")
        elif mt == "application/yaml":
            meta = (yaml_to_json(data).value or {}).get("metadata")
        elif mt == "application/vnd.kubernetes.protobuf" and data.startswith(_PROTOBUF_PREFIX):
            raw = _last_bytes(data[len(_PROTOBUF_PREFIX) :], 2)
            object_meta = _last_bytes(raw, 1)
            meta = {
                "name": _last_bytes(object_meta, 1).decode("utf-8", "surrogateescape"),
                "generateName": _last_bytes(object_meta, 2).decode("utf-8", "surrogateescape"),
            }
    except (ValueError, AttributeError, GoYAMLError, UnsupportedYAML):
        meta = None
    if not isinstance(meta, dict):
        return "", False
    name, generate = meta.get("name"), meta.get("generateName")
    if isinstance(name, str) and name:
        return name, True
    if isinstance(generate, str):
        return generate, False
    return "", False


def _last_bytes(buf: bytes, number: int) -> bytes:
    """The last length-delimited field ``number`` of a protobuf message (ValueError if malformed)."""
    # lazy: importing kproxy.codec loads protobuf; only rules on a protobuf body need these readers
    from kproxy.codec.codecerrors import CodecError
    from kproxy.codec.envelope import iter_fields

    found = b""
    try:
        for num, wire, _, value, end in iter_fields(buf):
            if num == 0:
                raise ValueError("field number 0")
            if num == number and wire == 2:
                found = buf[value:end]
    except CodecError as err:
        raise ValueError(str(err)) from None
    return found


class Match(BaseModel):
    """Which requests a rule applies to; every empty list matches anything."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: User names (``alice``, ``system:serviceaccount:ci:*``).
    users: list[str] = []
    #: Group names; matches when any of the caller's groups matches any entry.
    groups: list[str] = []
    #: Namespace names or globs; never matches requests outside a namespace. A Namespace object
    #: is in itself: creating (named by its body; a ``generateName`` matches the names it can
    #: become), changing or deleting the Namespace ``dry-x`` matches ``dry-*``.
    namespaces: list[str] = []
    #: ``RESOURCE[.GROUP][/SUBRESOURCE]`` patterns (see the module docstring).
    resources: list[str] = []
    #: The apiserver's verbs, plus ``connect`` and ``*``.
    verbs: list[str] = []

    @field_validator("users", "groups", "namespaces")
    @classmethod
    def _non_empty(cls, values: list[str]) -> list[str]:
        for v in values:
            if not v:
                raise ValueError("entries must not be empty")
        return values

    @field_validator("resources")
    @classmethod
    def _resources(cls, values: list[str]) -> list[str]:
        for v in values:
            ResourcePattern(v)  # raises ValueError with the explanation
        return values

    @field_validator("verbs")
    @classmethod
    def _verbs(cls, values: list[str]) -> list[str]:
        for v in values:
            if v not in VERBS:
                raise ValueError(f"unknown verb {v!r} (known: {', '.join(sorted(VERBS))})")
        return values

    @cached_property
    def resource_patterns(self) -> tuple[ResourcePattern, ...]:
        """``resources`` parsed once (a plain attribute after the first use: matching is per request)."""
        return tuple(ResourcePattern(r) for r in self.resources)

    def needs_identity(self) -> bool:
        """Whether matching needs the caller's identity (``users`` or ``groups`` given)."""
        return bool(self.users or self.groups)

    def matches(self, info: RequestInfo, identity: Identity | None, *, namespace_prefix: str | None = None) -> bool:
        """Whether this request is selected. ``identity`` must be known when :meth:`needs_identity`;
        without it a rule naming users or groups does not match. ``namespace_prefix``: the
        request's namespace is not known, only that it starts with this (a Namespace created
        with a ``generateName``, or one whose body kproxy could not read: ``""``)."""
        if self.verbs and "*" not in self.verbs and match_verb(info) not in self.verbs:
            return False
        if self.namespaces and namespace_prefix is not None:
            if not any(glob_matches_some_extension(p, namespace_prefix) for p in self.namespaces):
                return False
        elif self.namespaces and (not info.namespace or not _any(self.namespaces, info.namespace)):
            return False
        if self.resources and (
            not info.is_resource_request or not any(p.matches(info) for p in self.resource_patterns)
        ):
            return False
        if self.users and (identity is None or not _any(self.users, identity.user)):
            return False
        return not self.groups or (identity is not None and any(_any(self.groups, g) for g in identity.groups))


class Rule(BaseModel):
    """A named ``match``; filters subclass it with their action fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    match: Match = Match()

    def display_name(self, index: int) -> str:
        """How messages and metrics name the rule: its ``name``, else ``rules[<index>]``."""
        return self.name if self.name else f"rules[{index}]"


R = TypeVar("R", bound=Rule)


def needs_identity(rules: Sequence[Rule]) -> bool:
    """Whether any rule needs the caller's identity to be matched."""
    return any(r.match.needs_identity() for r in rules)


async def first_match_lazy(
    rules: Sequence[R],
    info: RequestInfo,
    identify: Callable[[], Awaitable[Identity]],
    *,
    namespace_prefix: str | None = None,
) -> tuple[int, R] | None:
    """:func:`first_match`, asking for the caller's identity only when a rule that needs it is
    reached (e.g. ``lambda: authenticator(ctx).identify(ex)``): requests decided by earlier rules
    cost no TokenReview. ``namespace_prefix`` as for :meth:`Match.matches`."""
    identity: Identity | None = None
    for i, rule in enumerate(rules):
        if identity is None and rule.match.needs_identity():
            identity = await identify()
        if rule.match.matches(info, identity, namespace_prefix=namespace_prefix):
            return i, rule
    return None


def first_match(rules: Sequence[R], info: RequestInfo, identity: Identity | None) -> tuple[int, R] | None:
    """The first rule (index, rule) selecting the request, in order, or ``None``."""
    for i, rule in enumerate(rules):
        if rule.match.matches(info, identity):
            return i, rule
    return None
