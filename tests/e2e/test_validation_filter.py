"""The ``validation`` filter with real clients: policy raising the level (by namespace, resource,
user and group), Strict answers given locally only when the apiserver would give the same one
(callers without permission still get the apiserver's 403), kubectl and the official Python
client seeing the apiserver's own errors and warnings, and the outcome metrics."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.proxyproc import RunningProxy

USER = "kproxy-user"


def cm(name: str, **extra: Any) -> bytes:
    return json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1"}, **extra}
    ).encode()


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    token: str | None,
    sslctx: Any,
    ctype: str = "application/json",
    method: str = "POST",
) -> tuple[int, bytes, list[str], bool]:
    headers = {"Content-Type": ctype, "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with session.request(method, url, data=body, headers=headers, ssl=sslctx) as resp:
        return resp.status, await resp.read(), resp.headers.getall("Warning", []), "Audit-Id" not in resp.headers


def grant(cp: ControlPlaneInfo, namespace: str, user: str, resources: list[str], groups: list[str]) -> None:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "writer"},
            "rules": [{"apiGroups": groups, "resources": resources,
                       "verbs": ["create", "update", "patch", "get"]}]}  # fmt: skip
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "writer"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "writer"},
               "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]}  # fmt: skip
    base = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    assert cp.request("POST", f"{base}/roles", body=json.dumps(role).encode())[0] == 201
    assert cp.request("POST", f"{base}/rolebindings", body=json.dumps(binding).encode())[0] == 201


def policy_proxy(factory: Callable[..., RunningProxy], namespace: str) -> RunningProxy:
    rules = [
        # First match wins, and a rule never lowers the level: Ignore here changes nothing.
        {"name": "user-configmaps", "match": {"users": [USER], "resources": ["configmaps"]}, "level": "Ignore"},
        {"name": "ns-strict", "match": {"namespaces": [namespace], "resources": ["configmaps"]}, "level": "Strict"},
        {"name": "masters-deployments", "level": "Strict",
         "match": {"groups": ["system:masters"], "resources": ["deployments.apps"]}},
        {"name": "secrets-warn", "match": {"resources": ["secrets"]}, "level": "Warn"},
    ]  # fmt: skip
    return factory(credentials="forward", tls=True, extra={"filters": [{"name": "validation", "rules": rules}]})


async def test_policy_selects_rules_by_namespace_resource_user_and_group(
    control_plane: ControlPlaneInfo, namespace: str, proxy_factory: Callable[..., RunningProxy]
) -> None:
    cp = control_plane
    grant(cp, namespace, USER, ["configmaps", "deployments"], ["", "apps"])
    rp = policy_proxy(proxy_factory, namespace)
    assert rp.ca_file is not None
    via_ssl = ssl.create_default_context(cafile=str(rp.ca_file))
    direct_ssl = cp.ssl_context(client_cert=False)
    admin, user = cp.admin_token, cp.user_token
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    async with aiohttp.ClientSession() as s:
        # ns-strict: an admin's configmap with an unknown field and no fieldValidation is answered
        # by kproxy exactly as the apiserver answers fieldValidation=Strict.
        direct = await post(
            s, cp.server + cms + "?dryRun=All&fieldValidation=Strict", cm("a", bogus=1), admin, direct_ssl
        )
        via = await post(s, rp.url + cms + "?dryRun=All", cm("a", bogus=1), admin, via_ssl)
        assert direct[0] == 400 and via[:3] == direct[:3] and via[3], (direct, via)
        # user-configmaps matches kproxy-user first: its level (Ignore) never lowers the default Warn.
        direct = await post(s, cp.server + cms + "?dryRun=All", cm("b", bogus=1), user, direct_ssl)
        via = await post(s, rp.url + cms + "?dryRun=All", cm("b", bogus=1), user, via_ssl)
        assert direct[0] == via[0] == 201 and via[2] == direct[2] == ['299 - "unknown field \\"bogus\\""']
        # Outside the namespace no rule applies to configmaps: the default (Warn) from the apiserver.
        other = "/api/v1/namespaces/default/configmaps?dryRun=All"
        via = await post(s, rp.url + other, cm("c", bogus=1), admin, via_ssl)
        assert via[0] == 201 and via[2] == ['299 - "unknown field \\"bogus\\""'] and not via[3]
        # masters-deployments selects by group: the admin token is in system:masters, the user is not.
        template = {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        spec = {"selector": {"matchLabels": {"a": "b"}}, "zz": 1, "template": template}
        deploy = json.dumps(
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": spec}
        ).encode()
        deps = f"/apis/apps/v1/namespaces/{namespace}/deployments?dryRun=All"
        direct = await post(s, cp.server + deps + "&fieldValidation=Strict", deploy, admin, direct_ssl)
        via = await post(s, rp.url + deps, deploy, admin, via_ssl)
        assert via[0] == 400 and via[:3] == direct[:3] and via[3]
        via = await post(s, rp.url + deps, deploy, user, via_ssl)
        assert via[0] == 201 and via[2] == ['299 - "unknown field \\"spec.zz\\""']
        # secrets-warn raises Ignore to Warn: the apiserver itself warns (no duplicate from kproxy).
        secret = json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "typo": 1}).encode()
        secrets = f"/api/v1/namespaces/{namespace}/secrets?dryRun=All"
        direct = await post(s, cp.server + secrets + "&fieldValidation=Ignore", secret, admin, direct_ssl)
        via = await post(s, rp.url + secrets + "&fieldValidation=Ignore", secret, admin, via_ssl)
        assert direct[2] == [] and via[0] == 201 and via[2] == ['299 - "unknown field \\"typo\\""']
        # A PATCH under a Strict rule goes up with fieldValidation=Strict: the apiserver's 422.
        assert cp.request("POST", cms, body=cm("p"))[0] == 201
        patch = b'{"data":{"b":"2"},"foo":1}'
        direct = await post(
            s,
            cp.server + cms + "/p?dryRun=All&fieldValidation=Strict",
            patch,
            admin,
            direct_ssl,
            "application/merge-patch+json",
            "PATCH",
        )
        via = await post(
            s, rp.url + cms + "/p?dryRun=All", patch, admin, via_ssl, "application/merge-patch+json", "PATCH"
        )
        assert direct[0] == 422 and via[:3] == direct[:3] and not via[3]
    metrics = rp.metrics()
    assert re.search(r'kproxy_validation_requests_total\{level="Strict",outcome="rejected"\} 2\.0', metrics), metrics
    assert re.search(r'kproxy_validation_requests_total\{level="Warn",outcome="raised"\} 1\.0', metrics), metrics


async def test_strict_failure_of_a_caller_without_permission_is_the_apiservers_403(
    control_plane: ControlPlaneInfo, namespace: str, proxy_factory: Callable[..., RunningProxy]
) -> None:
    """The apiserver authorizes before it decodes: kproxy must not reveal a 400 to a caller the
    apiserver would refuse (kproxy asks a SubjectAccessReview and lets the apiserver answer)."""
    cp = control_plane
    # access_ttl 1: the "no" below is trusted for one second only (the default is 10).
    rp = proxy_factory(credentials="forward", tls=True, extra={"filters": [{"name": "validation", "access_ttl": 1}]})
    assert rp.ca_file is not None
    url = f"/api/v1/namespaces/{namespace}/configmaps?dryRun=All&fieldValidation=Strict"
    async with aiohttp.ClientSession() as s:
        direct = await post(s, cp.server + url, cm("x", bogus=1), cp.user_token, cp.ssl_context(client_cert=False))
        via = await post(
            s, rp.url + url, cm("x", bogus=1), cp.user_token, ssl.create_default_context(cafile=str(rp.ca_file))
        )
        assert direct[0] == 403 and via[:3] == direct[:3] and not via[3]
        # The same caller once allowed: now kproxy answers the Strict failure itself.
        grant(cp, namespace, USER, ["configmaps"], [""])
        direct = await post(s, cp.server + url, cm("x", bogus=1), cp.user_token, cp.ssl_context(client_cert=False))
        for _ in range(20):  # until the cached "no" (1 s) has expired
            via = await post(
                s, rp.url + url, cm("x", bogus=1), cp.user_token, ssl.create_default_context(cafile=str(rp.ca_file))
            )
            if via[3]:
                break
            await asyncio.sleep(0.25)
        assert direct[0] == 400 and via[:3] == direct[:3] and via[3]


MANIFEST = """apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: c
        image: nginx
        imagePullPolicy: Always
        imagePullPolicy: Never
        portz: []
