"""HTTP-level behaviour of kproxy against the real apiserver: non-resource paths, headers, limits,
errors, metrics, disconnects and graceful shutdown."""

from __future__ import annotations

import gzip
import http.client
import json
import re
import signal
import socket
from collections.abc import Callable
from typing import Any

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy


def raw(
    proxy: RunningProxy,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> tuple[int, http.client.HTTPMessage, bytes]:
    host, port = proxy.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def post_json(proxy: RunningProxy, path: str, body: bytes) -> tuple[int, http.client.HTTPMessage, bytes]:
    return raw(proxy, "POST", path, body=body, headers={"Content-Type": "application/json"})


def status_of(body: bytes) -> dict[str, Any]:
    obj = json.loads(body)
    assert obj["kind"] == "Status" and obj["apiVersion"] == "v1" and obj["status"] == "Failure"
    return obj


@pytest.mark.parametrize(
    "path",
    [
        "/version",
        "/api",
        "/apis",
        "/apis/apps/v1",
        "/healthz",
        "/livez",
        "/readyz",
        "/openapi/v3",
        "/api/v1/namespaces/default",
    ],
)
def test_non_resource_and_discovery_paths_identical(
    control_plane: ControlPlaneInfo, proxy: RunningProxy, path: str
) -> None:
    code, headers, body = raw(proxy, "GET", path, headers={"Accept": "application/json"})
    dcode, dbody = control_plane.request("GET", path)
    assert code == dcode == 200
    if path == "/api/v1/namespaces/default":
        # same object; managedFields timestamps etc. are identical because it is the same stored object
        assert json.loads(body)["metadata"]["uid"] == json.loads(dbody)["metadata"]["uid"]
    else:
        assert body == dbody
    assert "Audit-Id" in headers or path in ("/healthz", "/livez", "/readyz")


def test_openapi_v2_large_body_streams_and_gzip_passes_through(
    control_plane: ControlPlaneInfo, proxy: RunningProxy
) -> None:
    """/openapi/v2 is several MB: streamed through; when the client asks for gzip the apiserver's
    own gzip reaches it untouched (kproxy never decodes upstream bodies)."""
    code, headers, body = raw(proxy, "GET", "/openapi/v2", headers={"Accept": "application/json"})
    dcode, dbody = control_plane.request("GET", "/openapi/v2")
    assert code == dcode == 200 and body == dbody and len(body) > 1_000_000
    code, headers, zbody = raw(
        proxy, "GET", "/openapi/v2", headers={"Accept": "application/json", "Accept-Encoding": "gzip"}
    )
    assert code == 200 and headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(zbody) == dbody


def test_unknown_path_404_identical(control_plane: ControlPlaneInfo, proxy: RunningProxy) -> None:
    code, _, body = raw(proxy, "GET", "/no/such/path")
    dcode, dbody = control_plane.request("GET", "/no/such/path")
    assert (code, body) == (dcode, dbody) == (404, b"404 page not found\n")


def test_oversized_body_gets_413_status(proxy: RunningProxy, namespace: str) -> None:
    big = (
        b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big"},"data":{"x":"'
        + b"a" * (3 * 1024 * 1024)
        + b'"}}'
    )
    code, headers, body = post_json(proxy, f"/api/v1/namespaces/{namespace}/configmaps", big)
    assert code == 413
    st = status_of(body)
    assert st["reason"] == "RequestEntityTooLarge" and st["message"] == "Request entity too large: limit is 3145728"
    assert headers["Content-Type"] == "application/json"


def test_oversized_chunked_body_gets_413_and_nothing_is_created(
    proxy: RunningProxy, kubectl: Kubectl, namespace: str
) -> None:
    """Without Content-Length the limit is enforced while streaming; the upstream request is abandoned."""
    host, port = proxy.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    head = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bigchunk"},"data":{"x":"'
    chunks = [head] + [b"a" * 65536] * 60 + [b'"}}']
    conn.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        body=iter(chunks),
        headers={"Content-Type": "application/json"},
        encode_chunked=True,
    )
    resp = conn.getresponse()
    assert resp.status == 413
    assert status_of(resp.read())["reason"] == "RequestEntityTooLarge"
    conn.close()
    assert "NotFound" in kubectl(["get", "cm", "bigchunk", "-n", namespace, "-o", "name"], check=False).stderr


