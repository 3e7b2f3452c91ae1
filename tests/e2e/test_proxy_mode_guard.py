"""`credentials: proxy` refuses what `kubectl proxy` refuses, answering as it does (kproxy/server/proxyguard.py).

The real `kubectl proxy` (the pinned kubectl) and a kproxy with the default config run side by
side against the same apiserver; the same raw requests go to both and the answers are compared:
status, Content-Type, nosniff and body for refusals. Hosts a DNS-rebinding page would send
(``Host: evil.example.com``, an absolute-form target naming it, ports, IPv6 and trailing-dot
spellings), exec and attach however spelled (``%2F``, ``%63``, a trailing slash, absolute form,
WebSocket and SPDY upgrades). Verdicts are taken where the effect would be: an exec that runs
creates a marker file at the stand-in kubelet (a kproxy that opted in to exec runs every one of
these spellings, so each is a real exec at the apiserver); a write refused is not persisted
(direct GET); and kproxy counts each refusal.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import ALLOW_EXEC, RunningProxy, start_proxy
from kproxy.testing.standin_kubelet import StandInNode

_SERVING = re.compile(rb"Starting to serve on 127\.0\.0\.1:(\d+)")


@dataclass
class Answer:
    status: str  # the status line
    headers: dict[str, str]  # lower-cased names, the last value of each
    body: bytes

    @property
    def code(self) -> int:
        return int(self.status.split()[1])


def send(port: int, raw: bytes, *, stream: bool = False) -> Answer:
    """``raw`` (which asks the server to close) on a fresh connection; the whole answer. With
    ``stream``, an upgraded connection is read until the server ends it (an exec's command has
    then run: the apiserver ends the stream after its exit status)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and _complete(data) and not stream:
                break
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return Answer(lines[0], headers, body)


def _complete(data: bytes) -> bool:
    """A 101 or a body of known length is complete without waiting for the close."""
    head, _, body = data.partition(b"\r\n\r\n")
    if b" 101 " in head.split(b"\r\n", 1)[0]:
        return True
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return m is not None and len(body) >= int(m.group(1))


def request(method: str, target: str, host: str | None = "127.0.0.1", *more: str, version: str = "1.1") -> bytes:
    head = [f"{method} {target} HTTP/{version}"]
    if host is not None:
        head.append(f"Host: {host}")
    head += [*more, "Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode()


def websocket() -> tuple[str, ...]:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        "Connection: Upgrade",
        "Upgrade: websocket",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Protocol: v5.channel.k8s.io",
    )


