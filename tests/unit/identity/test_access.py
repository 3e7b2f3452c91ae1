"""kproxy/identity/access.py without an apiserver: the decision cache, the review's shape, ``authorize``.

The apiserver's SubjectAccessReview answers are stood in for by a fake ``review`` callable (or a
fake ``ctx.api``); the real round trips and the byte-exact 403/401 are in
tests/e2e/test_access_reviews.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from kproxy.core.chain import Exchange, Identity
from kproxy.core.context import ApiClient, FilterContext
from kproxy.core.requestinfo import RequestInfo, parse_request_info
from kproxy.core.status import StatusError
from kproxy.identity.access import (
    SUBJECT_ACCESS_REVIEWS,
    AccessReviewer,
    AccessReviewError,
    AccessUndecided,
    UndecidedError,
    access_reviewer,
    authorize,
    review_body,
)
from kproxy.testing.clock import FakeClock
from kproxy.testing.exchange import make_exchange

ALICE = Identity(user="alice", groups=("dev", "system:authenticated"), uid="u1", extra={"scopes": ("a", "b")})
BOB = Identity(user="bob", groups=("system:authenticated",))

Answer = Callable[[dict[str, Any]], tuple[int, Any]]


def sar_answer(allowed: bool, reason: str = "", **status: Any) -> tuple[int, Any]:
    st: dict[str, Any] = {"allowed": allowed, **status}
    if reason:
        st["reason"] = reason
    return 201, {"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1", "status": st}


class FakeReview:
    """A ``Review`` that records every body and answers with ``answer(body)``; ``gate`` holds it back."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.answer: Answer = answer or (lambda _body: sar_answer(True))
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.error: BaseException | None = None

    async def __call__(self, body: dict[str, Any]) -> tuple[int, Any]:
        self.bodies.append(body)
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return self.answer(body)


def pods(query: str = "", ns: str = "ns", name: str = "", method: str = "GET") -> RequestInfo:
    path = f"/api/v1/namespaces/{ns}/pods" + (f"/{name}" if name else "")
    return parse_request_info(method, path, query)


# ------------------------------------------------------------------ the review's shape


def test_review_body_carries_every_attribute_the_authorizer_sees() -> None:
    info = parse_request_info(
        "GET", "/apis/apps/v1/namespaces/ns/deployments", "labelSelector=app%3Dweb&fieldSelector=metadata.name%3Dx"
    )
    body = review_body(ALICE, info, label_selector=info.label_selector, field_selector=info.field_selector)
    assert body == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "namespace": "ns",
                "verb": "list",
                "group": "apps",
                "version": "v1",
                "resource": "deployments",
                # fieldSelector=metadata.name=x makes the RequestInfo name x, as in the apiserver
                "name": "x",
                "fieldSelector": {"rawSelector": "metadata.name=x"},
                "labelSelector": {"rawSelector": "app=web"},
            },
            "user": "alice",
            "groups": ["dev", "system:authenticated"],
            "uid": "u1",
            "extra": {"scopes": ["a", "b"]},
        },
    }


def test_review_body_omits_empty_attributes_and_overrides_the_verb() -> None:
    body = review_body(BOB, pods(name="p"), verb="get")
    assert body["spec"] == {
        "resourceAttributes": {"namespace": "ns", "verb": "get", "version": "v1", "resource": "pods", "name": "p"},
        "user": "bob",
        "groups": ["system:authenticated"],
    }
    sub = parse_request_info("GET", "/api/v1/namespaces/ns/pods/p/log")
    assert review_body(BOB, sub)["spec"]["resourceAttributes"]["subresource"] == "log"


def test_review_body_for_a_non_resource_request() -> None:
    body = review_body(BOB, parse_request_info("GET", "/healthz"))
    assert body["spec"] == {
        "nonResourceAttributes": {"path": "/healthz", "verb": "get"},
        "user": "bob",
        "groups": ["system:authenticated"],
    }


