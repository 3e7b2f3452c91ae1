"""AccessReviewer and authorize() against the real apiserver, in process.

A running kproxy's reviewer cannot be reached from the test process, so these tests build the
FilterContext the server builds (an ``Upstream`` from the admin kubeconfig and an ``ApiClient``)
and compare what ``authorize`` raises with what the apiserver itself answers the same caller for
the same request: the no-permission user's 403 and a rejected token's 401, byte for byte.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from kproxy.core.chain import BytesBody, Exchange, Identity
from kproxy.core.context import ApiClient, CredentialsMode, FilterContext
from kproxy.core.requestinfo import parse_request_info, unescape_path
from kproxy.core.status import StatusError
from kproxy.identity.access import AccessReviewer, access_reviewer, api_review, authorize
from kproxy.identity.authn import authenticator
from kproxy.identity.impersonate import CallerAuthenticator
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.server.kubeconfig import from_kubeconfig
from kproxy.server.upstream import Upstream


@pytest.fixture
async def upstream(control_plane: ControlPlaneInfo) -> AsyncIterator[Upstream]:
    """kproxy's upstream as ``ProxyServer.start`` makes it (kproxy's own admin credentials)."""
    up = Upstream(from_kubeconfig(str(control_plane.admin_kubeconfig), None), "forward")
    await up.start()
    yield up
    await up.close()


def make_ctx(upstream: Upstream, mode: CredentialsMode = "forward") -> FilterContext:
    return FilterContext(ApiClient(upstream), mode, CollectorRegistry())


def exchange(target: str, token: str | None) -> Exchange:
    path, _, query = target.partition("?")
    headers: CIMultiDict[str] = CIMultiDict({"Accept": "application/json"})
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    info = parse_request_info("GET", unescape_path(path), query)
    return Exchange("GET", path, query, headers, BytesBody(b"", ""), info)


async def direct(control_plane: ControlPlaneInfo, target: str, token: str) -> tuple[int, bytes, str | None]:
    """The apiserver's own answer to ``GET target`` with ``token``: status, body, nosniff header."""
    ssl = control_plane.ssl_context(client_cert=False)
    headers = {"Accept": "application/json", "Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as s,
        s.get(control_plane.server + target, headers=headers, ssl=ssl) as resp,
    ):
        return resp.status, await resp.read(), resp.headers.get("X-Content-Type-Options")


async def create(ctx: FilterContext, path: str, body: dict[str, Any]) -> None:
    code, answer = await ctx.api.json("POST", path, body)
    assert code == 201, answer


def targets(ns: str) -> list[str]:
    return [
        f"/api/v1/namespaces/{ns}/pods",
        f"/api/v1/namespaces/{ns}/pods/web-1",
        "/api/v1/pods",
        f"/apis/apps/v1/namespaces/{ns}/deployments?labelSelector=app%3Dweb&limit=5",
        f"/api/v1/namespaces/{ns}/pods?fieldSelector=metadata.name%3Dweb-1",
        f"/api/v1/namespaces/{ns}/configmaps?labelSelector=a+in+(b",  # invalid selector: 403 first
        f"/api/v1/namespaces/{ns}/pods/web-1/log",
        "/apis/apps/v1/deployments?resourceVersion=0",
    ]


@pytest.mark.parametrize("mode", ["forward", "impersonate"])
async def test_denied_caller_gets_the_apiservers_own_403(
    control_plane: ControlPlaneInfo, upstream: Upstream, namespace: str, mode: CredentialsMode
) -> None:
    ctx = make_ctx(upstream, mode)
    callers = CallerAuthenticator(ctx, 10, 5) if mode == "impersonate" else None
    reviewer = access_reviewer(ctx, allow_ttl=10, deny_ttl=5, max_entries=100)
    for target in targets(namespace):
        want_code, want_body, want_nosniff = await direct(control_plane, target, control_plane.user_token)
        assert want_code == 403, (target, want_body)
        ex = exchange(target, control_plane.user_token)
        if callers is not None:
            await callers.identify(ex, None)  # what the server does before the chain in impersonate mode
        with pytest.raises(StatusError) as denied:
            await authorize(ctx, reviewer, ex)
        err = denied.value
        assert (err.http_status, err.body(), "nosniff" if err.nosniff else None) == (
            want_code,
            want_body,
            want_nosniff,
        ), target
    assert ctx.registry.get_sample_value(
        "kproxy_watchcache_authorization_decisions_total", {"decision": "denied"}
    ) == len(targets(namespace))