SPDY = ("Connection: Upgrade", "Upgrade: SPDY/3.1", "X-Stream-Protocol-Version: v4.channel.k8s.io")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def kubectl_proxy(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The real ``kubectl proxy`` with its defaults, as the admin; its port."""
    yield from _kubectl_proxy(control_plane, tmp_path_factory.mktemp("kubectl-proxy"), [])


def _kubectl_proxy(cp: ControlPlaneInfo, tmp: Path, flags: list[str]) -> Iterator[int]:
    log = tmp / "kubectl-proxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(cp.kubectl), f"--kubeconfig={cp.admin_kubeconfig}", "proxy", "--port=0", *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        eventually(
            lambda: _SERVING.search(log.read_bytes()) is not None or proc.poll() is not None, 30, "kubectl proxy"
        )
        m = _SERVING.search(log.read_bytes())
        assert m is not None, log.read_text()
        yield int(m.group(1))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


@pytest.fixture(scope="module")
def guarded(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """kproxy, credentials: proxy, nothing about the filter configured: kproxy's defaults."""
    rp = start_proxy(tmp_path_factory.mktemp("guarded"), control_plane.admin_kubeconfig, test_hosts=False)
    assert "proxy" not in rp.config
    yield rp
    rp.stop()


@pytest.fixture(scope="module")
def exec_allowed(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """kproxy with the explicit opt-in to exec and attach (``proxy.reject_paths: []``)."""
    tmp = tmp_path_factory.mktemp("exec-allowed")
    rp = start_proxy(tmp, control_plane.admin_kubeconfig, test_hosts=False, extra={"proxy": ALLOW_EXEC})
    yield rp
    rp.stop()


@pytest.fixture(scope="module")
def node(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInNode]:
    n = StandInNode(control_plane, tmp_path_factory.mktemp("guard-kubelet"))
    yield n
    n.close()


@pytest.fixture(scope="module")
def pod_ns(node: StandInNode) -> str:
    ns = node.namespace("guard")
    node.pod(ns, "box", [{"name": "main", "stdin": True}])
    return ns


def port_of(rp: RunningProxy) -> int:
    return int(rp.url.rsplit(":", 1)[1])


def rejected(rp: RunningProxy, check: str) -> float:
    m = re.search(rf'^kproxy_rejected_requests_total\{{reason="ProxyFilter{check}"\}} (\S+)$', rp.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


# --------------------------------------------------------------------------- hosts


REFUSED_HOSTS = {
    "evil-host": request("GET", "/api/v1/namespaces/kube-system/secrets", "evil.example.com"),
    "evil-host-port": request("GET", "/api/v1/namespaces/kube-system/secrets", "evil.example.com:8001"),
    "loopback-ip-other-spelling": request("GET", "/api/v1/namespaces", "127.1"),
    "localhost-trailing-dot": request("GET", "/api/v1/namespaces", "localhost."),
    "localhost-upper-case": request("GET", "/api/v1/namespaces", "LOCALHOST"),
    "subdomain-of-localhost": request("GET", "/api/v1/namespaces", "localhost.evil.example.com"),
    # net.SplitHostPort takes the brackets off: "::1" is not "[::1]" (kubectl proxy refuses it too).
    "ipv6-with-port": request("GET", "/api/v1/namespaces", "[::1]:8001"),
    "ipv6-bare": request("GET", "/api/v1/namespaces", "::1"),
    "empty-host": request("GET", "/api/v1/namespaces", ""),
    "http-1.0-without-host": request("GET", "/api/v1/namespaces", None, version="1.0"),
    # Go's req.Host is the absolute-form target's authority; the Host header is ignored.
    "absolute-form-evil": request("GET", "http://evil.example.com/api/v1/namespaces/kube-system/secrets", "localhost"),
    "absolute-form-evil-userinfo": request("GET", "http://localhost@evil.example.com/api/v1/namespaces", "localhost"),
    "evil-head": request("HEAD", "/api/v1/namespaces/kube-system/secrets", "evil.example.com"),
    "evil-websocket-watch": request("GET", "/api/v1/secrets?watch=1", "evil.example.com", *websocket()),
    "evil-options": request("OPTIONS", "/api/v1/namespaces", "evil.example.com"),
}

ACCEPTED_HOSTS = {
    "localhost": request("GET", "/api/v1/namespaces/default", "localhost"),
    "localhost-port": request("GET", "/api/v1/namespaces/default", "localhost:8001"),
    "loopback-ip-port": request("GET", "/api/v1/namespaces/default", "127.0.0.1:8001"),
    "ipv6-bracketed": request("GET", "/api/v1/namespaces/default", "[::1]"),
    "empty-port": request("GET", "/api/v1/namespaces/default", "localhost:"),
    "port-not-a-number": request("GET", "/api/v1/namespaces/default", "127.0.0.1:abc"),
    "absolute-form-localhost": request("GET", "http://localhost/api/v1/namespaces/default", "evil.example.com"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_HOSTS))
def test_hosts_kubectl_proxy_refuses_are_refused_alike(case: str, kubectl_proxy: int, guarded: RunningProxy) -> None:
    raw = REFUSED_HOSTS[case]
    want = send(kubectl_proxy, raw)
    before = rejected(guarded, "Host")
    got = send(port_of(guarded), raw)
    assert want.code == 403, want
    assert (got.status, got.body) == (want.status, want.body)
    for name in ("content-type", "x-content-type-options", "content-length"):
        assert got.headers.get(name) == want.headers.get(name), name
    assert rejected(guarded, "Host") == before + 1


@pytest.mark.parametrize("case", sorted(ACCEPTED_HOSTS))
def test_hosts_kubectl_proxy_accepts_are_served(case: str, kubectl_proxy: int, guarded: RunningProxy) -> None:
    """The other side: what kubectl proxy lets through reaches the apiserver through kproxy too."""
    raw = ACCEPTED_HOSTS[case]
    want, got = send(kubectl_proxy, raw), send(port_of(guarded), raw)
    assert want.code == got.code == 200, (want, got)
    assert json.loads(got.body)["metadata"]["name"] == "default"


def test_a_host_header_go_cannot_read_gets_gos_400(kubectl_proxy: int, guarded: RunningProxy) -> None:
    raw = request("GET", "/api/v1/namespaces", "local host")
    want, got = send(kubectl_proxy, raw), send(port_of(guarded), raw)
    assert want.status == got.status == "HTTP/1.1 400 Bad Request: malformed Host header"
    assert want.body == got.body


def test_a_rebinding_write_is_not_persisted(
    kubectl_proxy: int, guarded: RunningProxy, control_plane: ControlPlaneInfo, namespace: str
) -> None:
    """What DNS rebinding would do with the user's rights: the write never reaches the apiserver."""
    for i, (target, host) in enumerate(
        [
            (f"/api/v1/namespaces/{namespace}/configmaps", "evil.example.com:8001"),
            (f"http://evil.example.com:8001/api/v1/namespaces/{namespace}/configmaps", "127.0.0.1"),
        ]
    ):
        body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"rebound-{i}"}})
        raw = request("POST", target, host, "Content-Type: application/json", f"Content-Length: {len(body)}")
        raw += body.encode()
        want, got = send(kubectl_proxy, raw), send(port_of(guarded), raw)
        assert want.code == got.code == 403 and want.body == got.body == b"Forbidden\n"
        code, _ = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/rebound-{i}")
        assert code == 404