def test_metrics_count_requests(proxy: RunningProxy, kubectl: Kubectl, namespace: str) -> None:
    def count(code: str) -> float:
        pat = re.compile(
            rf'^kproxy_requests_total\{{answered_by="upstream",code="{code}",group="",resource="configmaps",'
            rf'subresource="",verb="get"\}} (\S+)$'
        )
        for line in proxy.metrics().splitlines():
            m = pat.match(line)
            if m:
                return float(m.group(1))
        return 0.0

    before_ok, before_404 = count("200"), count("404")
    kubectl(["create", "configmap", "m", "-n", namespace])
    for _ in range(3):
        kubectl(["get", "configmap", "m", "-n", namespace], kubeconfig=proxy.kubeconfig)
    kubectl(["get", "configmap", "nope", "-n", namespace], kubeconfig=proxy.kubeconfig, check=False)
    assert count("200") - before_ok == 3
    assert count("404") - before_404 == 1
    text = proxy.metrics()
    for name in (
        "kproxy_request_duration_seconds_bucket",
        "kproxy_response_bytes_total",
        "kproxy_requests_in_flight",
        "kproxy_open_watches",
        "kproxy_upstream_errors_total",
        "kproxy_filter_duration_seconds",
    ):
        assert name in text


def test_admin_health_endpoints(proxy: RunningProxy) -> None:
    assert proxy.get("/healthz", admin=True) == (200, b"ok")
    assert proxy.get("/livez", admin=True) == (200, b"ok")
    assert proxy.get("/readyz", admin=True) == (200, b"ok")


def test_upstream_unreachable_gets_429_status(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, tmp_path: Any
) -> None:
    """An upstream that refuses connections: a read gets a 429 TooManyRequests Status with
    Retry-After (kproxy.core.outage; tests/e2e/test_outage_answers.py), and /readyz says so."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens here now
    kc = json.loads(json.dumps(__import__("yaml").safe_load(control_plane.admin_kubeconfig.read_text())))
    kc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path = tmp_path / "dead.kubeconfig"
    path.write_text(json.dumps(kc))
    rp = proxy_factory(upstream_kubeconfig=path, ready=False)
    code, headers, body = raw(rp, "GET", "/api/v1/namespaces")
    assert code == 429 and headers["Retry-After"] == "1"
    st = status_of(body)
    assert st["reason"] == "TooManyRequests" and st["code"] == 429
    assert "Traceback" not in rp.log_text()
    assert rp.get("/readyz", admin=True)[0] == 503


def test_client_disconnect_ends_the_upstream_watch(
    proxy: RunningProxy, control_plane: ControlPlaneInfo, namespace: str
) -> None:
    def open_watches() -> float:
        m = re.search(r"^kproxy_open_watches (\S+)$", proxy.metrics(), re.M)
        return float(m.group(1)) if m else -1

    def upstream_watches() -> float:
        _, body = control_plane.request("GET", "/metrics")
        total = 0.0
        for line in body.decode().splitlines():
            if (
                line.startswith("apiserver_longrunning_requests{")
                and 'verb="WATCH"' in line
                and 'resource="secrets"' in line
            ):
                total += float(line.rsplit(" ", 1)[1])
        return total

    base_up = upstream_watches()
    base = open_watches()
    host, port = proxy.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"GET /api/v1/namespaces/{namespace}/secrets?watch=1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    eventually(lambda: open_watches() == base + 1, 10, "the watch to be counted")
    eventually(lambda: upstream_watches() == base_up + 1, 10, "the upstream watch to open")
    sock.close()
    eventually(lambda: open_watches() == base, 10, "kproxy to notice the disconnect")
    eventually(lambda: upstream_watches() == base_up, 20, "the upstream watch to end")


def test_sigterm_drains_in_flight_and_ends_watches(
    proxy_factory: Callable[..., RunningProxy], kubectl: Kubectl, namespace: str
) -> None:
    rp = proxy_factory()
    host, port = rp.url.removeprefix("http://").split(":")
    # An open watch: it must end with a clean end of stream, not a reset.
    watch = socket.create_connection((host, int(port)))
    watch.sendall(f"GET /api/v1/namespaces/{namespace}/configmaps?watch=1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert watch.recv(4096).startswith(b"HTTP/1.1 200")
    # An in-flight create whose body is still arriving when SIGTERM lands.
    post = socket.create_connection((host, int(port)))
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "drained"}}).encode()
    post.sendall(
        f"POST /api/v1/namespaces/{namespace}/configmaps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body[:10]
    )
    eventually(lambda: "kproxy_requests_in_flight 1.0" in rp.metrics(), 10, "the POST to be in flight")
    rp.proc.send_signal(signal.SIGTERM)
    # The watch ends cleanly: the chunked stream's terminating zero-length chunk arrives.
    watch.settimeout(10)
    tail = b""
    while not tail.endswith(b"0\r\n\r\n"):
        data = watch.recv(4096)
        assert data, f"watch closed without a clean end of stream: {tail[-50:]!r}"
        tail += data
    # New connections are refused once the listener is closed.
    eventually(lambda: _refused(host, int(port)), 10, "the listener to close")
    post.sendall(body[10:])
    post.settimeout(20)
    reply = post.recv(65536)
    assert reply.startswith(b"HTTP/1.1 201"), reply[:200]
    assert rp.proc.wait(30) == 0
    assert kubectl.json(["get", "cm", "drained", "-n", namespace])["metadata"]["name"] == "drained"


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return False
    except OSError:
        return True


def test_upstream_killed_then_back(proxy: RunningProxy, control_plane: ControlPlaneInfo, kubectl: Kubectl) -> None:
    """The real apiserver dies: reads get 429 Status answers (never a traceback); when it comes
    back, kproxy serves again without a restart."""
    control_plane.stop_apiserver(kill=True)
    try:
        code, _, body = raw(proxy, "GET", "/api/v1/namespaces")
        assert code == 429
        assert status_of(body)["reason"] == "TooManyRequests"
        res = kubectl(["get", "ns"], kubeconfig=proxy.kubeconfig, check=False)
        assert res.returncode == 1
    finally:
        control_plane.start_apiserver()
    eventually(lambda: raw(proxy, "GET", "/api/v1/namespaces")[0] == 200, 30, "kproxy to serve again")
    assert "Traceback" not in proxy.log_text()


def test_in_cluster_service_account(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, kubectl: Kubectl, tmp_path: Any
) -> None:
    """With no kubeconfig, kproxy uses the pod's service account: the same files and environment a
    pod gets (token and CA under the service-account dir, KUBERNETES_SERVICE_HOST/PORT)."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(control_plane.admin_token)
    (sa / "ca.crt").write_bytes(control_plane.ca_file.read_bytes())
    (sa / "namespace").write_text("default")
    env = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(control_plane.apiserver_port),
        "KPROXY_SERVICE_ACCOUNT_DIR": str(sa),
    }
    rp = proxy_factory(upstream_kubeconfig=None, env=env)
    assert '"upstream_from": "in-cluster service account"' in rp.log_text().replace('":"', '": "')
    status, body = rp.get("/api/v1/namespaces/default")
    assert status == 200 and json.loads(body)["metadata"]["name"] == "default"
    assert kubectl(["get", "ns", "default", "-o", "name"], kubeconfig=rp.kubeconfig).stdout == "namespace/default\n"


