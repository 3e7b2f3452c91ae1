"""`credentials: impersonate` against the real apiserver: kproxy authenticates callers (client
certificates from its own CA, bearer tokens through a TokenReview, anonymous) and the apiserver
authorizes each request as that caller, so RBAC answers exactly as it answers the caller directly."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from rawhttp import get_json

from kproxy.localcluster import certs
from kproxy.localcluster.controlplane import USER_NAME
from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.localcluster.kubeconfigs import write_kubeconfig
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy


@pytest.fixture
def caller_ca(tmp_path: Path) -> certs.CertKey:
    return certs.generate_ca("kproxy-callers-ca")


@pytest.fixture
def imp(proxy_factory: Callable[..., RunningProxy], caller_ca: certs.CertKey, tmp_path: Path) -> RunningProxy:
    ca_file = certs.write_pem(tmp_path / "callers-ca.crt", caller_ca.cert_pem, private=False)
    return proxy_factory(credentials="impersonate", tls=True, extra={"tls": {"client_ca_file": str(ca_file)}})


def _token_kubeconfig(path: Path, rp: RunningProxy, token: str) -> Path:
    return write_kubeconfig(path, server=rp.url, ca_file=rp.ca_file, user="caller", token=token)


def _cert_kubeconfig(path: Path, rp: RunningProxy, ca: certs.CertKey, user: str, groups: tuple[str, ...]) -> Path:
    leaf = certs.generate_client_cert(ca, user, groups)
    crt = certs.write_pem(path.with_suffix(".crt"), leaf.cert_pem, private=False)
    key = certs.write_pem(path.with_suffix(".key"), leaf.key_pem, private=True)
    return write_kubeconfig(path, server=rp.url, ca_file=rp.ca_file, user=user, client_cert=crt, client_key=key)


def test_token_callers_are_authorized_as_themselves(
    imp: RunningProxy, control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    via = _token_kubeconfig(tmp_path / "user-via.kubeconfig", imp, control_plane.user_token)
    direct = control_plane.user_kubeconfig
    listing = ["get", "configmaps", "-n", namespace]

    # Same caller, same denial, word for word (the apiserver authorized the impersonated user).
    denied_direct = kubectl(listing, kubeconfig=direct, check=False)
    denied_via = kubectl(listing, kubeconfig=via, check=False)
    assert denied_direct.returncode == denied_via.returncode == 1
    assert f'User "{USER_NAME}" cannot list resource "configmaps"' in denied_direct.stderr
    assert denied_via.stderr == denied_direct.stderr

    # The apiserver sees the caller: whoami through kproxy equals whoami directly.
    assert (
        kubectl.json(["auth", "whoami"], kubeconfig=via)["status"]
        == kubectl.json(["auth", "whoami"], kubeconfig=direct)["status"]
    )

    # Once RBAC allows the caller, kproxy's requests as that caller are allowed too.
    kubectl(["create", "role", "cm-reader", "--verb=list,create", "--resource=configmaps", "-n", namespace])
    kubectl(["create", "rolebinding", "cm-reader", "--role=cm-reader", f"--user={USER_NAME}", "-n", namespace])
    eventually(lambda: kubectl(listing, kubeconfig=via, check=False).returncode == 0, 30, "the binding to apply")
    kubectl(["create", "configmap", "made-via-kproxy", "--from-literal=a=b", "-n", namespace], kubeconfig=via)
    cm = kubectl.json(["get", "configmap", "made-via-kproxy", "-n", namespace, "--show-managed-fields"])
    assert cm["metadata"]["managedFields"][0]["manager"] == "kubectl-create"

    # `--as` from the caller is not passed on: kproxy acts as the caller it authenticated, and says so.
    res = kubectl(["auth", "whoami", "-o", "json", "--as=system:admin"], kubeconfig=via, check=False)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["status"]["userInfo"]["username"] == USER_NAME
    assert "removed the Impersonate-* headers" in res.stderr


def test_service_account_extras_reach_the_apiserver(
    imp: RunningProxy, control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """A service-account token carries user extras (keys with '/', escaped in the header names):
    the apiserver sees the same user, uid, groups and extras through kproxy as directly."""
    kubectl(["create", "serviceaccount", "robot", "-n", namespace])
    token = kubectl(["create", "token", "robot", "-n", namespace]).stdout.strip()
    direct = write_kubeconfig(
        tmp_path / "robot-direct.kubeconfig",
        server=control_plane.server,
        ca_file=control_plane.ca_file,
        user="robot",
        token=token,
    )
    via = _token_kubeconfig(tmp_path / "robot-via.kubeconfig", imp, token)
    seen_direct = kubectl.json(["auth", "whoami"], kubeconfig=direct)["status"]["userInfo"]
    assert seen_direct["extra"], seen_direct  # the test is only worth something with extras
    assert any("/" in key for key in seen_direct["extra"])
    assert kubectl.json(["auth", "whoami"], kubeconfig=via)["status"]["userInfo"] == seen_direct


def test_rejected_and_anonymous_callers_get_the_apiservers_answer(
    imp: RunningProxy, control_plane: ControlPlaneInfo
) -> None:
    path = "/api/v1/namespaces"
    # A token the apiserver rejects: the same 401 Status.
    assert get_json(imp.url + path, imp.ca_file, "not-a-valid-token") == get_json(
        control_plane.server + path, control_plane.ca_file, "not-a-valid-token"
    )
    # No credentials: the anonymous user, denied with the same 403 Status.
    code, body = get_json(imp.url + path, imp.ca_file)
    assert (code, body) == get_json(control_plane.server + path, control_plane.ca_file)
    assert code == 403 and 'User "system:anonymous"' in str(body["message"])


def test_client_certificates_from_the_callers_ca(
    imp: RunningProxy, caller_ca: certs.CertKey, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    alice = _cert_kubeconfig(tmp_path / "alice.kubeconfig", imp, caller_ca, "alice", ("devs",))
    who = kubectl.json(["auth", "whoami"], kubeconfig=alice)["status"]["userInfo"]
    assert who["username"] == "alice"
    assert who["groups"] == ["devs", "system:authenticated"]

    listing = ["get", "configmaps", "-n", namespace, "-o", "name"]
    res = kubectl(listing, kubeconfig=alice, check=False)
    assert res.returncode == 1
    assert f'User "alice" cannot list resource "configmaps" in API group "" in the namespace "{namespace}"' in (
        res.stderr
    )
    kubectl(["create", "role", "cm-reader", "--verb=list", "--resource=configmaps", "-n", namespace])
    kubectl(["create", "rolebinding", "devs", "--role=cm-reader", "--group=devs", "-n", namespace])
    eventually(lambda: kubectl(listing, kubeconfig=alice, check=False).returncode == 0, 30, "the group binding")

    # A certificate from any other CA fails the TLS handshake, as at the apiserver.
    mallory = _cert_kubeconfig(tmp_path / "mallory.kubeconfig", imp, certs.generate_ca("other"), "admin", ())
    res = kubectl(listing, kubeconfig=mallory, check=False)
    assert res.returncode == 1
    # (TLS 1.3: the client learns of the refusal as an alert, an EOF, a reset, a write to the closed
    # connection or a connection closed before its request was answered, depending on timing; never
    # as an answer from the apiserver.)
    assert "Error from server" not in res.stderr
    signs = ("EOF", "certificate", "tls:", "connection reset", "broken pipe", "server closed idle connection")
    assert any(sign in res.stderr for sign in signs), res.stderr


ACCEPTS = [
    None,
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/json;as=Table;v=v1;g=meta.k8s.io",
    "application/json;as=Table;v=v1;g=meta.k8s.io, application/json",
    "text/html",
]


@pytest.mark.parametrize("user_agent", ["kproxy-test", "curl/8.0"])
@pytest.mark.parametrize("accept", ACCEPTS)
def test_rejected_token_401_is_negotiated_as_the_apiservers(
    imp: RunningProxy, control_plane: ControlPlaneInfo, accept: str | None, user_agent: str
) -> None:
    """The 401 kproxy answers itself for a token the apiserver rejects is written as the
    apiserver's ErrorNegotiated writes it: protobuf, YAML or JSON as Accept asks (pretty for a
    curl User-Agent or ?pretty), indented JSON without a newline when nothing is acceptable."""

    def raw(base: str, ca_file: Path, query: str) -> tuple[int, str, bytes]:
        headers = {"Authorization": "Bearer not-a-valid-token", "User-Agent": user_agent}
        if accept is not None:
            headers["Accept"] = accept
        req = urllib.request.Request(base + "/api/v1/namespaces" + query, headers=headers)
        try:
            with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=str(ca_file)), timeout=10):
                raise AssertionError("a rejected token was accepted")
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", ""), e.read()

    for query in ("", "?pretty=true"):
        direct = raw(control_plane.server, control_plane.ca_file, query)
        assert direct[0] == 401
        assert raw(imp.url, imp.ca_file, query) == direct