async def test_the_authorizers_reason_is_appended_as_the_apiserver_appends_it(
    control_plane: ControlPlaneInfo, upstream: Upstream, namespace: str
) -> None:
    ctx = make_ctx(upstream)
    # A binding to a Role that does not exist: RBAC has no opinion and gives its rule error as reason.
    await create(
        ctx,
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "dangling"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "missing"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": control_plane.user_name}],
        },
    )
    target = f"/api/v1/namespaces/{namespace}/pods"
    deadline = time.monotonic() + 30
    while True:  # the RBAC authorizer sees the new binding through its informer, moments later
        code, body, _ = await direct(control_plane, target, control_plane.user_token)
        if b"RBAC: " in body or time.monotonic() > deadline:
            break
        await _tick()
    assert code == 403
    assert b'role.rbac.authorization.k8s.io \\"missing\\" not found' in body
    reviewer = AccessReviewer(api_review(ctx), allow_ttl=0, deny_ttl=0)
    with pytest.raises(StatusError) as denied:
        await authorize(ctx, reviewer, exchange(target, control_plane.user_token))
    assert denied.value.body() == body


async def test_a_new_grant_is_seen_once_the_deny_ttl_has_passed(
    control_plane: ControlPlaneInfo, upstream: Upstream, namespace: str
) -> None:
    deny_ttl = 8.0
    ctx = make_ctx(upstream)
    reviewer = access_reviewer(ctx, allow_ttl=60, deny_ttl=deny_ttl, max_entries=100)
    user = control_plane.user_token
    target = f"/api/v1/namespaces/{namespace}/pods"
    info = exchange(target, user).info
    await create(
        ctx,
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    reviewed = time.monotonic()
    with pytest.raises(StatusError) as first:
        await authorize(ctx, reviewer, exchange(target, user))
    assert first.value.code == 403

    await create(
        ctx,
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "pod-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": control_plane.user_name}],
        },
    )
    # The apiserver allows the user as soon as RBAC has seen the binding ...
    deadline = time.monotonic() + 30
    while (await direct(control_plane, target, user))[0] != 200:
        assert time.monotonic() < deadline, "the RoleBinding never took effect upstream"
        await _tick()
    identity = await _identity(ctx, user)
    # ... while the cached denial still stands, until deny_ttl has passed since the review.
    stale = await reviewer.check(identity, info)
    assert (stale.allowed, stale.cached) == (False, True)
    assert time.monotonic() - reviewed < deny_ttl, "too slow to observe the cached denial"
    with pytest.raises(StatusError):
        await authorize(ctx, reviewer, exchange(target, user))

    # Allowed soon after deny_ttl (the bound is generous for a loaded machine, but well below the
    # allow_ttl a denial must never be kept for).
    deadline = reviewed + deny_ttl + 15
    while True:
        decision = await reviewer.check(identity, info)
        if decision.allowed:
            break
        assert decision.cached, "a fresh review denied a caller the apiserver allows"
        assert time.monotonic() < deadline, "the denial outlived deny_ttl"
        await _tick()
    assert not decision.cached  # allowed by a fresh review, once the denial had expired
    assert time.monotonic() - reviewed >= deny_ttl
    await authorize(ctx, reviewer, exchange(target, user))  # no exception: allowed
    await authorize(ctx, reviewer, exchange(f"{target}/web-1", user))  # get, a review of its own
    assert (await reviewer.check(identity, info)).cached
    hits = ctx.registry.get_sample_value("kproxy_watchcache_authorization_cache_total", {"result": "hit"})
    assert hits is not None and hits >= 2


async def test_a_rejected_token_gets_the_apiservers_own_401(
    control_plane: ControlPlaneInfo, upstream: Upstream, namespace: str
) -> None:
    ctx = make_ctx(upstream)
    target = f"/api/v1/namespaces/{namespace}/pods"
    want_code, want_body, _ = await direct(control_plane, target, "not-a-valid-token")
    with pytest.raises(StatusError) as rejected:
        await authorize(ctx, access_reviewer(ctx), exchange(target, "not-a-valid-token"))
    assert (rejected.value.http_status, rejected.value.body()) == (want_code, want_body)
    assert want_code == 401


async def test_admin_token_is_allowed_for_every_target(
    control_plane: ControlPlaneInfo, upstream: Upstream, namespace: str
) -> None:
    ctx = make_ctx(upstream)
    reviewer = access_reviewer(ctx)
    for target in targets(namespace):
        await authorize(ctx, reviewer, exchange(target, control_plane.admin_token))
    assert ctx.registry.get_sample_value(
        "kproxy_watchcache_authorization_decisions_total", {"decision": "allowed"}
    ) == len(targets(namespace))


async def _identity(ctx: FilterContext, token: str) -> Identity:
    found = await authenticator(ctx).authenticate_token(token)
    assert found is not None
    return found


async def _tick() -> None:
    """A short pause between polls (every poll loop is bounded by a deadline)."""
    await asyncio.sleep(0.1)
