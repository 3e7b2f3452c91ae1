"""Impersonation headers and certificate identities (pure logic; the e2e tests use the real apiserver)."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from kproxy.core.chain import Exchange, Identity
from kproxy.core.context import FilterContext
from kproxy.core.status import StatusError
from kproxy.gocompat.httpguts import valid_header_field_name
from kproxy.identity.impersonate import (
    CallerAuthenticator,
    UnrepresentableIdentity,
    escape_extra_key,
    has_impersonation,
    identity_from_peercert,
    impersonation_headers,
    strip_impersonation,
)
from kproxy.testing.exchange import make_exchange


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


# Strings no Impersonate-* header carries to the apiserver unchanged: a control byte Go refuses
# (written raw, CR/LF would end the header line), white space Go's reader trims.
HOSTILE = [
    "eve\r\nImpersonate-Group: system:masters",
    "eve\nImpersonate-Group: system:masters",
    "eve\rx",
    "eve\x00",
    "eve\x01",
    "eve\x7f",
    " system:masters",
    "system:masters\t",
    "eve\ud800",  # no UTF-8 at all (the apiserver's strings are UTF-8 from JSON or a certificate)
]


@pytest.mark.parametrize("bad", HOSTILE)
def test_identities_no_header_can_name_are_refused(bad: str) -> None:
    for ident, field in (
        (Identity(bad), "the user name"),
        (Identity("eve", (bad,)), "group 1"),
        (Identity("eve", ("ok", bad)), "group 2"),
        (Identity("eve", uid=bad), "the uid"),
        (Identity("eve", extra={"k": ("ok", bad)}), "a value of extra k"),
    ):
        with pytest.raises(UnrepresentableIdentity, match=field):
            impersonation_headers(ident)
    with pytest.raises(UnrepresentableIdentity, match="the user name is empty"):
        impersonation_headers(Identity("", ("system:authenticated",)))


def test_odd_but_representable_identities_are_carried_exactly() -> None:
    ident = Identity("ev\te ü", ("dev ops", "☃"), "u 1", {"Key With Space/\r\n%": ("a\tb", "")})
    headers = impersonation_headers(ident)
    assert headers == [
        ("Impersonate-User", "ev\te ü"),
        ("Impersonate-Uid", "u 1"),
        ("Impersonate-Group", "dev ops"),
        ("Impersonate-Group", "☃"),
        ("Impersonate-Extra-Key%20With%20Space%2F%0D%0A%25", "a\tb"),
        ("Impersonate-Extra-Key%20With%20Space%2F%0D%0A%25", ""),
    ]
    assert all(valid_header_field_name(name) for name, _ in headers)


class ReviewApi:
    """Answers every TokenReview with ``user`` (what a webhook or OIDC authenticator could say)."""

    def __init__(self, user: dict[str, Any]) -> None:
        self.user = user

    async def json(self, method: str, target: str, body: Any = None, **_: Any) -> tuple[int, Any]:
        return 201, {"kind": "TokenReview", "status": {"authenticated": True, "user": self.user}}


def caller(user: dict[str, Any]) -> CallerAuthenticator:
    ctx = FilterContext(ReviewApi(user), "impersonate", CollectorRegistry())  # type: ignore[arg-type]
    return CallerAuthenticator(ctx, token_ttl=10, rejected_ttl=5)


def request(headers: dict[str, str]) -> Exchange:
    return make_exchange("GET", "/api/v1/pods", headers)


@pytest.mark.parametrize(
    "user",
    [
        {"username": "eve\r\nImpersonate-Group: system:masters", "groups": ["system:authenticated"]},
        {"username": "eve", "groups": ["system:authenticated", "devs\nImpersonate-User: admin"]},
        {"username": "eve", "uid": "1\x00", "groups": []},
        {"username": "eve", "extra": {"scopes": ["read\r\nImpersonate-Group: system:masters"]}},
        {"username": " admin", "groups": []},
        {"username": "", "groups": ["system:masters"]},
    ],
)
async def test_token_review_identities_no_header_can_name_get_401(user: dict[str, Any]) -> None:
    """The apiserver's own token sources here cannot make such a user (service accounts and the
    static token file are fixed); a webhook or JWT authenticator could, so the review's answer is
    stood in for."""
    ex = request({"Authorization": "Bearer t"})
    with pytest.raises(StatusError) as err:
        await caller(user).identify(ex, None)
    assert (err.value.code, err.value.reason) == (401, "Unauthorized")
    assert err.value.message.startswith("Unauthorized: kproxy cannot impersonate this caller: ")
    assert ex.identity is None


async def test_certificate_identities_no_header_can_name_get_401() -> None:
    cert = {"subject": ((("organizationName", "system:masters "),), (("commonName", "eve"),))}
    with pytest.raises(StatusError) as err:
        await caller({}).identify(request({}), cert)
    assert err.value.code == 401 and "group 1 begins or ends with white space" in err.value.message
    ok = await caller({}).identify(request({}), {"subject": ((("commonName", "ev\te ü"),),)})
    assert ok == Identity("ev\te ü", ("system:authenticated",))
