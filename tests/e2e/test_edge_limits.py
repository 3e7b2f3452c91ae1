"""Deadlines and bounds on client connections, against a real `kproxy run` (kproxy/server/connections.py).

Go's server in front of the apiserver closes, without a word, a connection that has not sent a
whole request head within ReadHeaderTimeout (32 s there) or a kept-alive one that sent nothing for
IdleTimeout (90 s); requests being served have no deadline. kproxy keeps the same deadlines (set
short here) and also bounds what unfinished heads hold all together, closing the connection that
has been reading its head the longest. Each test waits on the socket's end of file, not on a clock.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

MiB = 1 << 20


def _connect(proxy: RunningProxy, timeout: float = 10) -> socket.socket:
    host, port = proxy.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    return sock


def _until_eof(sock: socket.socket) -> tuple[float, bytes]:
    """Read until the server closes; (seconds it took, what it sent)."""
    started = time.monotonic()
    got = b""
    with contextlib.suppress(ConnectionResetError):
        while data := sock.recv(65536):
            got += data
    return time.monotonic() - started, got


def _is_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def _response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One response with a Content-Length: (head, body)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        assert data, buf
        buf += data
    head, _, body = buf.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        data = sock.recv(65536)
        assert data
        body += data
    return head, body


def _metric(proxy: RunningProxy, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(proxy.metrics()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"{name}{labels} not in /metrics")


def _counted(proxy: RunningProxy, name: str, **labels: str) -> float:
    """A counter's value, 0 while it has no such series yet."""
    try:
        return _metric(proxy, name, **labels)
    except AssertionError:
        return 0


def _closed(proxy: RunningProxy, reason: str) -> float:
    return _counted(proxy, "kproxy_connections_closed_total", reason=reason)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def short(proxy_factory: Callable[..., RunningProxy]) -> RunningProxy:
    """kproxy with a 1 s read-header deadline and a 2 s idle deadline."""
    return proxy_factory(extra={"connections": {"read_header_timeout": "1s", "idle_timeout": "2s"}})


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /version HTTP/1.1\r\nHost: localhost\r\nX-Half: "],
    ids=["silent", "half-sent-head"],
)
def test_unfinished_head_is_closed_at_the_read_header_deadline(short: RunningProxy, sent: bytes) -> None:
    sock = _connect(short, timeout=10)  # without the deadline, recv times out and the test fails
    sock.sendall(sent)
    took, got = _until_eof(sock)
    assert got == b""  # Go writes nothing when the deadline passes: it closes
    assert 0.9 <= took < 4, took
    eventually(lambda: _closed(short, "read_header_timeout") >= 1, 5, "the close to be counted")


def test_kept_alive_connection_is_closed_at_the_idle_deadline(short: RunningProxy) -> None:
    sock = _connect(short)
    sock.sendall(b"GET /version HTTP/1.1\r\nHost: localhost\r\n\r\n")
    head, _ = _response(sock)
    assert head.startswith(b"HTTP/1.1 200")
    took, got = _until_eof(sock)
    assert got == b""
    assert 1.8 <= took < 5, took  # the idle deadline (2 s), not the read-header one (1 s)
    eventually(lambda: _closed(short, "idle_timeout") >= 1, 5, "the close to be counted")


def test_next_head_begun_on_a_kept_alive_connection_has_the_read_header_deadline(short: RunningProxy) -> None:
    sock = _connect(short)
    sock.sendall(b"GET /version HTTP/1.1\r\nHost: localhost\r\n\r\nGET /ver")  # the next one's first bytes
    head, _ = _response(sock)
    assert head.startswith(b"HTTP/1.1 200")
    took, got = _until_eof(sock)
    assert got == b""
    assert 0.8 <= took < 1.8, took  # from the response on, as Go's Peek(4) then SetReadDeadline


def test_requests_being_served_have_no_deadline(
    short: RunningProxy, namespace: str, control_plane: ControlPlaneInfo
) -> None:
    """A watch and a slowly sent body both run past the read-header and idle deadlines: the
    watch sees an object created by the slow request, which the apiserver stored."""
    watch = _connect(short, timeout=20)
    watch.sendall(f"GET /api/v1/namespaces/{namespace}/configmaps?watch=1 HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += watch.recv(65536)
    assert buf.startswith(b"HTTP/1.1 200"), buf

    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "slow"}}).encode()
    post = _connect(short, timeout=20)
    post.sendall(
        f"POST /api/v1/namespaces/{namespace}/configmaps HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body[:10]
    )
    # A clock: a silent connection is closed once the read-header deadline (1 s) has passed; three
    # in a row take longer than the idle deadline (2 s) too.
    for _ in range(3):
        took, _ = _until_eof(_connect(short))
        assert took >= 0.9
    post.sendall(body[10:])
    head, answer = _response(post)
    assert head.startswith(b"HTTP/1.1 201"), head + answer
    code, stored = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/slow")
    assert code == 200 and json.loads(stored)["metadata"]["name"] == "slow"

    while b'"name":"slow"' not in buf:
        data = watch.recv(65536)
        assert data, "the watch was closed"
        buf += data
    assert b'"type":"ADDED"' in buf
    assert _closed(short, "read_header_timeout") >= 3
    assert _closed(short, "idle_timeout") == 0


