"""A caller's own ``Impersonate-*`` headers in ``proxy`` and ``forward`` modes: the policy rules
match the identity the apiserver acts as (staging/src/k8s.io/apiserver/pkg/endpoints/filters/
impersonation/: constrained_impersonation.go ``processImpersonationHeaders``, mode.go), not the
one that authenticated; the verdicts are the apiserver's (what it persisted, whom a
SelfSubjectReview names, its own answer to the same bytes sent straight to it).

The impersonator is a service account of the test namespace that may impersonate the user
TARGET, the group GROUP and the service account ``other`` of its namespace, and nothing else
(it may not write ConfigMaps itself); in ``proxy`` mode kproxy's own credentials impersonate.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from .bodies import cm_json
from .inventory_support import self_subject_review, tls_with
from .wire import Answer, Endpoint, exchange, request_bytes

TARGET = "inv-imp-target"
GROUP = "inv-imp-group"
MODES = ["forward", "proxy"]


def _post(cp: ControlPlaneInfo, path: str, body: dict[str, object]) -> None:
    code, resp = cp.request("POST", path, body=json.dumps(body).encode())
    assert code == 201, resp


def _token(cp: ControlPlaneInfo, ns: str, sa: str) -> str:
    out = cp.json("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
                  {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})  # fmt: skip
    token: str = out["status"]["token"]
    return token


@dataclass(frozen=True)
class Cast:
    """Tokens of the test namespace's service accounts: ``impersonator`` (may impersonate TARGET,
    GROUP and ``other``) and ``plain`` (may impersonate no one, may read nothing)."""

    namespace: str
    impersonator: str
    plain: str


@pytest.fixture
def cast(control_plane: ControlPlaneInfo, namespace: str) -> Cast:
    cp, ns, tag = control_plane, namespace, secrets.token_hex(3)
    for sa in ("impersonator", "other", "plain"):
        _post(cp, f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": sa}})
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    _post(cp, f"{rbac}/clusterroles", {
        "metadata": {"name": f"inv-imp-{tag}"},
        "rules": [
            {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": [TARGET]},
            {"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"], "resourceNames": [GROUP]},
        ],
    })  # fmt: skip
    _post(cp, f"{rbac}/clusterrolebindings", {
        "metadata": {"name": f"inv-imp-{tag}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"inv-imp-{tag}"},
        "subjects": [{"kind": "ServiceAccount", "name": "impersonator", "namespace": ns}],
    })  # fmt: skip
    _post(cp, f"{rbac}/namespaces/{ns}/roles", {
        "metadata": {"name": "imp-sa"},
        "rules": [{"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"],
                   "resourceNames": ["other"]}],
    })  # fmt: skip
    _post(cp, f"{rbac}/namespaces/{ns}/rolebindings", {
        "metadata": {"name": "imp-sa"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "imp-sa"},
        "subjects": [{"kind": "ServiceAccount", "name": "impersonator", "namespace": ns}],
    })  # fmt: skip
    _post(cp, f"{rbac}/namespaces/{ns}/roles", {
        "metadata": {"name": "cm"}, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
    })  # fmt: skip
    _post(cp, f"{rbac}/namespaces/{ns}/rolebindings", {
        "metadata": {"name": "cm"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm"},
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TARGET},
            {"kind": "ServiceAccount", "name": "other", "namespace": ns},
        ],
    })  # fmt: skip
    return Cast(ns, _token(cp, ns, "impersonator"), _token(cp, ns, "plain"))


def _proxy(factory: Callable[..., RunningProxy], mode: str, filters: list[dict[str, Any]]) -> Endpoint:
    rp = factory(credentials=mode, tls=mode == "forward", extra={"filters": filters})
    return Endpoint.from_url(rp.url, tls_with(None, rp.ca_file, Path()) if rp.ca_file is not None else None)


def _as(mode: str, cast: Cast, *impersonation: tuple[str, str]) -> list[tuple[str, str]]:
    """The caller's headers: its impersonation, and in ``forward`` the impersonator's token."""
    headers = list(impersonation)
    if mode == "forward":
        headers.append(("Authorization", f"Bearer {cast.impersonator}"))
    return headers


def _create(ep: Endpoint, ns: str, body: bytes, headers: list[tuple[str, str]], query: str = "") -> Answer:
    raw = request_bytes(
        "POST", f"/api/v1/namespaces/{ns}/configmaps{query}",
        [("Content-Type", "application/json"), ("Accept", "application/json"), *headers], body,
    )  # fmt: skip
    return exchange(ep, raw)


def _persisted(cp: ControlPlaneInfo, ns: str, name: str) -> bool:
    code, _ = cp.request("GET", f"/api/v1/namespaces/{ns}/configmaps/{name}")
    assert code in (200, 404), code
    return code == 200


@pytest.mark.parametrize("mode", MODES)
def test_a_strict_rule_by_user_holds_through_impersonation(
    mode: str, cast: Cast, control_plane: ControlPlaneInfo, capped_factory: Callable[..., RunningProxy]
) -> None:
    """A Strict validation rule names TARGET. A create the apiserver performs as TARGET, with an
    unknown field, must be refused with the apiserver's Strict error; nothing persisted."""
    ns = cast.namespace
    rules = [{"name": "target", "match": {"users": [TARGET], "namespaces": [ns]}, "level": "Strict"}]
    ep = _proxy(capped_factory, mode, [{"name": "validation", "upstream_validates": "yes", "rules": rules}])
    headers = _as(mode, cast, ("Impersonate-User", TARGET))
    assert self_subject_review(ep, headers).user == TARGET
    body = cm_json("strict-by-impersonation", bogus="x")
    via = _create(ep, ns, body, headers)
    assert not _persisted(control_plane, ns, "strict-by-impersonation"), f"persisted as {TARGET}: {via.short()}"
    # The apiserver's own Strict answer to the same create.
    direct = _create(
        Endpoint("127.0.0.1", control_plane.apiserver_port, tls_with(None, control_plane.ca_file, Path())),
        ns, body, [("Authorization", f"Bearer {control_plane.admin_token}"), ("Impersonate-User", TARGET)],
        "?fieldValidation=Strict&dryRun=All",
    )  # fmt: skip
    assert direct.status == 400, direct.short()
    assert (via.status, via.json()["message"]) == (direct.status, direct.json()["message"])


