"""kproxy/identity/impersonate.py AdminCheck: the cluster-admin question, asked once per identity
and cached; an operator's listing skips it; no answer never lets the identity through."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kproxy.core.chain import Identity
from kproxy.core.context import FilterContext
from kproxy.identity.access import AccessReviewError
from kproxy.identity.impersonate import AdminCheck, ClusterAdmin


class Allowance:
    def __init__(self, groups: tuple[str, ...] = (), users: tuple[str, ...] = ()) -> None:
        self.allowed_privileged_groups = groups
        self.allowed_privileged_users = users


class FakeApi:
    """Answers SubjectAccessReviews: allowed for members of ``admins``."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.fail = False

    async def json(self, method: str, target: str, body: Any = None, **_: Any) -> tuple[int, Any]:
        self.bodies.append(body)
        if self.fail:
            raise OSError("connection refused")
        allowed = "admins" in body["spec"]["groups"]
        return 201, {"kind": "SubjectAccessReview", "status": {"allowed": allowed}}


def make() -> tuple[AdminCheck, FakeApi]:
    api = FakeApi()
    ctx = FilterContext(api, "impersonate", CollectorRegistry())  # type: ignore[arg-type]
    return AdminCheck(ctx, 10.0), api


async def test_asks_whether_the_identity_may_do_everything_and_caches_it() -> None:
    check, api = make()
    olga = Identity("olga", ("admins", "system:authenticated"), "u1", {"k": ("v",)})
    with pytest.raises(ClusterAdmin) as err:
        await check.check(olga, Allowance())
    assert err.value.status().code == 403
    assert api.bodies == [
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "resourceAttributes": {"verb": "*", "group": "*", "version": "*", "resource": "*"},
                "user": "olga",
                "groups": ["admins", "system:authenticated"],
                "uid": "u1",
                "extra": {"k": ["v"]},
            },
        }
    ]
    with pytest.raises(ClusterAdmin):
        await check.check(olga, Allowance())
    alice = Identity("alice", ("devs", "system:authenticated"))
    await check.check(alice, Allowance())
    await check.check(alice, Allowance())
    assert len(api.bodies) == 2  # one review per identity


async def test_a_listed_identity_is_not_asked_about() -> None:
    check, api = make()
    olga = Identity("olga", ("admins", "system:authenticated"))
    await check.check(olga, Allowance(groups=("admins",)))
    await check.check(olga, Allowance(users=("olga",)))
    assert api.bodies == []


async def test_no_answer_is_no_permission() -> None:
    check, api = make()
    api.fail = True
    with pytest.raises(AccessReviewError):
        await check.check(Identity("alice", ("devs",)), Allowance())