# ------------------------------------------------------------------ the decision cache


async def test_decisions_are_cached_per_attributes() -> None:
    review = FakeReview(lambda body: sar_answer(body["spec"]["user"] == "alice"))
    r = AccessReviewer(review)
    first = await r.check(ALICE, pods())
    again = await r.check(ALICE, pods())
    assert (first.allowed, first.cached, again.allowed, again.cached) == (True, False, True, True)
    assert len(review.bodies) == 1
    # Every attribute is part of the key: another user, verb, namespace, name, selector each ask again.
    assert not (await r.check(BOB, pods())).allowed
    await r.check(ALICE, pods(), verb="watch")
    await r.check(ALICE, pods(ns="other"))
    await r.check(ALICE, pods(name="p"))
    await r.check(ALICE, pods(), label_selector="a=b")
    await r.check(ALICE, pods(), field_selector="spec.nodeName=n")
    await r.check(Identity(user="alice", groups=("dev",), uid="u1", extra=ALICE.extra), pods())
    await r.check(Identity(user="alice", groups=ALICE.groups, uid="u1"), pods())
    assert len(review.bodies) == 9
    assert review.bodies[5]["spec"]["resourceAttributes"]["labelSelector"] == {"rawSelector": "a=b"}
    assert review.bodies[6]["spec"]["resourceAttributes"]["fieldSelector"] == {"rawSelector": "spec.nodeName=n"}
    # ... and all of them are remembered.
    assert (await r.check(ALICE, pods(), field_selector="spec.nodeName=n")).cached
    assert len(review.bodies) == 9


async def test_allow_and_deny_have_separate_lifetimes() -> None:
    clock = FakeClock()
    review = FakeReview(lambda body: sar_answer(body["spec"]["user"] == "alice"))
    r = AccessReviewer(review, allow_ttl=10, deny_ttl=5, clock=clock)
    await r.check(ALICE, pods())
    await r.check(BOB, pods())
    clock.now += 4.9
    assert (await r.check(ALICE, pods())).cached
    assert (await r.check(BOB, pods())).cached
    clock.now += 0.1  # 5 s: the denial is stale, the allow is not
    assert (await r.check(ALICE, pods())).cached
    denied = await r.check(BOB, pods())
    assert (denied.allowed, denied.cached) == (False, False)
    clock.now += 4.9  # 9.9 s after the allow
    assert (await r.check(ALICE, pods())).cached
    clock.now += 0.1  # 10 s
    assert not (await r.check(ALICE, pods())).cached
    assert [b["spec"]["user"] for b in review.bodies] == ["alice", "bob", "bob", "alice"]


async def test_a_decision_expires_counting_from_when_the_review_was_sent() -> None:
    clock = FakeClock()

    def slow(body: dict[str, Any]) -> tuple[int, Any]:
        clock.now += 3  # the apiserver took 3 s to answer
        return sar_answer(True)

    review = FakeReview(slow)
    r = AccessReviewer(review, allow_ttl=10, clock=clock)
    await r.check(ALICE, pods())
    clock.now += 6.9  # 9.9 s after the review was sent
    assert (await r.check(ALICE, pods())).cached
    clock.now += 0.1
    assert not (await r.check(ALICE, pods())).cached


async def test_zero_ttl_means_no_reuse() -> None:
    review = FakeReview()
    r = AccessReviewer(review, allow_ttl=0, deny_ttl=0)
    await r.check(ALICE, pods())
    await r.check(ALICE, pods())
    assert len(review.bodies) == 2


async def test_the_cache_is_a_bounded_lru() -> None:
    review = FakeReview()
    r = AccessReviewer(review, max_entries=2)
    a, b, c = pods(ns="a"), pods(ns="b"), pods(ns="c")
    await r.check(ALICE, a)
    await r.check(ALICE, b)
    assert (await r.check(ALICE, a)).cached  # a is now the most recently used
    await r.check(ALICE, c)  # evicts b, the least recently used
    assert len(r) == 2
    assert (await r.check(ALICE, a)).cached
    assert (await r.check(ALICE, c)).cached
    assert not (await r.check(ALICE, b)).cached
    assert [x["spec"]["resourceAttributes"]["namespace"] for x in review.bodies] == ["a", "b", "c", "b"]


