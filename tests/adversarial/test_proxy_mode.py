"""`credentials: proxy` against a real `kubectl proxy` (the tool it replaces) with its defaults:
whatever Host, target form or exec/attach path spelling a page using DNS rebinding (or any local
caller) tries, kproxy refuses exactly what kubectl proxy refuses."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from kproxy.config import ProxyConfig
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.localcluster.processes import free_ports
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

from .conftest import start_capped
from .wire import Endpoint, exchange, request_bytes

SECRETS = "/api/v1/namespaces/kube-system/secrets"
EXEC = "/api/v1/namespaces/default/pods/p/exec?command=id&stdout=1"
ATTACH = "/api/v1/namespaces/default/pods/p/attach?stdout=1"

# (method, target, Host header)
CASES: dict[str, tuple[str, str, str]] = {
    "loopback": ("GET", SECRETS, "localhost"),
    "loopback-port": ("GET", SECRETS, "localhost:8001"),
    "loopback-ip": ("GET", SECRETS, "127.0.0.1"),
    "loopback-v6": ("GET", SECRETS, "[::1]:8001"),
    "evil": ("GET", SECRETS, "evil.example.com"),
    "evil-port": ("GET", SECRETS, "evil.example.com:8001"),
    "suffix": ("GET", SECRETS, "localhost.evil.example.com"),
    "prefix": ("GET", SECRETS, "evil-localhost"),
    "upper-case": ("GET", SECRETS, "LOCALHOST"),
    "trailing-dot": ("GET", SECRETS, "localhost."),
    "ip-decimal": ("GET", SECRETS, "2130706433"),
    "ip-other-loopback": ("GET", SECRETS, "127.0.0.2"),
    "userinfo-host": ("GET", SECRETS, "localhost@evil.example.com"),
    "empty-host": ("GET", SECRETS, ""),
    "absolute-evil": ("GET", "http://evil.example.com" + SECRETS, "localhost"),
    "absolute-short-host": ("GET", "http://x" + SECRETS, "localhost"),
    "absolute-short-host-version": ("GET", "http://x/api/v1", "localhost"),
    "absolute-evil-upper": ("GET", "HTTP://EVIL.EXAMPLE.COM" + SECRETS, "localhost"),
    "absolute-loopback": ("GET", "http://localhost" + SECRETS, "evil.example.com"),
    "scheme-only": ("GET", "x:" + SECRETS, "localhost"),
    "exec": ("POST", EXEC, "localhost"),
    "attach": ("POST", ATTACH, "localhost"),
    "exec-get": ("GET", EXEC, "localhost"),
    "exec-pct": ("POST", "/api/v1/namespaces/default/pods/p/%65xec?command=id", "localhost"),
    "exec-dotdot": ("POST", "/api/v1/namespaces/default/pods/p/x/../exec?command=id", "localhost"),
    "exec-double-slash": ("POST", "/api/v1/namespaces/default/pods/p//exec?command=id", "localhost"),
    "exec-trailing-slash": ("POST", "/api/v1/namespaces/default/pods/p/exec/?command=id", "localhost"),
    "exec-upper": ("POST", "/api/v1/namespaces/default/pods/p/EXEC?command=id", "localhost"),
    "exec-absolute": ("POST", "http://localhost" + EXEC, "localhost"),
    "exec-leading-double-slash": ("POST", "/" + EXEC, "localhost"),
    "exec-semicolon": ("POST", "/api/v1/namespaces/default/pods/p/exec;x?command=id", "localhost"),
}
KNOWN: dict[str, str] = {}


@pytest.fixture(scope="module")
def kubectl_proxy(control_plane: ControlPlaneInfo) -> Iterator[Endpoint]:
    (port,) = free_ports(1)
    proc = subprocess.Popen(
        [str(control_plane.kubectl), "--kubeconfig", str(control_plane.admin_kubeconfig), "proxy", f"--port={port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ep = Endpoint("127.0.0.1", port)
    try:
        version = request_bytes("GET", "/version", [])
        eventually(lambda: exchange(ep, version, timeout=1).status == 200, 30, "kubectl proxy to listen")
        yield ep
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def kproxy(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """`credentials: proxy` with its defaults (kubectl proxy's accepted hosts and rejected paths)."""
    defaults = {"accept_hosts": ProxyConfig().accept_hosts}  # not the test hosts start_proxy adds
    rp = start_capped(tmp_path_factory.mktemp("adv-proxymode"), control_plane, extra={"proxy": defaults})
    yield rp
    rp.stop()


def _raw(method: str, target: str, host: str) -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nConnection: close\r\n"
    return (head + ("Content-Length: 0\r\n" if method == "POST" else "") + "\r\n").encode()


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[pytest.mark.xfail(strict=True, reason=KNOWN[c])] if c in KNOWN else []) for c in CASES],
)
def test_refuses_what_kubectl_proxy_refuses(case: str, kproxy: RunningProxy, kubectl_proxy: Endpoint) -> None:
    raw = _raw(*CASES[case])
    theirs = exchange(kubectl_proxy, raw)
    ours = exchange(Endpoint.from_url(kproxy.url), raw)
    detail = f"kproxy {ours.short()}; kubectl proxy {theirs.short()}; raw={raw!r}"
    if 300 <= theirs.status < 400:
        # Go's ServeMux redirects a path that is not clean (`//`, `..`) to its clean form, where the
        # same check applies; kproxy must not serve it instead.
        assert not 200 <= ours.status < 300, detail
    else:
        assert (ours.status == 403) == (theirs.status == 403), detail
    if theirs.status != 403 and not 300 <= theirs.status < 400:  # both forwarded: the apiserver's answer
        assert ours.status == theirs.status, detail
    assert b"kube-system" not in ours.body or theirs.status == 200, detail
    assert kproxy.proc.poll() is None
