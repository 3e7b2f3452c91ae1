"""Policy matching (pure logic): which rule a request selects, and what the config accepts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kproxy.core.chain import Identity
from kproxy.core.requestinfo import RequestInfo, parse_request_info
from kproxy.identity.policy import Match, Rule, first_match, first_match_lazy, match_verb

ALICE = Identity("alice", ("dev", "system:authenticated"))
BOB = Identity("bob", ("ops", "system:authenticated"))


def info(method: str, path: str, query: str = "") -> RequestInfo:
    return parse_request_info(method, path, query)


class Named(Rule):
    action: str = "allow"


@pytest.mark.parametrize(
    ("pattern", "method", "path", "expected"),
    [
        ("pods", "POST", "/api/v1/namespaces/a/pods", True),
        ("pods", "PUT", "/api/v1/namespaces/a/pods/p/status", False),
        ("pods/status", "PUT", "/api/v1/namespaces/a/pods/p/status", True),
        ("pods/*", "POST", "/api/v1/namespaces/a/pods/p/eviction", True),
        ("pods/*", "DELETE", "/api/v1/namespaces/a/pods/p", False),
        ("deployments.apps", "PATCH", "/apis/apps/v1/namespaces/a/deployments/d", True),
        ("deployments", "PATCH", "/apis/apps/v1/namespaces/a/deployments/d", False),
        ("deployments.apps/scale", "PUT", "/apis/apps/v1/namespaces/a/deployments/d/scale", True),
        ("*/scale", "PUT", "/apis/apps/v1/namespaces/a/deployments/d/scale", True),
        ("*/scale", "PUT", "/apis/apps/v1/namespaces/a/deployments/d", False),
        ("*.apps", "DELETE", "/apis/apps/v1/namespaces/a/statefulsets/s", True),
        ("*.apps", "DELETE", "/api/v1/namespaces/a/pods/s", False),
        ("*", "PUT", "/apis/apps/v1/namespaces/a/deployments/d/scale", True),
        ("*", "GET", "/version", False),
        ("config*", "DELETE", "/api/v1/namespaces/a/configmaps/c", True),
        ("*.*.k8s.io", "POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", True),
        ("*.*.k8s.io", "POST", "/apis/apps/v1/namespaces/a/deployments", False),
    ],
)
def test_resource_patterns(pattern: str, method: str, path: str, expected: bool) -> None:
    assert Match(resources=[pattern]).matches(info(method, path), None) is expected


@pytest.mark.parametrize(
    "bad",
    ["apps/deployments", "Pods", "pods/", "/status", "a/b/c", "deployments.", "pods status", ""],
)
def test_bad_resource_patterns_rejected(bad: str) -> None:
    with pytest.raises(ValidationError) as exc:
        Match(resources=[bad])
    assert "resources" in str(exc.value)


def test_group_first_form_gets_a_hint() -> None:
    with pytest.raises(ValidationError, match=r"deployments\.apps"):
        Match(resources=["apps/deployments"])


def test_unknown_keys_and_verbs_rejected() -> None:
    with pytest.raises(ValidationError, match="unknown verb 'Create'"):
        Match(verbs=["Create"])
    with pytest.raises(ValidationError, match="extra"):
        Match.model_validate({"user": ["alice"]})
    with pytest.raises(ValidationError, match="empty"):
        Match(namespaces=[""])


@pytest.mark.parametrize(
    ("method", "path", "query", "verb"),
    [
        ("POST", "/api/v1/namespaces/a/pods", "", "create"),
        ("PUT", "/api/v1/namespaces/a/pods/p", "", "update"),
        ("PATCH", "/api/v1/namespaces/a/pods/p", "", "patch"),
        ("DELETE", "/api/v1/namespaces/a/pods/p", "", "delete"),
        ("DELETE", "/api/v1/namespaces/a/pods", "", "deletecollection"),
        ("GET", "/api/v1/namespaces/a/pods", "", "list"),
        ("GET", "/api/v1/namespaces/a/pods", "watch=1", "watch"),
        ("GET", "/api/v1/namespaces/a/pods/p", "", "get"),
        ("POST", "/api/v1/namespaces/a/pods/p/exec", "", "connect"),
        ("GET", "/api/v1/namespaces/a/pods/p/exec", "", "connect"),
        ("POST", "/api/v1/namespaces/a/pods/p/portforward", "", "connect"),
        ("GET", "/api/v1/namespaces/a/services/s/proxy/x", "", "connect"),
        ("GET", "/api/v1/nodes/n/proxy", "", "connect"),
        ("GET", "/api/v1/proxy/namespaces/a/pods/p", "", "connect"),
        ("POST", "/api/v1/namespaces/a/pods/p/eviction", "", "create"),
    ],
)
def test_verbs(method: str, path: str, query: str, verb: str) -> None:
    i = info(method, path, query)
    assert match_verb(i) == verb
    assert Match(verbs=[verb]).matches(i, None)
    others = [v for v in ("create", "update", "patch", "delete", "get", "list", "connect") if v != verb]
    assert not Match(verbs=others).matches(i, None)
    assert Match(verbs=["*"]).matches(i, None)


def test_namespaces() -> None:
    m = Match(namespaces=["team-*", "ci"])
    assert m.matches(info("POST", "/api/v1/namespaces/team-a/pods"), None)
    assert m.matches(info("POST", "/api/v1/namespaces/ci/pods"), None)
    assert not m.matches(info("POST", "/api/v1/namespaces/cix/pods"), None)
    # cluster-scoped and non-resource requests are outside every namespace
    assert not m.matches(info("POST", "/api/v1/nodes"), None)
    assert not m.matches(info("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles"), None)
    assert not m.matches(info("GET", "/healthz"), None)
    # the Namespace object itself is "in" its namespace, as the apiserver's RequestInfo says
    assert m.matches(info("DELETE", "/api/v1/namespaces/ci"), None)


def test_users_and_groups() -> None:
    by_user = Match(users=["alice", "system:serviceaccount:ci:*"])
    pods = info("POST", "/api/v1/namespaces/a/pods")
    assert by_user.needs_identity()
    assert by_user.matches(pods, ALICE)
    assert not by_user.matches(pods, BOB)
    assert by_user.matches(pods, Identity("system:serviceaccount:ci:bot"))
    assert not by_user.matches(pods, None)  # unknown caller never matches a user rule
    by_group = Match(groups=["ops"])
    assert by_group.matches(pods, BOB)
    assert not by_group.matches(pods, ALICE)
    assert not Match(namespaces=["a"]).needs_identity()


def test_first_match_in_order() -> None:
    rules = [
        Named(name="ops-anything", match=Match(groups=["ops"]), action="allow"),
        Named(name="dev-apps", match=Match(resources=["*.apps"], namespaces=["dev-*"]), action="reject"),
        Named(match=Match(verbs=["create", "update", "patch", "delete"]), action="enforce"),
    ]
    deploy = info("PATCH", "/apis/apps/v1/namespaces/dev-1/deployments/d")
    found = first_match(rules, deploy, BOB)
    assert found is not None and found[0] == 0
    found = first_match(rules, deploy, ALICE)
    assert found is not None and found[1].name == "dev-apps"
    found = first_match(rules, info("DELETE", "/api/v1/namespaces/x/pods/p"), ALICE)
    assert found is not None and found[0] == 2 and found[1].display_name(found[0]) == "rules[2]"
    assert first_match(rules, info("GET", "/api/v1/namespaces/x/pods/p"), ALICE) is None


async def test_lazy_match_asks_identity_only_when_needed() -> None:
    asked = 0

    async def identify() -> Identity:
        nonlocal asked
        asked += 1
        return ALICE

    rules = [
        Named(name="ns", match=Match(namespaces=["ci"])),
        Named(name="alice", match=Match(users=["alice"])),
    ]
    found = await first_match_lazy(rules, info("POST", "/api/v1/namespaces/ci/pods"), identify)
    assert found is not None and found[1].name == "ns" and asked == 0
    found = await first_match_lazy(rules, info("POST", "/api/v1/namespaces/x/pods"), identify)
    assert found is not None and found[1].name == "alice" and asked == 1


@pytest.mark.parametrize(
    "content_type", ["application/json", "APPLİCATİON/JSON", "\u3000application/json; charset=utf-8"]
)
def test_a_namespace_create_is_read_as_mime_reads_its_content_type(content_type: str) -> None:
    """mime.ParseMediaType lowers with Go's ToLower (U+0130 is "i") and trims Unicode white
    space, so the apiserver decodes these bodies as JSON: so does the rule's namespace reader."""
    from kproxy.filters.dryrun import media_type
    from kproxy.identity.policy import created_namespace

    assert created_namespace(b'{"metadata": {"name": "prod-a"}}', content_type) == ("prod-a", True)
    assert media_type(content_type) == "application/json"