"""


@pytest.mark.parametrize("validate", ["strict", "warn", "ignore"])
def test_kubectl_sees_the_apiservers_answer(
    control_plane: ControlPlaneInfo,
    kubectl: Kubectl,
    namespace: str,
    proxy_factory: Callable[..., RunningProxy],
    validate: str,
) -> None:
    rp = proxy_factory(extra={"filters": [{"name": "validation"}]})
    args = ["apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-", f"--validate={validate}"]
    create = ["create", "--dry-run=server", "-n", namespace, "-f", "-", f"--validate={validate}"]
    outputs = []
    for argv in (create, args):
        direct = kubectl(argv, input=MANIFEST, check=False)
        via = kubectl(argv, input=MANIFEST, kubeconfig=rp.kubeconfig, check=False)
        assert (via.returncode, via.stdout, via.stderr) == (direct.returncode, direct.stdout, direct.stderr)
        outputs.append(direct.stderr)
    if validate == "strict":
        # kubectl turns the YAML into JSON itself (its duplicates are gone): the unknown field stays.
        assert 'strict decoding error: unknown field "spec.template.spec.containers[0].portz"' in outputs[0]
        assert 'kproxy_validation_requests_total{level="Strict",outcome="rejected"} 1.0' in rp.metrics()


def test_python_client_gets_the_same_exception(
    control_plane: ControlPlaneInfo, namespace: str, proxy_factory: Callable[..., RunningProxy]
) -> None:
    """The official client's dynamic API (its typed models refuse unknown fields client-side)."""
    rp = proxy_factory(extra={"filters": [{"name": "validation"}]})
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "py", "labelz": {}},
        "data": {"a": "1"},
        "dta": {},
    }
    answers: list[Any] = []
    for kubeconfig in (control_plane.admin_kubeconfig, rp.kubeconfig):
        dyn = DynamicClient(k8s_config.new_client_from_config(config_file=str(kubeconfig)))
        cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
        with pytest.raises(ApiException) as err:
            cms.create(body=body, namespace=namespace, dry_run="All", query_params=[("fieldValidation", "Strict")])
        answers.append((err.value.status, err.value.body))
        created = cms.create(body=body, namespace=namespace, dry_run="All", query_params=[("fieldValidation", "Warn")])
        answers.append(created.metadata.name)
    assert answers[0] == answers[2] and answers[1] == answers[3] == "py"
    assert answers[0][0] == 400
    assert 'strict decoding error: unknown field \\"metadata.labelz\\", unknown field \\"dta\\"' in answers[0][1]
    assert 'kproxy_validation_requests_total{level="Strict",outcome="rejected"} 1.0' in rp.metrics()


async def test_a_body_over_the_limit_gets_the_413_when_kproxy_reads_it(
    namespace: str, proxy_factory: Callable[..., RunningProxy]
) -> None:
    """A Strict POST is read whole to be checked: over ``max_request_body_bytes`` that read ends in
    the apiserver's own 413 Status, as forwarding would have."""
    rp = proxy_factory(extra={"max_request_body_bytes": 1000, "filters": [{"name": "validation"}]})
    big = cm("big", data={"k": "x" * 5000})
    url = f"{rp.url}/api/v1/namespaces/{namespace}/configmaps?dryRun=All"
    async with aiohttp.ClientSession() as s:
        strict = await post(s, url + "&fieldValidation=Strict", big, None, None)
        plain = await post(s, url, big, None, None)
    assert strict[0] == plain[0] == 413 and strict[1] == plain[1]
    assert b"Request entity too large: limit is 1000" in strict[1]
