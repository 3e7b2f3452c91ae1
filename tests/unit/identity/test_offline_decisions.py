"""The decisions kept for reads through an outage (``AccessReviewer.allowed_within``) and what
counts as an unreachable upstream (``kproxy.filters.watchcache.outage_serving.unreachable``), without an
apiserver; the whole scenario is tests/e2e/test_watchcache_outage_serving.py."""

from __future__ import annotations

import asyncio

import aiohttp
from test_access import ALICE, BOB, FakeReview, pods, sar_answer

from kproxy.cacher.reflector import Expired
from kproxy.core.listwatch import UpstreamError
from kproxy.core.status import internal_error
from kproxy.filters.watchcache.outage_serving import unreachable
from kproxy.identity.access import AccessReviewer, AccessReviewError
from kproxy.testing.clock import FakeClock


async def test_an_allow_is_kept_for_its_bound_and_a_denial_ends_it() -> None:
    clock = FakeClock()
    allow = {"alice": True}
    review = FakeReview(lambda body: sar_answer(allow.get(body["spec"]["user"], False)))
    r = AccessReviewer(review, allow_ttl=10, deny_ttl=5, clock=clock)
    await r.check(ALICE, pods())
    assert r.allowed_within(ALICE, pods(), 300) is None  # nothing kept unless asked (remember 0)
    r.remember = 300
    await r.check(BOB, pods())  # denied: never kept
    clock.now += 11  # past allow_ttl: reviewed again, and kept this time
    await r.check(ALICE, pods())
    clock.now += 100
    assert r.allowed_within(ALICE, pods(), 300) == 100
    assert r.allowed_within(ALICE, pods(), 60) is None  # the caller's bound, not only remember
    assert r.allowed_within(BOB, pods(), 300) is None
    assert r.allowed_within(ALICE, pods(ns="other"), 300) is None  # exactly these attributes
    assert r.allowed_within(ALICE, pods(), 300, label_selector="a=b") is None
    clock.now += 200  # 300 s after the review was sent
    assert r.allowed_within(ALICE, pods(), 1000) is None
    await r.check(ALICE, pods())
    allow["alice"] = False
    clock.now += 11
    assert not (await r.check(ALICE, pods())).allowed
    assert r.allowed_within(ALICE, pods(), 300) is None  # the denial ended the last allow


def test_only_a_connection_that_failed_is_an_outage() -> None:
    refused = ConnectionRefusedError(111, "Connection refused")
    assert unreachable(refused)
    assert unreachable(TimeoutError())
    assert unreachable(aiohttp.ServerDisconnectedError())
    assert unreachable(asyncio.IncompleteReadError(b"", 10))
    wrapped = internal_error("kproxy could not authorize the request")
    try:
        try:
            raise refused
        except OSError as err:
            raise AccessReviewError("SubjectAccessReview failed") from err
    except AccessReviewError as err:
        wrapped.__cause__ = err
    assert unreachable(wrapped)
    # The apiserver answered (any code): not an outage.
    assert not unreachable(UpstreamError("upstream answered 503"))
    assert not unreachable(Expired("410"))
    assert not unreachable(AccessReviewError("SubjectAccessReview answered 500: etcd"))
    assert not unreachable(None)