def test_a_caller_that_may_not_impersonate_gets_the_apiservers_refusal(
    cast: Cast, control_plane: ControlPlaneInfo, capped_factory: Callable[..., RunningProxy]
) -> None:
    """The Strict rule names TARGET, who may create ConfigMaps; the caller may not impersonate
    TARGET. The apiserver refuses the impersonation (403) before it decodes anything, so kproxy
    must not answer with its own Strict error on TARGET's authorization."""
    ns = cast.namespace
    rules = [{"name": "target", "match": {"users": [TARGET], "namespaces": [ns]}, "level": "Strict"}]
    ep = _proxy(capped_factory, "forward", [{"name": "validation", "upstream_validates": "yes", "rules": rules}])
    headers = [("Impersonate-User", TARGET), ("Authorization", f"Bearer {cast.plain}")]
    body = cm_json("strict-not-allowed", bogus="x")
    direct = _create(
        Endpoint("127.0.0.1", control_plane.apiserver_port, tls_with(None, control_plane.ca_file, Path())),
        ns, body, headers, "?fieldValidation=Strict",
    )  # fmt: skip
    via = _create(ep, ns, body, headers)
    assert direct.status == 403, direct.short()
    assert (via.status, via.json()["message"]) == (direct.status, direct.json()["message"])
    assert not _persisted(control_plane, ns, "strict-not-allowed")


@pytest.mark.parametrize("mode", MODES)
def test_group_rules_match_the_impersonated_groups(
    mode: str, cast: Cast, control_plane: ControlPlaneInfo, capped_factory: Callable[..., RunningProxy]
) -> None:
    """A dryrun ``enforce`` rule names the group GROUP; the caller impersonates TARGET in GROUP
    (``Impersonate-Group``): the apiserver acts as a member of GROUP, so nothing is persisted."""
    ns = cast.namespace
    rules = [{"name": "group", "match": {"groups": [GROUP], "namespaces": [ns]}, "action": "enforce"}]
    ep = _proxy(capped_factory, mode, [{"name": "dryrun", "rules": rules}])
    headers = _as(mode, cast, ("Impersonate-User", TARGET), ("impersonate-group", GROUP))
    seen = self_subject_review(ep, headers)
    assert (seen.user, set(seen.groups)) == (TARGET, {GROUP, "system:authenticated"}), seen
    write = _create(ep, ns, cm_json("group-by-impersonation"), headers)
    assert write.status in (200, 201), write.short()
    assert not _persisted(control_plane, ns, "group-by-impersonation"), f"persisted as {GROUP}: {write.short()}"


