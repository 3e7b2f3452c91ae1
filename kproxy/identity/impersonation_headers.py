"""The identity the apiserver acts as when a caller sends its own ``Impersonate-*`` headers.

In ``credentials: proxy`` and ``forward`` the caller's headers go upstream as sent, so a caller
allowed to impersonate (RBAC verb ``impersonate``, or kproxy's own rights in ``proxy`` mode) has
the apiserver act as someone else. The policy rules must then match that someone else: the
identity the apiserver's impersonation filter computes from the headers, not the one that
authenticated. Whether the impersonation is allowed stays the apiserver's decision: when it is
not, the apiserver refuses the request (403) and nothing is written, whatever kproxy decided.
(``credentials: impersonate`` removes the caller's headers and sends its own: not this module.)

The headers are read as ``processImpersonationHeaders`` reads them
(staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation/constrained_impersonation.go;
the legacy filter, impersonation.go ``buildImpersonationRequests``, reads them the same way), on
header names as Go's server holds them (``textproto.CanonicalMIMEHeaderKey``: ``impersonate-user``,
``IMPERSONATE-USER`` and ``Impersonate-User`` are one header, ``Impersonate_User`` another):

- ``Impersonate-User``: its first value (``Header.Get``); an empty one is no user;
- ``Impersonate-Uid``: its first value, empty for none;
- ``Impersonate-Group``: every value, in order (an empty value is still a group);
- ``Impersonate-Extra-<key>``: every value; the key is the rest of the canonical name,
  ``strings.ToLower``-ed, then ``url.PathUnescape``-d (kept as it is when the escape is malformed);
- a uid, group or extra without a user: the apiserver's ``400 BadRequest``
  (``requested &user.DefaultInfo{...} without impersonating a user name``); kproxy answers it
  itself, as the apiserver would, before any filter.

The identity (mode.go ``impersonationModeState.check``, ``authorizeUsername``; impersonation.go
for the legacy filter):

- a service account's user name (``system:serviceaccount:<ns>:<name>``, each part a valid name:
  serviceaccount.SplitUsername) with no groups given gets the groups ``system:serviceaccounts``
  and ``system:serviceaccounts:<ns>``;
- ``system:anonymous`` gets ``system:unauthenticated`` unless given; any other user gets
  ``system:authenticated`` unless ``system:unauthenticated`` is among its groups (or it is given);
- a node's user name (``system:node:<DNS subdomain>``) with nothing else given is ambiguous: the
  constrained impersonation modes (the ``ConstrainedImpersonation`` feature, on by default since
  1.36) give it the group ``system:nodes``, the legacy mode does not, and which mode the apiserver
  takes depends on the caller's grants and the request's verb. kproxy cannot tell, so a rule by
  user or group refuses to guess: the caller gets a ``403`` naming the way out (name the groups
  with ``Impersonate-Group``: then only the legacy mode applies, with exactly those groups).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kproxy.core.chain import Identity
from kproxy.core.status import StatusError, bad_request, forbidden
from kproxy.gocompat.httpguts import TOKEN_CHARS
from kproxy.gocompat.strconv import go_quote
from kproxy.gocompat.strings import to_lower
from kproxy.gocompat.url import InvalidRequestURIError, unescape_path

__all__ = [
    "AmbiguousImpersonation",
    "Requested",
    "asks_impersonation",
    "canonical_header_key",
    "effective_identity",
    "impersonated",
    "requested_impersonation",
]

USER = "Impersonate-User"
UID = "Impersonate-Uid"
GROUP = "Impersonate-Group"
EXTRA_PREFIX = "Impersonate-Extra-"

ANONYMOUS = "system:anonymous"
ALL_AUTHENTICATED = "system:authenticated"
ALL_UNAUTHENTICATED = "system:unauthenticated"
NODES_GROUP = "system:nodes"
_SA_PREFIX = "system:serviceaccount:"
_NODE_PREFIX = "system:node:"

# k8s.io/apimachinery/pkg/util/validation/validation.go: dns1123LabelFmt, dns1123SubdomainFmt
# (Go's regexp anchored with ^...$: fullmatch here).
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(_LABEL + r"(\." + _LABEL + ")*")


def canonical_header_key(name: str) -> str:
    """``textproto.CanonicalMIMEHeaderKey``: a name of token bytes with its first letter and every
    letter after ``-`` in upper case, the others in lower case (ASCII only); any other name as it is."""
    if not name or any(c not in TOKEN_CHARS for c in name):
        return name
    out = []
    upper = True
    for c in name:
        out.append(c.upper() if upper else c.lower())
        upper = c == "-"
    return "".join(out)


def _is_dns1123_label(s: str) -> bool:
    return len(s.encode("utf-8", "surrogateescape")) <= 63 and _DNS1123_LABEL.fullmatch(s) is not None


def _is_dns1123_subdomain(s: str) -> bool:
    return len(s.encode("utf-8", "surrogateescape")) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(s) is not None


def service_account_namespace(user: str) -> str | None:
    """``serviceaccount.SplitUsername``'s namespace, or None where it fails (not a service
    account's user name: the namespace a DNS label, the name a DNS subdomain, one ``:`` between)."""
    if not user.startswith(_SA_PREFIX):
        return None
    parts = user[len(_SA_PREFIX) :].split(":")
    if len(parts) != 2 or not _is_dns1123_label(parts[0]) or not _is_dns1123_subdomain(parts[1]):
        return None
    return parts[0]