# --------------------------------------------------------------------------- exec and attach


def exec_target(ns: str, marker: Path, spelling: str) -> str:
    query = f"?container=main&stdout=true&command=touch&command={marker}"
    return spelling.format(ns=ns) + query


EXEC_SPELLINGS = {
    "plain": "/api/v1/namespaces/{ns}/pods/box/exec",
    "slash-escaped": "/api/v1/namespaces/{ns}/pods/box%2Fexec",
    "api-slash-escaped": "/api%2Fv1/namespaces/{ns}/pods/box/exec",
    "letter-escaped": "/api/v1/namespaces/{ns}/pods/box/exe%63",
    "trailing-slash": "/api/v1/namespaces/{ns}/pods/box/exec/",
    "absolute-form": "http://127.0.0.1/api/v1/namespaces/{ns}/pods/box/exec",
}


@pytest.mark.parametrize("upgrade", ["websocket", "spdy"])
@pytest.mark.parametrize("spelling", sorted(EXEC_SPELLINGS))
def test_exec_is_refused_however_spelled(
    spelling: str,
    upgrade: str,
    kubectl_proxy: int,
    guarded: RunningProxy,
    exec_allowed: RunningProxy,
    pod_ns: str,
    tmp_path: Path,
) -> None:
    """Every spelling is a real exec at the apiserver (the opted-in kproxy runs it: the marker
    appears); kproxy's default refuses each, upgrade or not, with kubectl proxy's answer, and
    nothing runs."""

    def raw(marker: Path, upgrade: str = upgrade) -> bytes:
        method, headers = ("GET", websocket()) if upgrade == "websocket" else ("POST", SPDY)
        return request(method, exec_target(pod_ns, marker, EXEC_SPELLINGS[spelling]), "127.0.0.1", *headers)

    # The control, over WebSocket (a SPDY exec needs a SPDY client to open its streams).
    ran = tmp_path / "ran"
    assert send(port_of(exec_allowed), raw(ran, "websocket"), stream=True).code == 101
    assert ran.exists()

    refused = tmp_path / "refused"
    want = send(kubectl_proxy, raw(refused))
    got = send(port_of(guarded), raw(refused))
    assert want.code == 403
    assert (got.status, got.body, got.headers.get("content-type")) == (
        want.status,
        want.body,
        want.headers.get("content-type"),
    )
    assert not refused.exists()