def test_access_log_is_structured_and_carries_the_audit_id(proxy: RunningProxy, namespace: str) -> None:
    code, headers, _ = raw(proxy, "GET", f"/api/v1/namespaces/{namespace}/configmaps?limit=1")
    assert code == 200
    audit_id = headers["Audit-Id"]

    def logged() -> dict[str, Any] | None:
        for line in proxy.log_text().splitlines():
            if audit_id in line:
                return dict(json.loads(line))
        return None

    eventually(lambda: logged() is not None, 10, "the access log line")
    entry = logged()
    assert entry is not None
    assert entry["audit_id"] == audit_id and entry["logger"] == "kproxy.access"
    assert entry["verb"] == "list" and entry["resource"] == "configmaps" and entry["level"] == "info"
    assert entry["msg"] == f"GET /api/v1/namespaces/{namespace}/configmaps?limit=1 200"


@pytest.mark.parametrize(
    ("path", "expected"), [("/openapi/v2", 200), ("/healthz", 200), ("/api/v1/namespaces/default", 405)]
)
def test_head_request_matches_direct(
    control_plane: ControlPlaneInfo, proxy: RunningProxy, path: str, expected: int
) -> None:
    """HEAD (whose answer ends with its head, whatever its Content-Length says): the apiserver
    answers it on some paths and refuses it (405) on resource paths, and so does kproxy."""
    code, headers, body = raw(proxy, "HEAD", path)
    conn = http.client.HTTPSConnection("127.0.0.1", control_plane.apiserver_port, context=control_plane.ssl_context())
    conn.request("HEAD", path)
    direct = conn.getresponse()
    dbody = direct.read()
    conn.close()
    assert code == direct.status == expected
    assert body == dbody == b""
    assert headers.get("Content-Length") == direct.getheader("Content-Length")