async def test_concurrent_identical_checks_share_one_review() -> None:
    review = FakeReview(lambda _b: sar_answer(False, "RBAC: nope"))
    review.gate = asyncio.Event()
    r = AccessReviewer(review)
    tasks = [asyncio.ensure_future(r.check(ALICE, pods())) for _ in range(20)]
    other = asyncio.ensure_future(r.check(BOB, pods()))
    await review.started.wait()
    await asyncio.sleep(0)
    review.gate.set()
    results = await asyncio.gather(*tasks)
    await other
    assert len(review.bodies) == 2  # one for alice's 20 checks, one for bob
    assert {(d.allowed, d.reason) for d in results} == {(False, "RBAC: nope")}
    assert sorted(d.cached for d in results) == [False] + [True] * 19


async def test_a_caller_going_away_does_not_cancel_the_shared_review() -> None:
    review = FakeReview()
    review.gate = asyncio.Event()
    r = AccessReviewer(review)
    first = asyncio.ensure_future(r.check(ALICE, pods()))
    await review.started.wait()
    second = asyncio.ensure_future(r.check(ALICE, pods()))
    await asyncio.sleep(0)
    first.cancel()
    review.gate.set()
    decision = await second
    assert first.cancelled()
    assert (decision.allowed, decision.cached) == (True, True)
    assert (await r.check(ALICE, pods())).cached  # the review's answer was stored
    assert len(review.bodies) == 1


@pytest.mark.parametrize(
    "answer",
    [
        lambda _b: (403, {"kind": "Status", "message": "subjectaccessreviews is forbidden"}),
        lambda _b: (500, "oops"),
        lambda _b: (201, {"kind": "SubjectAccessReview"}),  # no status
        lambda _b: (201, ["not", "an", "object"]),
    ],
)
async def test_unexpected_answers_are_errors_and_never_cached(answer: Answer) -> None:
    review = FakeReview(answer)
    r = AccessReviewer(review)
    for _ in range(2):
        with pytest.raises(AccessReviewError) as info:
            await r.check(ALICE, pods())
        assert not isinstance(info.value, AccessUndecided)
    assert len(review.bodies) == 2
    assert len(r) == 0


async def test_an_unreachable_apiserver_is_an_error_for_every_waiter_and_never_cached() -> None:
    review = FakeReview()
    review.error = OSError("connection refused")
    review.gate = asyncio.Event()
    r = AccessReviewer(review)
    tasks = [asyncio.ensure_future(r.check(ALICE, pods())) for _ in range(3)]
    await review.started.wait()
    review.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(e, AccessReviewError) and "connection refused" in str(e) for e in results)
    assert len(review.bodies) == 1
    review.error = None
    review.gate = None
    assert (await r.check(ALICE, pods())).allowed  # the next check asks again
    assert len(review.bodies) == 2


async def test_evaluation_errors_and_conditional_decisions_are_undecided() -> None:
    answers = iter(
        [
            sar_answer(False, evaluationError="webhook timed out"),
            sar_answer(False, evaluationError="spec.resourceAttributes.labelSelector ignored due to parse error"),
            (201, {"status": {"conditionalDecision": {"conditions": []}}}),
            # an allow stands whatever the evaluation error (the apiserver's filter checks it first)
            sar_answer(True, evaluationError="some rule failed"),
        ]
    )
    r = AccessReviewer(FakeReview(lambda _b: next(answers)))
    with pytest.raises(AccessUndecided, match="webhook timed out"):
        await r.check(ALICE, pods(), label_selector="a in (b")
    # Selector parse notes are not the authorizer's error: a plain denial, as the real request gets.
    denied = await r.check(ALICE, pods(), label_selector="a in (b")
    assert (denied.allowed, denied.reason) == (False, "")
    with pytest.raises(AccessUndecided, match="conditional"):
        await r.check(ALICE, pods(ns="x"))
    assert (await r.check(ALICE, pods(ns="x"))).allowed
    assert len(r) == 2  # the denial and the allow; neither undecided answer


