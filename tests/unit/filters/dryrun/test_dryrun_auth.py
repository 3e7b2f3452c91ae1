"""kproxy/identity/authn.py without an apiserver: token extraction, the review cache, identify() per mode.

The apiserver's answers are stood in for by a fake ``ctx.api``; the real TokenReview and
SelfSubjectReview round trips are covered in tests/e2e/test_auth.py.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kproxy.core.chain import Exchange
from kproxy.core.context import FilterContext
from kproxy.core.status import StatusError
from kproxy.identity.authn import ANONYMOUS, Authenticator, authenticator, caller_tokens
from kproxy.testing.exchange import make_exchange

USERS = {"good": {"username": "alice", "uid": "u1", "groups": ["dev", "system:authenticated"], "extra": {"k": ["v"]}}}


class FakeApi:
    """Answers TokenReviews from USERS and SelfSubjectReviews as "kproxy-admin"."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail = False
        self.gate: asyncio.Event | None = None

    async def json(self, method: str, target: str, body: Any = None, **_: Any) -> tuple[int, Any]:
        self.calls.append((target, body))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise OSError("connection refused")
        if target.endswith("/tokenreviews"):
            user = USERS.get(body["spec"]["token"])
            status = {"authenticated": True, "user": user} if user else {"authenticated": False, "error": "invalid"}
            return 201, {"kind": "TokenReview", "status": status}
        if target.endswith("/selfsubjectreviews"):
            return 201, {"status": {"userInfo": {"username": "kproxy-admin", "groups": ["system:masters"]}}}
        return 404, {"message": "not found"}


def make(mode: str = "forward", **kw: Any) -> tuple[Authenticator, FakeApi, list[float]]:
    api = FakeApi()
    ctx = FilterContext(api, mode, CollectorRegistry())  # type: ignore[arg-type]
    now = [1000.0]
    auth = Authenticator(ctx, clock=lambda: now[0], **kw)
    return auth, api, now


def exchange(headers: dict[str, str]) -> Exchange:
    return make_exchange("GET", "/api/v1/pods", headers)


def bearer_token(headers: dict[str, str]) -> str | None:
    """The first token the apiserver would review for these headers (kproxy.identity.authn.caller_tokens)."""
    tokens, _ = caller_tokens(headers)
    return tokens[0][0] if tokens else None


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER abc extra", "abc"),
        ("  Bearer abc  ", "abc"),
        ("Bearer  abc", None),  # a double space: Go's Split gives an empty token
        ("Bearer", None),
        ("Basic dXNlcjpwdw==", None),
        ("", None),
    ],
)
def test_bearer_token_like_the_apiserver(header: str, token: str | None) -> None:
    assert bearer_token({"Authorization": header} if header else {}) == token


def test_websocket_protocol_token() -> None:
    encoded = base64.urlsafe_b64encode(b"tok").decode().rstrip("=")
    headers = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Protocol": f"v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.{encoded}",
    }
    assert bearer_token(headers) == "tok"


async def test_reviews_are_cached_with_separate_ttls() -> None:
    auth, api, now = make(success_ttl=60, failure_ttl=5)
    alice = await auth.authenticate_token("good")
    assert alice is not None and alice.user == "alice" and alice.groups == ("dev", "system:authenticated")
    assert alice.extra == {"k": ("v",)}
    assert await auth.authenticate_token("bad") is None
    assert await auth.authenticate_token("good") == alice
    assert await auth.authenticate_token("bad") is None
    assert len(api.calls) == 2
    now[0] += 6  # the rejection expired, the success not yet
    await auth.authenticate_token("bad")
    await auth.authenticate_token("good")
    assert len(api.calls) == 3
    now[0] += 60
    await auth.authenticate_token("good")
    assert len(api.calls) == 4
    # the cache never holds the token itself
    assert all(b"good" not in k for k in auth._cache._data)


async def test_cache_is_bounded() -> None:
    auth, api, _ = make(max_rejected_entries=3)
    for i in range(10):
        await auth.authenticate_token(f"t{i}")
    assert len(auth._rejected) == 3 and len(auth._cache) == 0
    await auth.authenticate_token("t0")  # evicted: asked again
    assert len(api.calls) == 11


async def test_rejected_tokens_never_evict_an_accepted_one() -> None:
    auth, api, _ = make(max_entries=1, max_rejected_entries=3)
    assert (await auth.authenticate_token("good")) is not None
    for i in range(100):  # a sprayer's random tokens, all rejected
        assert await auth.authenticate_token(f"spray-{i}") is None
    assert len(auth._rejected) == 3
    calls = len(api.calls)
    assert (await auth.authenticate_token("good")) is not None
    assert len(api.calls) == calls  # still cached: no second review


async def test_concurrent_requests_share_one_review() -> None:
    auth, api, _ = make()
    api.gate = asyncio.Event()
    tasks = [asyncio.create_task(auth.authenticate_token("good")) for _ in range(5)]
    await asyncio.sleep(0)
    api.gate.set()
    results = await asyncio.gather(*tasks)
    assert len(api.calls) == 1 and {r.user for r in results if r} == {"alice"}


async def test_review_errors_are_not_cached_and_identify_gives_a_500() -> None:
    auth, api, _ = make()
    api.fail = True
    with pytest.raises(StatusError) as err:
        await auth.identify(exchange({"Authorization": "Bearer good"}))
    assert err.value.http_status == 500
    api.fail = False
    ex = exchange({"Authorization": "Bearer good"})
    assert (await auth.identify(ex)).user == "alice"
    assert ex.identity is not None and ex.identity.user == "alice"


async def test_identify_forward_mode() -> None:
    auth, _, _ = make()
    assert await auth.identify(exchange({})) == ANONYMOUS
    with pytest.raises(StatusError) as err:
        await auth.identify(exchange({"Authorization": "Bearer nope"}))
    assert err.value.http_status == 401
    assert err.value.body() == (
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized",'
        b'"reason":"Unauthorized","code":401}\n'
    )


async def test_identify_proxy_mode_asks_once() -> None:
    auth, api, _ = make("proxy")
    for _ in range(3):
        me = await auth.identify(exchange({"Authorization": "Bearer good"}))
        assert me.user == "kproxy-admin" and me.groups == ("system:masters",)
    assert [t for t, _ in api.calls] == ["/apis/authentication.k8s.io/v1/selfsubjectreviews"]


def test_one_authenticator_per_context() -> None:
    ctx = FilterContext(FakeApi(), "forward", CollectorRegistry())  # type: ignore[arg-type]
    assert authenticator(ctx) is authenticator(ctx)
    Authenticator(ctx)  # another one on the same registry does not clash on metrics
