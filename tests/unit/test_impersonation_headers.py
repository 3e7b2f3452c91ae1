"""Impersonation headers and certificate identities (pure logic; the e2e tests use the real apiserver)."""

from __future__ import annotations

from multidict import CIMultiDict

from kproxy.chain import Identity
from kproxy.impersonate import (
    escape_extra_key,
    has_impersonation,
    identity_from_peercert,
    impersonation_headers,
    strip_impersonation,
)


def test_extra_keys_are_escaped_as_client_go_does() -> None:
    assert escape_extra_key("authentication.kubernetes.io/pod-name") == "authentication.kubernetes.io%2Fpod-name"
    assert escape_extra_key("100%") == "100%25"
    assert escape_extra_key("a b") == "a%20b"
    assert escape_extra_key("ü") == "%C3%BC"


def test_headers_for_an_identity() -> None:
    ident = Identity("system:serviceaccount:ns:robot", ("g1", "g2"), "u-1", {"k/x": ("v1", "v2")})
    assert impersonation_headers(ident) == [
        ("Impersonate-User", "system:serviceaccount:ns:robot"),
        ("Impersonate-Uid", "u-1"),
        ("Impersonate-Group", "g1"),
        ("Impersonate-Group", "g2"),
        ("Impersonate-Extra-k%2Fx", "v1"),
        ("Impersonate-Extra-k%2Fx", "v2"),
    ]


def test_caller_impersonation_headers_are_removed() -> None:
    h = CIMultiDict([("impersonate-user", "admin"), ("Impersonate-Group", "system:masters"), ("Accept", "x")])
    assert has_impersonation(h)
    strip_impersonation(h)
    assert list(h.items()) == [("Accept", "x")]
    assert not has_impersonation(h)


def test_certificate_identity() -> None:
    cert = {"subject": ((("organizationName", "devs"),), (("organizationName", "ops"),), (("commonName", "alice"),))}
    assert identity_from_peercert(cert) == Identity("alice", ("devs", "ops", "system:authenticated"))
    assert identity_from_peercert({"subject": ((("organizationName", "devs"),),)}) is None
    assert identity_from_peercert(None) is None