async def test_on_decision_reports_every_check() -> None:
    seen: list[tuple[str, bool]] = []
    review = FakeReview(lambda body: sar_answer(body["spec"]["user"] == "alice"))
    r = AccessReviewer(review, on_decision=lambda d, hit: seen.append((d, hit)))
    await r.check(ALICE, pods())
    await r.check(ALICE, pods())
    await r.check(BOB, pods())
    review.error = OSError("down")
    with pytest.raises(AccessReviewError):
        await r.check(BOB, pods(ns="other"))
    assert seen == [("allowed", False), ("allowed", True), ("denied", False), ("error", False)]


# ------------------------------------------------------------------ authorize() and access_reviewer()


class FakeApi:
    """Answers TokenReviews (token "good" is alice, anything else rejected) and SubjectAccessReviews."""

    def __init__(self, allowed: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.allowed = allowed
        self.calls: list[tuple[str, Any]] = []

    async def json(self, method: str, target: str, body: Any = None, **_: Any) -> tuple[int, Any]:
        self.calls.append((target, body))
        if target.endswith("/tokenreviews"):
            if body["spec"]["token"] == "good":
                return 201, {"status": {"authenticated": True, "user": {"username": "alice", "groups": ["dev"]}}}
            return 201, {"status": {"authenticated": False}}
        assert target == SUBJECT_ACCESS_REVIEWS
        return 201, {"status": self.allowed(body)}


def make_ctx(api: FakeApi, credentials: str = "forward") -> FilterContext:
    return FilterContext(cast(ApiClient, api), cast(Any, credentials), CollectorRegistry())


def exchange(path: str, query: str = "", token: str | None = "good") -> Exchange:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return make_exchange("GET", f"{path}?{query}" if query else path, headers)


def metric(ctx: FilterContext, name: str, **labels: str) -> float:
    value = ctx.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_authorize_allows_and_denies_with_the_apiservers_403() -> None:
    api = FakeApi(lambda b: {"allowed": b["spec"]["resourceAttributes"].get("namespace") == "mine", "reason": "R"})
    ctx = make_ctx(api)
    reviewer = access_reviewer(ctx, allow_ttl=10, deny_ttl=5, max_entries=100)
    await authorize(ctx, reviewer, exchange("/api/v1/namespaces/mine/pods", "labelSelector=a%3Db"))
    sar = api.calls[-1][1]["spec"]
    assert (sar["user"], sar["groups"], sar["resourceAttributes"]["labelSelector"]) == (
        "alice",
        ["dev"],
        {"rawSelector": "a=b"},
    )
    with pytest.raises(StatusError) as denied:
        await authorize(ctx, reviewer, exchange("/api/v1/namespaces/theirs/pods/p"))
    err = denied.value
    assert (err.code, err.reason, err.nosniff) == (403, "Forbidden", True)
    assert err.message == (
        'pods "p" is forbidden: User "alice" cannot get resource "pods" in API group "" in the namespace "theirs": R'
    )
    # The verb the caller is checked for can be another than the request's own.
    with pytest.raises(StatusError) as as_list:
        await authorize(ctx, reviewer, exchange("/api/v1/namespaces/theirs/pods"), verb="watch")
    assert "cannot watch resource" in as_list.value.message
    assert api.calls[-1][1]["spec"]["resourceAttributes"]["verb"] == "watch"
    # The watch cache's counters (and only the reviewer made by access_reviewer reports there).
    name = "kproxy_watchcache_authorization_decisions_total"
    assert metric(ctx, name, decision="allowed") == 1
    assert metric(ctx, name, decision="denied") == 2
    assert metric(ctx, "kproxy_watchcache_authorization_cache_total", result="miss") == 3
    await authorize(ctx, reviewer, exchange("/api/v1/namespaces/mine/pods", "labelSelector=a%3Db"))
    assert metric(ctx, "kproxy_watchcache_authorization_cache_total", result="hit") == 1


async def test_authorize_rejected_token_gets_401_and_no_review() -> None:
    api = FakeApi(lambda _b: {"allowed": True})
    ctx = make_ctx(api)
    with pytest.raises(StatusError) as err:
        await authorize(ctx, access_reviewer(ctx), exchange("/api/v1/pods", token="bad"))
    assert (err.value.code, err.value.message) == (401, "Unauthorized")
    assert all(not target.endswith("subjectaccessreviews") for target, _ in api.calls)


async def test_authorize_without_token_checks_the_anonymous_user() -> None:
    api = FakeApi(lambda _b: {"allowed": False})
    ctx = make_ctx(api)
    with pytest.raises(StatusError) as err:
        await authorize(ctx, access_reviewer(ctx), exchange("/api/v1/pods", token=None))
    assert err.value.message == (
        'pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" at the cluster scope'
    )
    assert api.calls[-1][1]["spec"]["groups"] == ["system:unauthenticated"]


async def test_authorize_in_impersonate_mode_reviews_the_identity_already_established() -> None:
    api = FakeApi(lambda b: {"allowed": b["spec"]["user"] == "carol"})
    ctx = make_ctx(api, "impersonate")
    ex = exchange("/api/v1/pods", token=None)
    ex.identity = Identity(user="carol", groups=("ops", "system:authenticated"))
    await authorize(ctx, access_reviewer(ctx), ex)
    assert [t for t, _ in api.calls] == [SUBJECT_ACCESS_REVIEWS]


async def test_authorize_in_proxy_mode_checks_nothing() -> None:
    api = FakeApi(lambda _b: {"allowed": False})
    ctx = make_ctx(api, "proxy")
    await authorize(ctx, access_reviewer(ctx), exchange("/api/v1/pods"))
    assert api.calls == []


async def test_authorize_errors_are_500s_and_undecided_is_distinguishable() -> None:
    api = FakeApi(lambda _b: {"allowed": False, "evaluationError": "webhook down"})
    ctx = make_ctx(api)
    reviewer = access_reviewer(ctx)
    with pytest.raises(UndecidedError) as undecided:
        await authorize(ctx, reviewer, exchange("/api/v1/pods"))
    assert undecided.value.code == 500
    assert "webhook down" in undecided.value.message

    async def broken(_body: dict[str, Any]) -> tuple[int, Any]:
        raise TimeoutError

    with pytest.raises(StatusError) as failed:
        await authorize(ctx, AccessReviewer(broken), exchange("/api/v1/pods"))
    assert not isinstance(failed.value, UndecidedError)
    assert failed.value.code == 500
    assert failed.value.message == (
        "Internal error occurred: kproxy could not authorize the request: SubjectAccessReview failed: TimeoutError"
    )
    assert metric(ctx, "kproxy_watchcache_authorization_decisions_total", decision="error") == 1


async def test_access_reviewer_is_shared_per_settings() -> None:
    ctx = make_ctx(FakeApi(lambda _b: {"allowed": True}))
    one = access_reviewer(ctx, allow_ttl=10, deny_ttl=5, max_entries=10)
    assert access_reviewer(ctx, allow_ttl=10, deny_ttl=5, max_entries=10) is one
    other = access_reviewer(ctx, allow_ttl=1, deny_ttl=5, max_entries=10)
    assert other is not one
    assert (other.allow_ttl, other.deny_ttl, other.max_entries) == (1, 5, 10)
    # Every series exists from the start, at zero.
    for d in ("allowed", "denied", "error"):
        assert ctx.registry.get_sample_value("kproxy_watchcache_authorization_decisions_total", {"decision": d}) == 0
