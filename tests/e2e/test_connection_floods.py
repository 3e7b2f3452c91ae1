"""Floods of connections that hold kproxy without ever sending a request, against a real `kproxy run`
in front of the real apiserver (kproxy/server/connections.py).

A client without credentials can open connections that never finish their TLS handshake, or
keep connections alive and idle, or simply open more connections than kproxy has file
descriptors. Go's server in front of the apiserver gives a handshake ReadHeaderTimeout (32 s)
to finish and an idle connection IdleTimeout (90 s); kproxy keeps those deadlines and bounds how
many connections may be in each state, and all of them together below its file-descriptor limit.
Each test checks what a legitimate caller sees meanwhile (its request reaches the apiserver and
is answered promptly) and what the flood costs kproxy's process (RSS, file descriptors).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator

from prometheus_client.parser import text_string_to_metric_families

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.localcluster.kubectl import Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

#: The first bytes of a TLS record carrying a 512-byte ClientHello, of which no more is sent.
_HALF_CLIENT_HELLO = bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03])


def _addr(proxy: RunningProxy) -> tuple[str, int]:
    host, port = proxy.url.split("://")[1].rsplit(":", 1)
    return host, int(port)


def _metric(proxy: RunningProxy, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(proxy.metrics()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether kproxy closed ``sock`` (end of file or reset), without waiting."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


@contextlib.contextmanager
def _connections(proxy: RunningProxy, count: int, send: bytes = b"") -> Iterator[list[socket.socket]]:
    """``count`` connections that each send ``send`` (nothing more) and stay open."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(_addr(proxy), timeout=10)
            if send:
                with contextlib.suppress(OSError):  # kproxy may have closed it already
                    sock.sendall(send)
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _https_get(proxy: RunningProxy, path: str, token: str) -> tuple[int, float]:
    """One request on a new TLS connection: (status, seconds from connect to answer)."""
    assert proxy.ca_file is not None
    started = time.monotonic()
    ctx = ssl.create_default_context(cafile=str(proxy.ca_file))
    host, port = _addr(proxy)
    with ctx.wrap_socket(socket.create_connection((host, port), timeout=10), server_hostname=host) as sock:
        auth = f"Authorization: Bearer {token}\r\n"
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n".encode())
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while data := sock.recv(65536):
                got += data
    status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else 0
    return status, time.monotonic() - started


def test_unfinished_tls_handshakes_are_bounded_and_closed_at_the_deadline(
    proxy_factory: Callable[..., RunningProxy], kubectl: Kubectl, namespace: str, control_plane: ControlPlaneInfo
) -> None:
    """2,000 connections send half a ClientHello and stop. Without the bound and kproxy's own
    deadline, asyncio keeps each for 60 s (+66 MiB of RSS, 2,000 descriptors)."""
    bound, flood = 200, 2000
    token = control_plane.admin_token
    proxy = proxy_factory(
        credentials="forward",
        tls=True,
        token=token,
        extra={"connections": {"read_header_timeout": "3s", "max_tls_handshakes": bound}},
    )
    control_plane.json(
        "POST", f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "seen"}, "data": {"a": "b"}}
    )
    pid = proxy.proc.pid
    rss0, fds0 = _rss_mib(pid), _fds(pid)
    with _connections(proxy, flood, _HALF_CLIENT_HELLO) as socks:
        started = time.monotonic()
        grown, fds = _rss_mib(pid) - rss0, _fds(pid)
        # A legitimate client is served promptly, through kubectl and a bare TLS request.
        status, took = _https_get(proxy, f"/api/v1/namespaces/{namespace}/configmaps", token)
        assert status == 200 and took < 2, (status, took)
        out = kubectl(["get", "configmaps", "-n", namespace, "-o", "name"], kubeconfig=proxy.kubeconfig, timeout=20)
        assert out.stdout.split() == ["configmap/seen"]
        print(f"{flood} half ClientHellos: RSS +{grown:.1f} MiB, fds {fds0} -> {fds}, GET {took * 1e3:.0f} ms")
        # What the flood holds: the bound's worth of handshakes, not the flood's.
        assert fds - fds0 <= bound + 20, (fds0, fds)
        assert grown < 25, f"kproxy's RSS grew by {grown:.0f} MiB"
        # The rest are closed by the deadline (3 s), not asyncio's (60 s).
        eventually(lambda: all(_closed_by_server(s) for s in socks), 10, "every stuck handshake to be closed")
        assert time.monotonic() - started < 10
    eventually(lambda: _fds(pid) <= fds0 + 5, 5, "kproxy's descriptors to be released")
    assert _metric(proxy, "kproxy_connections_closed_total", reason="max_tls_handshakes") >= flood - bound
    assert _metric(proxy, "kproxy_connections_closed_total", reason="tls_handshake_timeout") >= 1
    assert _metric(proxy, "kproxy_client_connections", state="tls_handshake") == 0


