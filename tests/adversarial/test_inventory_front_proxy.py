"""The apiserver's request-header (front proxy) authenticator and the headers a caller sends.

The apiserver names a request's caller from ``X-Remote-User``, ``X-Remote-Group`` and
``X-Remote-Extra-*`` when the connection's client certificate verifies against
``--requestheader-client-ca-file`` and its CN is in ``--requestheader-allowed-names`` (any CN
when none are listed); it runs before every other authenticator
(pkg/kubeapiserver/authenticator/config.go; staging/src/k8s.io/apiserver/pkg/authentication/
request/headerrequest/requestheader.go, .../request/x509/x509.go ``Verifier``). kproxy presents
its own kubeconfig's certificate upstream in ``proxy`` mode. Where that certificate is one the
request-header authenticator trusts (an operator gives kproxy the cluster's front-proxy client
certificate: kproxy is a proxy in front of the apiserver, after all), a caller's own
``X-Remote-*`` headers name anyone, ``system:masters`` included, while kproxy's own identity
(without them) has no rights at all: kproxy must not pass them on.

This runs a control plane of its own, started with those flags."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from kproxy.localcluster import certs
from kproxy.localcluster.controlplane import client_ssl_context
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.localcluster.kubeconfigs import write_kubeconfig
from kproxy.localcluster.lifecycle import down, up
from kproxy.testing.proxyproc import RunningProxy

from .conftest import start_capped
from .inventory_support import CLIENT_AUTH, apiserver_client_ca, client_cert, self_subject_review
from .wire import Endpoint

KPROXY_USER = "inv-front-proxy-client"
HEADERS = [("X-Remote-User", "inv-remote-admin"), ("X-Remote-Group", "system:masters")]


@pytest.fixture(scope="module")
def front_proxy_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneInfo]:
    """A control plane whose request-header CA is its client CA, trusting the CN KPROXY_USER."""
    directory = tmp_path_factory.mktemp("inv-front-proxy-cp")
    args = [
        f"--requestheader-client-ca-file={directory.absolute() / 'ca.crt'}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        # The apiserver refuses a request-header CA that is its client CA without allowed names.
        f"--requestheader-allowed-names={KPROXY_USER}",
    ]
    try:
        yield up(directory, apiserver_args=args)
    finally:
        down(directory)


@dataclass(frozen=True)
class LowProxy:
    rp: RunningProxy
    crt: Path
    key: Path


@pytest.fixture(scope="module")
def low_proxy(front_proxy_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LowProxy]:
    """``proxy`` mode with the front-proxy certificate: KPROXY_USER, which no RBAC names."""
    cp = front_proxy_plane
    tmp = tmp_path_factory.mktemp("inv-front-proxy")
    leaf = client_cert(apiserver_client_ca(cp), x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, KPROXY_USER)]),
                       CLIENT_AUTH)  # fmt: skip
    crt = certs.write_pem(tmp / "kproxy.crt", leaf.cert_pem, private=False)
    key = certs.write_pem(tmp / "kproxy.key", leaf.key_pem, private=True)
    kubeconfig = write_kubeconfig(tmp / "kproxy.kubeconfig", server=cp.server, ca_file=cp.ca_file, user=KPROXY_USER,
                                  client_cert=crt, client_key=key)  # fmt: skip
    rp = start_capped(tmp / "p", cp, upstream_kubeconfig=kubeconfig)
    yield LowProxy(rp, crt, key)
    rp.stop(signal.SIGKILL)


def test_the_front_proxy_headers_are_trusted_from_kproxys_certificate(
    front_proxy_plane: ControlPlaneInfo, low_proxy: LowProxy
) -> None:
    """The setting is what the test says it is: without X-Remote-* headers kproxy is its own
    user; kproxy's certificate sent straight with them is whoever they name."""
    own = self_subject_review(Endpoint.from_url(low_proxy.rp.url))
    assert own.user == KPROXY_USER, own
    cp = front_proxy_plane
    straight = client_ssl_context(cp.ca_file, low_proxy.crt, low_proxy.key)
    named = self_subject_review(Endpoint("127.0.0.1", cp.apiserver_port, straight), HEADERS)
    assert (named.user, "system:masters" in named.groups) == ("inv-remote-admin", True), named


SPELLINGS = {
    "canonical": HEADERS,
    "lower-case": [("x-remote-user", "inv-remote-admin"), ("x-remote-group", "system:masters")],
    "upper-case": [("X-REMOTE-USER", "inv-remote-admin"), ("X-REMOTE-GROUP", "system:masters")],
    "extra-only": [("X-Remote-User", "inv-remote-admin"), ("x-REMOTE-extra-scopes", "x")],
    "group-twice": [("X-Remote-Group", "system:masters"), ("x-remote-group", "system:masters"),
                    ("X-Remote-User", "inv-remote-admin")],
}  # fmt: skip


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_a_callers_front_proxy_headers_do_not_name_it(spelling: str, low_proxy: LowProxy) -> None:
    """Through kproxy, the caller is kproxy's own user whatever X-Remote-* headers it sends
    (a HOLE until kproxy removed them: the apiserver named the caller as they said, system:masters
    included); the upgrade path shares the header writer."""
    headers = SPELLINGS[spelling]
    seen = self_subject_review(Endpoint.from_url(low_proxy.rp.url), headers)
    assert (seen.status, seen.user, "scopes" in dict(seen.extra)) == (201, KPROXY_USER, False), seen
    upgrade = [*headers, ("Connection", "Upgrade"), ("Upgrade", "x-inv")]
    seen = self_subject_review(Endpoint.from_url(low_proxy.rp.url), upgrade)
    assert (seen.status, seen.user, "scopes" in dict(seen.extra)) == (201, KPROXY_USER, False), seen
