"""The admin listener off loopback, as the chart runs it: ``/metrics`` answers only a bearer token
the apiserver authenticates and authorizes for ``get`` on ``/metrics`` (the apiserver's own
``/metrics`` asks the same, and answers the same refusals), over TLS with the API listener's
certificate; the probes stay open, as the apiserver's are."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.localcluster.processes import free_ports
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy


def _get(url: str, ca_file: Path | None, token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    ctx = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _status(answer: tuple[int, dict[str, str], bytes]) -> tuple[int, Any]:
    code, _, body = answer
    return code, json.loads(body)


@pytest.fixture
def admin_on_all_addresses(proxy_factory: Callable[..., RunningProxy]) -> tuple[RunningProxy, str]:
    """kproxy as the chart configures it: forward mode, TLS, the admin listener on every
    address (``metrics_access`` left at ``auto``) with the same certificate (``admin_tls``)."""
    (admin_port,) = free_ports(1)
    rp = proxy_factory(
        credentials="forward",
        tls=True,
        ready=False,
        extra={"admin_listen": f"0.0.0.0:{admin_port}", "admin_tls": True},
    )
    admin = f"https://127.0.0.1:{admin_port}"

    def ready() -> bool:
        try:
            return _get(admin + "/readyz", rp.ca_file)[0] == 200
        except urllib.error.URLError:
            return False  # not listening yet

    eventually(ready, 30, "kproxy's /readyz over TLS")
    return rp, admin


def test_metrics_need_what_the_apiservers_metrics_need(
    admin_on_all_addresses: tuple[RunningProxy, str],
    control_plane: ControlPlaneInfo,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    rp, admin = admin_on_all_addresses
    direct = control_plane.server + "/metrics"
    ours = admin + "/metrics"

    # No token: the anonymous user, refused as the apiserver refuses it, word for word.
    refused = _status(_get(ours, rp.ca_file))
    assert refused == _status(_get(direct, control_plane.ca_file))
    assert (
        refused[0] == 403 and refused[1]["message"] == 'forbidden: User "system:anonymous" cannot get path "/metrics"'
    )
    # A token the apiserver rejects: its 401.
    assert _status(_get(ours, rp.ca_file, "not-a-token")) == _status(_get(direct, control_plane.ca_file, "not-a-token"))
    # A real user without the right: its 403, naming the user.
    user = control_plane.user_token
    refused = _status(_get(ours, rp.ca_file, user))
    assert refused == _status(_get(direct, control_plane.ca_file, user))
    assert refused[1]["message"] == f'forbidden: User "{control_plane.user_name}" cannot get path "/metrics"'
    # Nothing of the metrics leaked in the refusals.
    assert b"kproxy_" not in _get(ours, rp.ca_file, user)[2]

    # The probes are open, as the apiserver's are.
    for probe in ("/healthz", "/livez", "/readyz"):
        code, _, body = _get(admin + probe, rp.ca_file)
        assert (code, body) == (200, b"ok"), probe

    # Granted `get` on /metrics (the scraper's usual ClusterRole), the user reads kproxy's metrics.
    role = f"metrics-reader-{namespace}"
    kubectl(["create", "clusterrole", role, "--verb=get", "--non-resource-url=/metrics"])
    try:
        kubectl(["create", "clusterrolebinding", role, f"--clusterrole={role}", f"--user={control_plane.user_name}"])
        eventually(lambda: _get(ours, rp.ca_file, user)[0] == 200, 30, "the grant to be seen (denials cached 5 s)")
        code, headers, body = _get(ours, rp.ca_file, user)
        assert b"kproxy_requests_total" in body and headers["Content-Type"].startswith("text/plain")
        assert _get(direct, control_plane.ca_file, user)[0] == 200  # the same right the apiserver's needs
    finally:
        kubectl(["delete", "clusterrolebinding", role, "--ignore-not-found"])
        kubectl(["delete", "clusterrole", role, "--ignore-not-found"])


def test_tls_admin_listener_refuses_plain_http(admin_on_all_addresses: tuple[RunningProxy, str]) -> None:
    """With ``admin_tls`` the admin port speaks only TLS: a scraper's token is never read in clear."""
    _, admin = admin_on_all_addresses
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        _get(admin.replace("https://", "http://") + "/metrics", None, "a-token")


def test_loopback_admin_listener_stays_open(proxy_factory: Callable[..., RunningProxy]) -> None:
    """kproxy's default admin listener (127.0.0.1) serves /metrics as before: only the host's
    own processes reach it."""
    rp = proxy_factory(credentials="forward", tls=True)
    code, body = rp.get("/metrics", admin=True)
    assert code == 200 and b"kproxy_requests_total" in body