def test_idle_kept_alive_connections_are_bounded_oldest_closed_first(
    proxy_factory: Callable[..., RunningProxy], namespace: str
) -> None:
    """150 clients each make one request and keep their connection; at most 50 stay idle, and
    the ones idle longest are the ones closed (the idle deadline, 90 s, plays no part here)."""
    bound, flood = 50, 150
    proxy = proxy_factory(extra={"connections": {"max_idle_connections": bound}})
    with _connections(proxy, flood) as socks:
        for sock in socks:
            sock.sendall(b"GET /version HTTP/1.1\r\nHost: localhost\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                data = sock.recv(65536)
                assert data, "closed before the response"
                head += data
            assert head.startswith(b"HTTP/1.1 200"), head
        eventually(lambda: all(_closed_by_server(s) for s in socks[: flood - bound]), 5, "the oldest idle to be closed")
        assert not any(_closed_by_server(s) for s in socks[flood - bound :])
        assert _metric(proxy, "kproxy_client_connections", state="idle") == bound
        assert _metric(proxy, "kproxy_connections_closed_total", reason="max_idle_connections") == flood - bound
        # A new client is served, and its connection, idle after, closes the oldest one left.
        status, body = proxy.get(f"/api/v1/namespaces/{namespace}/configmaps")
        assert status == 200 and b"ConfigMapList" in body
        eventually(lambda: _closed_by_server(socks[flood - bound]), 5, "the next oldest to be closed")


def test_connections_stay_below_the_descriptor_limit_and_a_flood_leaves_room_for_others(
    proxy_factory: Callable[..., RunningProxy], kubectl: Kubectl, namespace: str, control_plane: ControlPlaneInfo
) -> None:
    """kproxy's descriptor limit lowered to 256 (read again at a reload): 600 connections that
    send nothing would take every descriptor, after which kproxy accepts nobody and cannot open
    an upstream connection. With the bound (256 - 64 reserved, halved for upstream connections:
    96 client connections), each new client takes the place of the connection that has waited
    longest, and every legitimate request reaches the apiserver."""
    proxy = proxy_factory(extra={"reload_interval": "200ms"})
    pid = proxy.proc.pid
    subprocess.run(["prlimit", f"--pid={pid}", "--nofile=256:256"], check=True)
    proxy.write_config({"connections": {"max_unfinished_heads": 4096}})  # a reload reads the limit again
    eventually(
        lambda: _metric(proxy, "kproxy_config_reloads_total", result="success") >= 1, 10, "the config to be reloaded"
    )
    with _connections(proxy, 600, b"GET /version HTTP/1.1\r\n") as socks:
        fds = _fds(pid)
        assert fds < 256, fds
        statuses: list[int | str] = []
        started = time.monotonic()
        for i in range(10):
            body = f'{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"fd-{i}"}}}}'
            conn = http.client.HTTPConnection(*_addr(proxy), timeout=5)
            try:
                path = f"/api/v1/namespaces/{namespace}/configmaps"
                conn.request("POST", path, body, {"Content-Type": "application/json"})
                statuses.append(conn.getresponse().status)
            except OSError as err:  # refused, reset, timed out: what a flood does without the bound
                statuses.append(repr(err))
            finally:
                conn.close()
        took = (time.monotonic() - started) / 10
        print(f"600 silent connections, limit 256: fds {fds}, creates {statuses}, {took * 1e3:.0f} ms each")
        assert statuses == [201] * 10, statuses
        out = kubectl(["get", "configmaps", "-n", namespace, "-o", "name"], kubeconfig=proxy.kubeconfig, timeout=20)
        assert "configmap/fd-9" in out.stdout
        code, _ = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/fd-9")
        assert code == 200  # persisted at the apiserver
        assert _fds(pid) < 256
        assert sum(_closed_by_server(s) for s in socks) >= 600 - 96
        assert _metric(proxy, "kproxy_open_fds_limit") == 256
        assert _metric(proxy, "kproxy_max_client_connections") == 96
        assert _metric(proxy, "kproxy_open_connections") <= 96
    assert "Too many open files" not in proxy.log_text()


def test_connections_from_one_source_are_bounded_and_others_are_served(
    proxy_factory: Callable[..., RunningProxy], namespace: str
) -> None:
    """``max_connections_per_source``: one address (127.0.0.2 here) holding its share cannot
    open more, each refused at once, while another address (127.0.0.1) is served."""
    proxy = proxy_factory(extra={"connections": {"max_connections_per_source": 20}})
    socks: list[socket.socket] = []
    try:
        for _ in range(40):
            sock = socket.create_connection(_addr(proxy), timeout=10, source_address=("127.0.0.2", 0))
            socks.append(sock)
        eventually(lambda: sum(_closed_by_server(s) for s in socks) == 20, 5, "the 20 over the bound to be closed")
        assert not any(_closed_by_server(s) for s in socks[:20])
        status, body = proxy.get(f"/api/v1/namespaces/{namespace}/configmaps")
        assert status == 200 and b"ConfigMapList" in body
        assert _metric(proxy, "kproxy_connections_closed_total", reason="max_connections_per_source") == 20
    finally:
        for sock in socks:
            sock.close()


def test_a_flood_of_the_admin_listener_stays_within_its_share(proxy_factory: Callable[..., RunningProxy]) -> None:
    """The admin listener (probes, /metrics) has bounds of its own, taken from the descriptors
    kept out of the main listener's bound: 600 silent connections to it (limit 2,048: a quarter
    of the 256 reserved, 64 connections) neither take kproxy's descriptors nor stop the probes."""
    proxy = proxy_factory()
    pid = proxy.proc.pid
    subprocess.run(["prlimit", f"--pid={pid}", "--nofile=2048:2048"], check=True)
    proxy.write_config({"reload_interval": "200ms"})  # a reload reads the limit again
    eventually(
        lambda: _metric(proxy, "kproxy_config_reloads_total", result="success") >= 1, 15, "the config to be reloaded"
    )
    host, port = proxy.admin_url.split("://")[1].rsplit(":", 1)
    socks: list[socket.socket] = []
    try:
        for _ in range(600):
            socks.append(socket.create_connection((host, int(port)), timeout=10))
        status, _ = proxy.get("/readyz", admin=True)
        assert status == 200
        fds = _fds(pid)
        assert fds < 64 + 40, fds
        eventually(lambda: sum(_closed_by_server(s) for s in socks) >= 600 - 64, 5, "the admin flood to be bounded")
        assert proxy.get("/version")[0] == 200
        assert _metric(proxy, "kproxy_open_fds_limit") == 2048
    finally:
        for sock in socks:
            sock.close()