def test_response_header_names_identical(control_plane: ControlPlaneInfo, proxy: RunningProxy) -> None:
    """Same header names as the apiserver's own answer: nothing added (no `Server`), nothing lost."""
    conn = http.client.HTTPSConnection("127.0.0.1", control_plane.apiserver_port, context=control_plane.ssl_context())
    conn.request("GET", "/api/v1/namespaces/default", headers={"Accept": "application/json"})
    direct = conn.getresponse()
    direct.read()
    conn.close()
    _, via, _ = raw(proxy, "GET", "/api/v1/namespaces/default", headers={"Accept": "application/json"})
    assert sorted(k.lower() for k in via) == sorted(k.lower() for k in direct.headers)
    assert "Server" not in via


def test_byte_counters(proxy: RunningProxy, namespace: str) -> None:
    def value(name: str) -> float:
        m = re.search(rf"^{name} (\S+)$", proxy.metrics(), re.M)
        return float(m.group(1)) if m else 0.0

    before_in, before_out = value("kproxy_request_bytes_total"), value("kproxy_response_bytes_total")
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bytes"}}).encode()
    code, _, answer = post_json(proxy, f"/api/v1/namespaces/{namespace}/configmaps", body)
    assert code == 201
    assert value("kproxy_request_bytes_total") - before_in == len(body)
    assert value("kproxy_response_bytes_total") - before_out >= len(answer)


@pytest.mark.parametrize("chunked", [False, True])
def test_large_body_streams_upstream_intact(
    proxy: RunningProxy, kubectl: Kubectl, namespace: str, chunked: bool
) -> None:
    """A 900 KiB create (ConfigMaps stop at 1 MiB), with Content-Length or chunked, arrives byte for byte."""
    value = "".join(chr(ord("a") + i % 26) for i in range(900 * 1024))
    name = f"large-{int(chunked)}"
    body = json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}}
    ).encode()
    host, port = proxy.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    headers = {"Content-Type": "application/json"}
    if chunked:
        pieces = [body[i : i + 100_000] for i in range(0, len(body), 100_000)]
        conn.request("POST", path, body=iter(pieces), headers=headers, encode_chunked=True)
    else:
        conn.request("POST", path, body=body, headers=headers)
    resp = conn.getresponse()
    assert resp.status == 201, resp.read()[:300]
    resp.read()
    conn.close()
    stored = kubectl.json(["get", "cm", name, "-n", namespace])
    assert stored["data"]["v"] == value


def test_expect_100_continue(proxy: RunningProxy, kubectl: Kubectl, namespace: str) -> None:
    """kproxy answers `Expect: 100-continue` itself (as Go's server would) and streams the body on;
    any other expectation gets 417."""
    host, port = proxy.url.removeprefix("http://").split(":")
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "expect"}}).encode()
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(
        f"POST /api/v1/namespaces/{namespace}/configmaps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode()
    )
    assert s.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    s.sendall(body)
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 201"), reply[:200]
    s.close()
    assert kubectl.json(["get", "cm", "expect", "-n", namespace])["metadata"]["name"] == "expect"
    code, _, _ = raw(
        proxy,
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        body=body,
        headers={"Content-Type": "application/json", "Expect": "something-else"},
    )
    assert code == 417


def test_non_ascii_header_bytes_pass_unchanged(
    control_plane: ControlPlaneInfo, proxy: RunningProxy, namespace: str
) -> None:
    """Header bytes beyond ASCII go through as they are, both ways: a User-Agent in UTF-8 names the
    field manager, and the apiserver's Warning quoting a non-ASCII field name reaches the client
    byte for byte (http.client reads header bytes as latin-1, so equal strings mean equal bytes)."""

    def create(name: str, via_proxy: bool) -> tuple[int, str, str]:
        body = json.dumps(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name},
                "data": {"k": "v"},
                "dätä": {"ü": "x"},
            }
        )
        headers: dict[str, Any] = {"Content-Type": "application/json", "User-Agent": "kübectl-tëst/1.0".encode()}
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        if via_proxy:
            host, port = proxy.url.removeprefix("http://").split(":")
            conn: http.client.HTTPConnection = http.client.HTTPConnection(host, int(port), timeout=30)
        else:
            conn = http.client.HTTPSConnection(
                "127.0.0.1", control_plane.apiserver_port, context=control_plane.ssl_context(), timeout=30
            )
        try:
            conn.request("POST", path, body=body.encode(), headers=headers)
            resp = conn.getresponse()
            obj = json.loads(resp.read())
            return resp.status, resp.headers.get("Warning", ""), obj["metadata"]["managedFields"][0]["manager"]
        finally:
            conn.close()

    direct = create("direct", via_proxy=False)
    via = create("via", via_proxy=True)
    assert direct[0] == 201 and "d\xc3\xa4t\xc3\xa4" in direct[1]  # UTF-8 bytes, as read by http.client
    assert via == direct