def is_node_username(user: str) -> bool:
    """mode.go ``isNodeUsername``: ``system:node:`` and a DNS subdomain."""
    return user.startswith(_NODE_PREFIX) and _is_dns1123_subdomain(user[len(_NODE_PREFIX) :])


def _unescape_extra_key(key: str) -> str:
    """impersonation.go ``unescapeExtraKey``: ``url.PathUnescape``, the key as it is when that fails."""
    try:
        return unescape_path(key)
    except InvalidRequestURIError:
        return key


@dataclass(frozen=True)
class Requested:
    """What the headers ask for, before the apiserver's defaulting (``wantedUser``)."""

    user: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def asks_impersonation(headers: Mapping[str, str]) -> bool:
    """Whether the apiserver's impersonation filter reads any of these headers (a well-formed
    impersonation, or its 400)."""
    for name, _ in _lines(headers):
        if name[:12].lower() == "impersonate-":
            canon = canonical_header_key(name)
            if canon in (USER, UID, GROUP) or canon.startswith(EXTRA_PREFIX):
                return True
    return False


def _lines(headers: Mapping[str, str]) -> Iterable[tuple[str, str]]:
    items = headers.items()
    return ((str(k), str(v)) for k, v in items)


def requested_impersonation(headers: Mapping[str, str]) -> Requested | None:
    """The impersonation these header lines ask for, None for none. Raises the apiserver's 400
    for a uid, group or extra without a user."""
    user: str | None = None
    uid: str | None = None
    groups: list[str] = []
    extra: dict[str, list[str]] = {}
    has_extra = False
    for name, value in _lines(headers):
        if name[:12].lower() != "impersonate-":
            continue
        canon = canonical_header_key(name)
        if canon == USER:
            user = value if user is None else user
        elif canon == UID:
            uid = value if uid is None else uid
        elif canon == GROUP:
            groups.append(value)
        elif canon.startswith(EXTRA_PREFIX):
            has_extra = True
            key = _unescape_extra_key(to_lower(canon[len(EXTRA_PREFIX) :]))
            extra.setdefault(key, []).append(value)
    if not user:
        if uid or groups or has_extra:
            raise bad_request(f"requested {_go_sharp_v(uid or '', groups, extra)} without impersonating a user name")
        return None
    return Requested(user, uid or "", tuple(groups), {k: tuple(v) for k, v in extra.items()})


def _go_sharp_v(uid: str, groups: list[str], extra: dict[str, list[str]]) -> str:
    """``fmt.Sprintf("%#v", wantedUser)`` for a ``*user.DefaultInfo`` without a name."""
    groups_v = "[]string{" + ", ".join(map(go_quote, groups)) + "}" if groups else "[]string(nil)"
    if extra:
        # %#v prints a map's entries sorted by key (byte order).
        entries = sorted(extra.items(), key=lambda kv: kv[0].encode("utf-8", "surrogateescape"))
        extra_v = (
            "map[string][]string{"
            + ", ".join(f"{go_quote(k)}:[]string{{{', '.join(map(go_quote, v))}}}" for k, v in entries)
            + "}"
        )
    else:
        extra_v = "map[string][]string(nil)"
    return f'&user.DefaultInfo{{Name:"", UID:{go_quote(uid)}, Groups:{groups_v}, Extra:{extra_v}}}'


class AmbiguousImpersonation(Exception):
    """A node impersonated by user name alone: its groups depend on the impersonation mode the
    apiserver takes (see the module docstring)."""

    def __init__(self, user: str) -> None:
        super().__init__(user)
        self.user = user

    def status(self) -> StatusError:
        return forbidden(
            "",
            "users",
            self.user,
            "kproxy cannot tell which groups the apiserver gives this impersonated node (system:nodes under "
            "constrained impersonation, none under the legacy mode), so no policy rule can be matched; "
            "name the groups with Impersonate-Group",
        )


def effective_identity(req: Requested) -> Identity:
    """The user the apiserver acts as once it has allowed ``req``. Raises
    :class:`AmbiguousImpersonation` for a node named by user name alone."""
    groups = list(req.groups)
    if not groups:
        ns = service_account_namespace(req.user)
        if ns is not None:
            groups = ["system:serviceaccounts", f"system:serviceaccounts:{ns}"]
        elif is_node_username(req.user) and not req.uid and not req.extra:
            raise AmbiguousImpersonation(req.user)
    if req.user == ANONYMOUS:
        if ALL_UNAUTHENTICATED not in groups:
            groups.append(ALL_UNAUTHENTICATED)
    elif ALL_UNAUTHENTICATED not in groups and ALL_AUTHENTICATED not in groups:
        groups.append(ALL_AUTHENTICATED)
    return Identity(user=req.user, groups=tuple(groups), uid=req.uid, extra=dict(req.extra))


def impersonated(headers: Mapping[str, str], caller: Identity) -> Identity:
    """The identity the apiserver acts as for a request with these headers from ``caller``: the
    impersonated one when the headers ask for one, else ``caller``. Raises ``StatusError``: the
    apiserver's 400 for malformed impersonation, kproxy's 403 for an ambiguous one."""
    req = requested_impersonation(headers)
    if req is None:
        return caller
    try:
        return effective_identity(req)
    except AmbiguousImpersonation as err:
        raise err.status() from None
