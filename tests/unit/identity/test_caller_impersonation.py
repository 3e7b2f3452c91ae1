"""kproxy.identity.impersonation_headers: the identity the apiserver acts as for a caller's own
``Impersonate-*`` headers (expectations from staging/src/k8s.io/apiserver/pkg/endpoints/filters/
impersonation/constrained_impersonation.go and mode.go; the e2e proof at the apiserver is
tests/adversarial/test_inventory_impersonation.py)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from kproxy.core.chain import Identity
from kproxy.core.status import StatusError
from kproxy.identity.impersonation_headers import (
    AmbiguousImpersonation,
    Requested,
    asks_impersonation,
    canonical_header_key,
    effective_identity,
    impersonated,
    requested_impersonation,
)

CALLER = Identity("caller", ("system:authenticated",))


def _h(*lines: tuple[str, str]) -> CIMultiDict[str]:
    return CIMultiDict(lines)


@pytest.mark.parametrize(
    "name,canon",
    [
        ("impersonate-user", "Impersonate-User"),
        ("IMPERSONATE-USER", "Impersonate-User"),
        ("Impersonate_User", "Impersonate_user"),
        ("impersonate-extra-foo.bar", "Impersonate-Extra-Foo.bar"),
        ("x1a-b", "X1a-B"),
        ("bad name", "bad name"),
    ],
)
def test_canonical_header_key_is_gos(name: str, canon: str) -> None:
    assert canonical_header_key(name) == canon


def test_spellings_of_the_user_header_are_one_header_and_the_first_value_wins() -> None:
    req = requested_impersonation(_h(("impersonate-USER", "a"), ("Impersonate-User", "b")))
    assert req == Requested("a")
    # An empty first value is no user at all (Header.Get), whatever follows.
    assert requested_impersonation(_h(("Impersonate-User", ""), ("Impersonate-User", "b"))) is None
    # Another header to Go.
    assert requested_impersonation(_h(("Impersonate_User", "a"))) is None
    assert not asks_impersonation(_h(("Impersonate_User", "a"), ("Impersonate-Foo", "x")))
    assert asks_impersonation(_h(("impersonate-extra-", "x")))


def test_groups_uid_and_extras() -> None:
    req = requested_impersonation(
        _h(
            ("Impersonate-User", "u"),
            ("Impersonate-Group", "g1"),
            ("impersonate-group", ""),
            ("Impersonate-Uid", "id"),
            ("Impersonate-Extra-Acme.io%2fScopes", "a"),
            ("impersonate-extra-acme.io%2Fscopes", "b"),
            ("Impersonate-Extra-Bad%zz", "c"),
        )
    )
    assert req == Requested("u", "id", ("g1", ""), {"acme.io/scopes": ("a", "b"), "bad%zz": ("c",)})
    assert req is not None
    assert effective_identity(req) == Identity(
        "u", ("g1", "", "system:authenticated"), "id", {"acme.io/scopes": ("a", "b"), "bad%zz": ("c",)}
    )


def test_no_user_with_other_headers_is_the_apiservers_400() -> None:
    with pytest.raises(StatusError) as err:
        requested_impersonation(_h(("Impersonate-Group", "g"), ("Impersonate-Extra-K", "v")))
    assert err.value.code == 400
    assert err.value.message == (
        'requested &user.DefaultInfo{Name:"", UID:"", Groups:[]string{"g"}, '
        'Extra:map[string][]string{"k":[]string{"v"}}} without impersonating a user name'
    )
    # An empty uid is no uid: nothing is asked.
    assert requested_impersonation(_h(("Impersonate-Uid", ""))) is None


@pytest.mark.parametrize(
    "user,groups,want",
    [
        ("alice", (), ("system:authenticated",)),
        ("alice", ("system:unauthenticated",), ("system:unauthenticated",)),
        ("alice", ("system:authenticated", "g"), ("system:authenticated", "g")),
        ("system:anonymous", (), ("system:unauthenticated",)),
        ("system:anonymous", ("g",), ("g", "system:unauthenticated")),
        (
            "system:serviceaccount:ns:sa",
            (),
            ("system:serviceaccounts", "system:serviceaccounts:ns", "system:authenticated"),
        ),
        ("system:serviceaccount:ns:sa", ("g",), ("g", "system:authenticated")),
        # Not a service account's name (SplitUsername): no service-account groups.
        ("system:serviceaccount:NS:sa", (), ("system:authenticated",)),
        ("system:serviceaccount:ns:sa:x", (), ("system:authenticated",)),
        ("system:serviceaccount:ns:", (), ("system:authenticated",)),
        # A node with groups: only the legacy mode applies.
        ("system:node:n1", ("g",), ("g", "system:authenticated")),
        # Not a node's name (a DNS subdomain): the user-info and legacy modes agree.
        ("system:node:N1", (), ("system:authenticated",)),
    ],
)
def test_effective_groups(user: str, groups: tuple[str, ...], want: tuple[str, ...]) -> None:
    assert effective_identity(Requested(user, groups=groups)).groups == want


def test_a_node_by_name_alone_is_ambiguous() -> None:
    with pytest.raises(AmbiguousImpersonation):
        effective_identity(Requested("system:node:n1"))
    with pytest.raises(StatusError) as err:
        impersonated(_h(("Impersonate-User", "system:node:n1")), CALLER)
    assert err.value.code == 403
    # With a uid, only the legacy and user-info modes apply: no system:nodes.
    assert effective_identity(Requested("system:node:n1", uid="x")).groups == ("system:authenticated",)


def test_without_impersonation_the_caller_stays() -> None:
    assert impersonated(_h(("Authorization", "Bearer x")), CALLER) is CALLER