@pytest.mark.parametrize("mode", MODES)
def test_an_impersonated_service_account_has_its_namespace_groups(
    mode: str, cast: Cast, control_plane: ControlPlaneInfo, capped_factory: Callable[..., RunningProxy]
) -> None:
    """Impersonating ``system:serviceaccount:<ns>:other`` without groups gives the service
    account's groups (``system:serviceaccounts``, ``system:serviceaccounts:<ns>``). The first rule
    exempts the impersonator itself (``allow``), the second is a dry run for the namespace's
    service accounts: the write as ``other`` must be the dry run."""
    ns = cast.namespace
    rules = [
        {"name": "caller", "match": {"users": [f"system:serviceaccount:{ns}:impersonator"]}, "action": "allow"},
        {"name": "sa-group", "match": {"groups": [f"system:serviceaccounts:{ns}"], "namespaces": [ns]},
         "action": "enforce"},
    ]  # fmt: skip
    ep = _proxy(capped_factory, mode, [{"name": "dryrun", "rules": rules}])
    other = f"system:serviceaccount:{ns}:other"
    headers = _as(mode, cast, ("Impersonate-User", other))
    seen = self_subject_review(ep, headers)
    assert seen.user == other and f"system:serviceaccounts:{ns}" in seen.groups, seen
    write = _create(ep, ns, cm_json("sa-by-impersonation"), headers)
    assert write.status in (200, 201), write.short()
    assert not _persisted(control_plane, ns, "sa-by-impersonation"), f"persisted as {other}: {write.short()}"


@pytest.mark.parametrize("mode", MODES)
def test_impersonation_without_a_user_gets_the_apiservers_400(
    mode: str, cast: Cast, control_plane: ControlPlaneInfo, capped_factory: Callable[..., RunningProxy]
) -> None:
    """Groups, a uid and an extra without ``Impersonate-User``: the apiserver's 400 (its message
    prints what was asked for), before any rule; a ``reject`` rule for every authenticated caller
    must not answer first."""
    ns = cast.namespace
    rules = [{"name": "all", "match": {"groups": ["system:authenticated"]}, "action": "reject"}]
    ep = _proxy(capped_factory, mode, [{"name": "dryrun", "rules": rules}])
    asked = [("Impersonate-Group", GROUP), ("Impersonate-Group", "g2"), ("Impersonate-Uid", "u-1"),
             ("Impersonate-Extra-Acme.io%2fScopes", "a"), ("impersonate-extra-acme.io%2Fscopes", "b")]  # fmt: skip
    via = _create(ep, ns, cm_json("no-user"), _as(mode, cast, *asked))
    direct = _create(
        Endpoint("127.0.0.1", control_plane.apiserver_port, tls_with(None, control_plane.ca_file, Path())),
        ns, cm_json("no-user"), [*asked, ("Authorization", f"Bearer {cast.impersonator}")],
    )  # fmt: skip
    assert direct.status == 400, direct.short()
    assert (via.status, via.json()) == (direct.status, direct.json())
    assert not _persisted(control_plane, ns, "no-user")


def test_cached_reads_with_impersonation_are_the_apiservers(
    cast: Cast, control_plane: ControlPlaneInfo, capped_factory: Callable[..., RunningProxy]
) -> None:
    """The watch cache answers as the apiserver: a caller that may not impersonate TARGET (who
    may read the namespace's ConfigMaps) is refused what TARGET may read (the apiserver's 403 on
    the impersonation); the impersonator reads it."""
    ns = cast.namespace
    _post(control_plane, f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "cached"}, "data": {"k": "v"}})
    rp = capped_factory(
        credentials="forward", tls=True, extra={"filters": [{"name": "watchcache", "resources": ["configmaps"]}]}
    )
    assert rp.ca_file is not None
    ep = Endpoint.from_url(rp.url, tls_with(None, rp.ca_file, Path()))
    direct_ep = Endpoint("127.0.0.1", control_plane.apiserver_port, tls_with(None, control_plane.ca_file, Path()))
    for token, path in [(cast.plain, f"/api/v1/namespaces/{ns}/configmaps"),
                        (cast.plain, f"/api/v1/namespaces/{ns}/configmaps/cached"),
                        (cast.impersonator, f"/api/v1/namespaces/{ns}/configmaps/cached")]:  # fmt: skip
        headers = [("Accept", "application/json"), ("Authorization", f"Bearer {token}"), ("Impersonate-User", TARGET)]
        direct = exchange(direct_ep, request_bytes("GET", path, headers))
        via = exchange(ep, request_bytes("GET", path, headers))
        assert via.status == direct.status, f"{path}: through kproxy {via.short()}, directly {direct.short()}"
    assert direct.status == 200