def test_attach_is_refused(kubectl_proxy: int, guarded: RunningProxy, pod_ns: str) -> None:
    before = rejected(guarded, "Path")
    for target in (
        f"/api/v1/namespaces/{pod_ns}/pods/box/attach?container=main&stdout=true",
        f"/api/v1/namespaces/{pod_ns}/pods/box%2Fattach?container=main&stdout=true",
    ):
        raw = request("GET", target, "localhost", *websocket())
        want, got = send(kubectl_proxy, raw), send(port_of(guarded), raw)
        assert want.code == got.code == 403 and want.body == got.body == b"Forbidden\n"
    assert rejected(guarded, "Path") == before + 2


@pytest.mark.parametrize(
    "spelling",
    [
        "/api/v1/namespaces/{ns}/pods/box/./exec",
        "//api/v1/namespaces/{ns}/pods/box/exec",
        "/apis/../api/v1/namespaces/{ns}/pods/box/exec",
        "/api/v1/namespaces/{ns}/pods/box/x/../exec",
    ],
    ids=["dot-segment", "double-slash", "dot-dot-prefix", "dot-dot"],
)
def test_unclean_exec_paths_do_not_run(
    spelling: str, kubectl_proxy: int, guarded: RunningProxy, pod_ns: str, tmp_path: Path
) -> None:
    """kubectl proxy's ServeMux answers an unclean path with a 307 to the clean one (net/http
    ``ServeMux.findHandler``); kproxy judges the path as sent and forwards what it accepts, and the
    apiserver routes no unclean path (404). Either way nothing runs."""
    marker = tmp_path / "ran"
    raw = request("GET", exec_target(pod_ns, marker, spelling), "127.0.0.1", *websocket())
    assert send(kubectl_proxy, raw).code == 307
    assert send(port_of(guarded), raw).code in (403, 404)
    assert not marker.exists()


# --------------------------------------------------------------------------- the config keys


FLAGS = {
    "accept_hosts": (r"^.*\.example\.com$", "--accept-hosts"),
    "accept_paths": (r"^/api/v1/namespaces$,^/version/?$", "--accept-paths"),
    "reject_paths": (r"^/api/v1/namespaces/kube-system", "--reject-paths"),
    "reject_methods": ("^POST$,^DELETE", "--reject-methods"),
}

CUSTOM = [
    ("GET", "/api/v1/namespaces", "a.example.com"),
    ("GET", "/api/v1/namespaces", "a.example.com:80"),
    ("GET", "/api/v1/namespaces", "localhost"),  # no longer accepted
    ("GET", "/api/v1/namespaces", "a.example.comx"),
    ("GET", "/version", "b.example.com"),
    ("GET", "/version/", "b.example.com"),
    # Go's $ is the end of the text, not before a final newline as in Python's re.
    ("GET", "/api/v1/namespaces%0A", "a.example.com"),
    ("GET", "/version%0A", "a.example.com"),
    ("GET", "/api/v1/namespaces/kube-system", "a.example.com"),
    ("POST", "/api/v1/namespaces", "a.example.com"),
    ("DELETE", "/api/v1/namespaces", "a.example.com"),
    ("PUT", "/api/v1/namespaces", "a.example.com"),
]