def test_connections_reading_a_head_beyond_the_bound_are_closed_oldest_first(
    proxy_factory: Callable[..., RunningProxy],
) -> None:
    proxy = proxy_factory(extra={"connections": {"max_unfinished_heads": 20}})
    socks = [_connect(proxy) for _ in range(40)]
    try:
        for sock in socks[:20]:
            assert _until_eof(sock)[1] == b""  # without the bound, recv times out
        assert all(_is_open(sock) for sock in socks[20:])
        assert _closed(proxy, "max_unfinished_heads") == 20
        assert _metric(proxy, "kproxy_connections_reading_head") == 20
        # A request still gets through (and closes the oldest waiting connection to do so).
        assert proxy.get("/version")[0] == 200
        eventually(lambda: _closed(proxy, "max_unfinished_heads") == 21, 5, "the oldest to be closed")
        assert _until_eof(socks[20])[1] == b""
        assert all(_is_open(sock) for sock in socks[21:])
    finally:
        for sock in socks:
            sock.close()


def _big_value(size: int) -> bytes:
    return b"GET /version HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * size


def _many_lines(size: int) -> bytes:
    return b"GET /version HTTP/1.1\r\nHost: localhost\r\n" + b"a:b\r\n" * (size // 5)


@contextlib.contextmanager
def _flood(proxy: RunningProxy, count: int, head: bytes) -> Iterator[list[socket.socket]]:
    """``count`` connections, each sending ``head`` (never finished) and staying open."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = _connect(proxy)
            with contextlib.suppress(OSError):  # kproxy may close it while it is still sending
                sock.sendall(head)
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.parametrize(
    ("shape", "count", "size"),
    [(_big_value, 200, MiB), (_many_lines, 60, 300_000)],
    ids=["one-1MiB-header", "60k-header-lines"],
)
def test_memory_held_by_unfinished_heads_is_bounded(
    proxy_factory: Callable[..., RunningProxy], shape: Callable[[int], bytes], count: int, size: int
) -> None:
    """Without the bound, 200 heads of 1 MiB cost kproxy 400 MiB, 60 heads of 60,000 lines
    about 500 MiB (aiohttp's parser holds each line as objects)."""
    budget = 16 * MiB
    proxy = proxy_factory(extra={"connections": {"max_unfinished_head_bytes": budget}})
    pid = proxy.proc.pid
    before = _rss_mib(pid)
    with _flood(proxy, count, shape(size)) as socks:
        # Whichever comes first: the bound bites, or kproxy holds what it would without one.
        eventually(
            lambda: _closed(proxy, "max_unfinished_head_bytes") >= 1 or _rss_mib(pid) - before >= 80,
            20,
            "the bound to bite",
        )
        grown = _rss_mib(pid) - before
        assert grown < 80, f"kproxy's RSS grew by {grown:.0f} MiB"
        held = _metric(proxy, "kproxy_unfinished_head_bytes")
        assert held <= budget
        assert sum(_is_open(s) for s in socks) < count
        status, body = proxy.get("/version")
        assert status == 200 and b"gitVersion" in body
    print(f"{shape.__name__}: {count} x {size} B unfinished heads; RSS +{grown:.0f} MiB, held {held / MiB:.1f} MiB")


def test_a_config_reload_changes_the_deadlines_of_new_connections(
    proxy_factory: Callable[..., RunningProxy],
) -> None:
    proxy = proxy_factory(extra={"reload_interval": "200ms"})
    proxy.write_config({"connections": {"read_header_timeout": "1s"}})
    eventually(
        lambda: _counted(proxy, "kproxy_config_reloads_total", result="success") >= 1, 10, "the config to be reloaded"
    )
    took, got = _until_eof(_connect(proxy))
    assert got == b"" and 0.9 <= took < 4, took


def test_tls_connection_has_the_read_header_deadline_after_its_handshake(
    proxy_factory: Callable[..., RunningProxy],
) -> None:
    proxy = proxy_factory(tls=True, extra={"connections": {"read_header_timeout": "1s"}})
    assert proxy.ca_file is not None
    host, port = proxy.url.removeprefix("https://").split(":")
    ctx = ssl.create_default_context(cafile=str(proxy.ca_file))
    sock = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=host)
    sock.sendall(b"GET /version HTTP/1.1\r\nHost: localhost\r\n")  # never finished
    took, got = _until_eof(sock)
    assert got == b"" and 0.9 <= took < 4, took
