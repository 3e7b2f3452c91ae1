"""kproxy/identity/impersonate.py AdminCheck: the cluster-admin questions (ADMIN_QUESTIONS), asked
concurrently once per identity and cached; ANY allowed refuses the identity; an operator's listing
skips them; no answer never lets the identity through."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kproxy.core.chain import Identity
from kproxy.core.context import FilterContext
from kproxy.identity.access import AccessReviewError
from kproxy.identity.impersonate import ADMIN_QUESTIONS, NOT_ADMIN_TTL, AdminCheck, ClusterAdmin


class Allowance:
    def __init__(self, groups: tuple[str, ...] = (), users: tuple[str, ...] = ()) -> None:
        self.allowed_privileged_groups = groups
        self.allowed_privileged_users = users


def attrs(body: dict[str, Any]) -> tuple[str, ...]:
    a = body["spec"]["resourceAttributes"]
    return tuple(a.get(k, "") for k in ("namespace", "verb", "group", "resource", "subresource"))


class FakeApi:
    """Answers SubjectAccessReviews: everything for members of ``admins``; for a member of a group
    named ``grants:<namespace>/<verb>/<group>/<resource>/<subresource>``, exactly that question."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.fail = False
        self.fail_only: tuple[str, ...] | None = None
        self.concurrent = 0
        self.peak = 0

    async def json(self, method: str, target: str, body: Any = None, **_: Any) -> tuple[int, Any]:
        self.bodies.append(body)
        self.concurrent += 1
        self.peak = max(self.peak, self.concurrent)
        await asyncio.sleep(0)
        self.concurrent -= 1
        if self.fail or attrs(body) == self.fail_only:
            raise OSError("connection refused")
        groups = body["spec"]["groups"]
        allowed = "admins" in groups or "grants:" + "/".join(attrs(body)) in groups
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
    assert len(api.bodies) == len(ADMIN_QUESTIONS)
    assert api.peak == len(ADMIN_QUESTIONS)  # asked concurrently
    assert api.bodies[0] == (
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
    )
    with pytest.raises(ClusterAdmin):
        await check.check(olga, Allowance())
    alice = Identity("alice", ("devs", "system:authenticated"))
    await check.check(alice, Allowance())
    await check.check(alice, Allowance())
    assert len(api.bodies) == 2 * len(ADMIN_QUESTIONS)  # one set of reviews per identity


QUESTIONS = [
    ("", "*", "*", "*", ""),
    ("", "create", "*", "*", ""),
    ("", "update", "*", "*", ""),
    ("", "patch", "*", "*", ""),
    ("", "delete", "*", "*", ""),
    ("", "escalate", "rbac.authorization.k8s.io", "clusterroles", ""),
    ("", "bind", "rbac.authorization.k8s.io", "clusterroles", ""),
    ("", "create", "rbac.authorization.k8s.io", "clusterrolebindings", ""),
    ("", "impersonate", "", "users", ""),
    ("", "impersonate", "", "groups", ""),
    ("", "impersonate", "", "serviceaccounts", ""),
    ("kube-system", "create", "", "serviceaccounts", "token"),
    ("kube-system", "get", "", "secrets", ""),
    ("kube-system", "create", "", "pods", ""),
    ("kube-system", "*", "*", "*", ""),
    ("", "approve", "certificates.k8s.io", "signers", ""),
    ("", "create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", ""),
    ("", "create", "admissionregistration.k8s.io", "mutatingadmissionpolicies", ""),
    ("", "get", "", "nodes", "proxy"),
    ("kube-system", "create", "", "pods", "exec"),
]


async def test_asks_exactly_these_questions() -> None:
    check, api = make()
    await check.check(Identity("alice", ("devs", "system:authenticated")), Allowance())
    assert sorted(attrs(b) for b in api.bodies) == sorted(QUESTIONS)


@pytest.mark.parametrize("question", QUESTIONS, ids="/".join)
async def test_any_one_allowed_question_refuses_the_identity(question: tuple[str, ...]) -> None:
    check, _ = make()
    mallory = Identity("mallory", ("grants:" + "/".join(question), "system:authenticated"))
    with pytest.raises(ClusterAdmin) as err:
        await check.check(mallory, Allowance())
    status = err.value.status()
    assert status.code == 403
    assert "whom the apiserver allows everything (cluster-admin)" in status.message
    # ... and its listing lets it through.
    await check.check(mallory, Allowance(users=("mallory",)))


async def test_a_refusal_wins_over_another_question_without_an_answer() -> None:
    check, api = make()
    api.fail_only = QUESTIONS[3]
    with pytest.raises(ClusterAdmin):
        await check.check(Identity("olga", ("admins",)), Allowance())
    with pytest.raises(AccessReviewError):
        await check.check(Identity("alice", ("devs",)), Allowance())


async def test_a_not_admin_answer_is_reused_for_a_shorter_time() -> None:
    api = FakeApi()
    ctx = FilterContext(api, "impersonate", CollectorRegistry())  # type: ignore[arg-type]
    check = AdminCheck(ctx, 10.0)
    assert check.reviewer.allow_ttl == 10.0
    assert check.reviewer.deny_ttl == NOT_ADMIN_TTL < 10.0
    assert AdminCheck(ctx, 1.0).reviewer.deny_ttl == 1.0


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