@pytest.fixture(scope="module")
def custom_kubectl_proxy(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    flags = [f"{flag}={value}" for value, flag in FLAGS.values()]
    yield from _kubectl_proxy(control_plane, tmp_path_factory.mktemp("kubectl-proxy-custom"), flags)


def test_custom_patterns_mean_what_they_mean_to_kubectl_proxy(
    custom_kubectl_proxy: int, proxy_factory: Callable[..., RunningProxy]
) -> None:
    """The same patterns (kubectl's comma-separated flag values) given to both; every request
    gets the same verdict."""
    rp = proxy_factory(test_hosts=False, extra={"proxy": {key: value for key, (value, _) in FLAGS.items()}})
    verdicts = []
    for method, path, host in CUSTOM:
        raw = request(method, path, host, "Content-Length: 0")
        want, got = send(custom_kubectl_proxy, raw), send(port_of(rp), raw)
        verdicts.append((method, path, host, want.code == 403, got.code == 403))
        if want.code == 403:
            assert (got.status, got.body) == (want.status, want.body)
    assert [v[:4] for v in verdicts] == [(*v[:3], v[4]) for v in verdicts]
    refused = {(m, p, h) for m, p, h, kubectl_refused, _ in verdicts if kubectl_refused}
    assert refused == {
        ("GET", "/api/v1/namespaces", "localhost"),
        ("GET", "/api/v1/namespaces", "a.example.comx"),
        ("GET", "/api/v1/namespaces%0A", "a.example.com"),
        ("GET", "/version%0A", "a.example.com"),
        ("GET", "/api/v1/namespaces/kube-system", "a.example.com"),
        ("POST", "/api/v1/namespaces", "a.example.com"),
        ("DELETE", "/api/v1/namespaces", "a.example.com"),
    }


def test_disable_filter_accepts_any_host(proxy_factory: Callable[..., RunningProxy]) -> None:
    rp = proxy_factory(test_hosts=False, extra={"proxy": {"disable_filter": True}})
    got = send(port_of(rp), request("GET", "/api/v1/namespaces/default", "evil.example.com"))
    assert got.code == 200


# --------------------------------------------------------------------------- browsers' origins

SECRETS_WATCH = "/api/v1/namespaces/kube-system/secrets?watch=1"


def websocket_watch(host: str, origin: str) -> bytes:
    """A browser's WebSocket handshake for a watch (kept open: no ``Connection: close``)."""
    head = [f"GET {SECRETS_WATCH} HTTP/1.1", f"Host: {host}", f"Origin: {origin}", *websocket()]
    return ("\r\n".join(head) + "\r\n\r\n").encode()


@pytest.mark.parametrize(
    ("origin", "through_kubectl_proxy"),
    [
        ("https://evil.example.com", 101),
        ("http://evil.example.com:8001", 101),
        ("http://localhost.evil.com", 101),
        # An origin that is no URL: the apiserver's WebSocket handshake itself answers 403.
        ("null", 403),
        ("x", 403),
    ],
)
def test_a_cross_site_websocket_watch_is_refused(
    kubectl_proxy: int, guarded: RunningProxy, origin: str, through_kubectl_proxy: int
) -> None:
    """A page on any site can open a WebSocket to localhost: its Host is accepted, and kubectl
    proxy upgrades it (the page then reads kube-system's Secrets). Only Origin says where the
    page came from; kproxy refuses it with kubectl proxy's 403 for a refused host."""
    raw = websocket_watch("localhost:8001", origin)
    assert send(kubectl_proxy, raw).code == through_kubectl_proxy  # 101: the hole in its defaults
    before = rejected(guarded, "Origin")
    got = send(port_of(guarded), raw)
    assert (got.code, got.body) == (403, b"Forbidden\n")
    assert rejected(guarded, "Origin") == before + 1


@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1:8001", "https://[::1]"])
def test_a_page_served_from_an_accepted_host_may_watch(guarded: RunningProxy, origin: str) -> None:
    assert send(port_of(guarded), websocket_watch("localhost:8001", origin)).code == 101


def test_check_origin_false_is_kubectl_proxys_behaviour(proxy_factory: Callable[..., RunningProxy]) -> None:
    rp = proxy_factory(test_hosts=False, extra={"proxy": {"check_origin": False}})
    assert send(port_of(rp), websocket_watch("localhost", "https://evil.example.com")).code == 101
