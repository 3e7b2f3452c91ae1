"""Watches served from the cache: how they end, what they count, and compression around them.

* SIGTERM: every open watch the cache serves ends with a clean end of stream (the chunked
  terminator), so clients reconnect elsewhere, and the process exits 0.
* Metrics: open watches, events in, deliveries, writes, the delivery latency histogram.
* A WebSocket watch is passed through (the apiserver's framing: one event per message).
* The ``compression`` filter with ``watch: true`` in front of the cache compresses its watch
  streams, and the events arrive as they happen, decodable as they come; watchers in step get
  the same compressed bytes (one compressor for all of them).
"""

from __future__ import annotations

import json
import selectors
import signal
import socket
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator

import aiohttp
import pytest
from test_watchcache_outage import metric
from watchstream import Inflater, open_raw, read_head, split_chunks

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

CACHED = {"filters": [{"name": "watchcache", "resources": ["configmaps"]}]}


def _configmap(cp: ControlPlaneInfo, namespace: str, name: str, value: str) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}})
    status, _ = cp.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=body.encode())
    assert status == 201


def _cache_watches(rp: RunningProxy) -> float:
    return metric(rp, "kproxy_watchcache_reads_total", resource="configmaps", verb="watch", served="cache")


def _ready(rp: RunningProxy) -> None:
    """Until the configmaps cache has its first list (before that, kproxy passes requests on)."""
    eventually(lambda: rp.get("/readyz", admin=True)[0] == 200, 30, "kproxy to be ready")

    def cached() -> bool:
        rp.get("/api/v1/configmaps?resourceVersion=0&limit=1")
        return metric(rp, "kproxy_watchcache_reads_total", resource="configmaps", verb="list", served="cache") > 0

    eventually(cached, 30, "the configmaps cache to answer a list", interval=0.2)


def test_sigterm_ends_cached_watches_cleanly(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    rp = proxy_factory(extra=CACHED)
    _ready(rp)
    base = f"/api/v1/namespaces/{namespace}/configmaps?watch=1"
    watches = [
        open_raw(rp, base, "Accept: application/json"),
        open_raw(rp, base + "&allowWatchBookmarks=true", "Accept: application/vnd.kubernetes.protobuf"),
        open_raw(rp, "/api/v1/configmaps?watch=1&resourceVersion=0", "Accept: application/json"),
    ]
    for sock in watches:
        head, _ = read_head(sock)
        assert head.startswith(b"HTTP/1.1 200"), head
    eventually(lambda: _cache_watches(rp) == 3, 20, "the three watches to be served from the cache")
    eventually(lambda: metric(rp, "kproxy_watchcache_watches", resource="configmaps") == 3, 20, "three open watches")
    rp.proc.send_signal(signal.SIGTERM)
    # All three read at once, as their clients would: the cluster-wide watch's initial events may
    # be megabytes (every configmap the run made), and one left unread while another is drained is
    # a client that stopped reading, which kproxy closes as a slow watcher (no end of stream).
    tails = {sock: b"" for sock in watches}
    with selectors.DefaultSelector() as sel:
        for sock in watches:
            sel.register(sock, selectors.EVENT_READ)
        while tails:
            ready = sel.select(timeout=30)
            assert ready, f"{len(tails)} watch(es) neither ended nor sent anything for 30 s after SIGTERM"
            for key, _ in ready:
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                data = sock.recv(65536)
                assert data, f"watch closed without a clean end of stream: {tails[sock][-50:]!r}"
                tails[sock] = (tails[sock] + data)[-64:]
                if tails[sock].endswith(b"0\r\n\r\n"):
                    sel.unregister(sock)
                    sock.close()
                    del tails[sock]
    assert rp.proc.wait(30) == 0


def _queued(server_port: int, client_port: int) -> int:
    """Bytes of one loopback connection held by the kernel: what kproxy's socket has not sent
    yet and what the client's has not read (``/proc/net/tcp``: tx_queue, rx_queue)."""
    total = 0
    with open("/proc/net/tcp") as table:
        lines = table.read().splitlines()[1:]
    for line in lines:
        fields = line.split()
        local, remote, queues = int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16), fields[4]
        tx, rx = (int(q, 16) for q in queues.split(":"))
        if (local, remote) == (server_port, client_port):
            total += tx
        elif (local, remote) == (client_port, server_port):
            total += rx
    return total


@pytest.fixture
def dropped_configmaps(control_plane: ControlPlaneInfo, namespace: str) -> Iterator[None]:
    """The test's ConfigMaps are deleted after it: megabytes left in the session's cluster (which
    has no namespace controller) would slow every later test that lists or caches ConfigMaps."""
    yield
    control_plane.request("DELETE", f"/api/v1/namespaces/{namespace}/configmaps")


@pytest.mark.usefixtures("dropped_configmaps")
def test_sigterm_ends_a_watch_behind_on_its_initial_events_cleanly(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    """A watch whose client is megabytes behind on its initial events when SIGTERM arrives ends
    after whole events with the end of the chunked stream, which its client gets however long
    it takes to read what came before (within the drain deadline); kproxy neither closes the
    connection before, nor ends the watch as a slow one. (kproxy used to cut such a stream
    short: ending the watch cancelled its initial events' wait for the connection, which
    cancelled the end of stream waiting on the same connection; connections were closed 1 s
    into shutdown with bytes unsent; and a joined initial body could end mid-event.)"""
    value = "v" * (256 << 10)
    names = {f"big-{i}" for i in range(32)}  # 8 MiB of initial events: more than both kernels hold
    for name in names:
        _configmap(control_plane, namespace, name, value)
    rp = proxy_factory(extra=CACHED)
    _ready(rp)
    port = int(rp.url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # a client that takes little at a time
    sock.connect(("127.0.0.1", port))
    sock.settimeout(30)
    sock.sendall(f"GET /api/v1/namespaces/{namespace}/configmaps?watch=1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head, buf = read_head(sock)
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower(), head
    eventually(lambda: _cache_watches(rp) == 1, 20, "the watch to be served from the cache")
    # The client reads nothing: kproxy writes until both kernels' buffers are full, then waits
    # for the connection with the rest of the initial events unsent.
    client_port = sock.getsockname()[1]
    seen: list[int] = []

    def blocked() -> bool:
        seen.append(_queued(port, client_port))
        return len(seen) >= 4 and seen[-1] > (1 << 20) and len(set(seen[-4:])) == 1

    eventually(blocked, 30, "kproxy to wait on the client with initial events unsent", interval=0.2)
    rp.proc.send_signal(signal.SIGTERM)
    # Past aiohttp's own 1 s, kproxy still waits for this client to take the end of its watch.
    with pytest.raises(subprocess.TimeoutExpired):
        rp.proc.wait(3)
    while data := sock.recv(1 << 20):
        buf += data
    sock.close()
    chunks, rest = split_chunks(buf)
    assert chunks and chunks[-1] == b"" and rest == b"", f"no clean end of stream: {buf[-60:]!r}"
    assert b"" not in chunks[:-1]
    text = b"".join(chunks)
    assert text.endswith(b"\n"), "the last event is cut short"
    events = [json.loads(line) for line in text.splitlines()]
    assert events and {e["type"] for e in events} == {"ADDED"}
    assert all(e["object"]["metadata"]["name"] in names and e["object"]["data"]["v"] == value for e in events)
    assert len({e["object"]["metadata"]["name"] for e in events}) == len(events)
    assert rp.proc.wait(30) == 0
    assert "unresponsiveness" not in rp.log_text()


def test_watch_metrics_count_events_deliveries_and_latency(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    rp = proxy_factory(extra=CACHED)
    _ready(rp)
    watchers = [
        open_raw(rp, f"/api/v1/namespaces/{namespace}/configmaps?watch=1&resourceVersion=0", "Accept: application/json")
        for _ in range(5)
    ]
    for sock in watchers:
        read_head(sock)
    eventually(lambda: metric(rp, "kproxy_watchcache_watches", resource="configmaps") == 5, 20, "five watches")
    events0 = metric(rp, "kproxy_watchcache_events_total", resource="configmaps")
    deliveries0 = metric(rp, "kproxy_watchcache_deliveries_total", resource="configmaps")
    for i in range(4):
        _configmap(control_plane, namespace, f"m{i}", str(i))
    for sock in watchers:
        got = b""
        while got.count(b'"type":"ADDED"') < 4:
            data = sock.recv(65536)
            assert data, got[-200:]
            got += data
    eventually(
        lambda: metric(rp, "kproxy_watchcache_deliveries_total", resource="configmaps") >= deliveries0 + 20,
        10,
        "20 deliveries (4 events x 5 watchers)",
    )
    assert metric(rp, "kproxy_watchcache_events_total", resource="configmaps") >= events0 + 4
    writes = metric(rp, "kproxy_watchcache_watch_writes_total", resource="configmaps")
    assert 0 < writes <= metric(rp, "kproxy_watchcache_deliveries_total", resource="configmaps")
    assert metric(rp, "kproxy_watchcache_delivery_latency_seconds_count", resource="configmaps") >= 4
    for sock in watchers:
        sock.close()
    # Clients that went away are noticed (the bookmark tick checks every second).
    eventually(lambda: metric(rp, "kproxy_watchcache_watches", resource="configmaps") == 0, 20, "watches closed")


def test_compression_filter_compresses_cached_watches_event_by_event(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    rp = proxy_factory(extra={"filters": [{"name": "compression", "watch": True}, *CACHED["filters"]]})
    _ready(rp)
    sock = open_raw(
        rp,
        f"/api/v1/namespaces/{namespace}/configmaps?watch=1&resourceVersion=0",
        "Accept: application/json",
        "Accept-Encoding: gzip",
    )
    head, rest = read_head(sock)
    assert head.startswith(b"HTTP/1.1 200") and b"content-encoding: gzip" in head.lower(), head
    eventually(lambda: _cache_watches(rp) == 1, 20, "the watch to be served from the cache")
    inflate = zlib.decompressobj(wbits=31)
    text = b""
    buf = rest
    for i in range(3):
        _configmap(control_plane, namespace, f"z{i}", str(i))
        # Each event is readable as soon as it is sent: the stream is flushed per batch of events.
        while text.count(b"\n") < i + 1:
            chunks, buf = split_chunks(buf)
            for c in chunks:
                text += inflate.decompress(c)
            if text.count(b"\n") >= i + 1:
                break
            data = sock.recv(65536)
            assert data, text
            buf += data
    events = [json.loads(line) for line in text.splitlines()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "z0"),
        ("ADDED", "z1"),
        ("ADDED", "z2"),
    ]
    sock.close()


class _CompressedWatch:
    """A raw watch with ``Accept-Encoding``: its chunks as they come and their decoded text
    (several zstd frames or gzip members in a row)."""

    def __init__(self, rp: RunningProxy, path: str, coding: str) -> None:
        self.sock = open_raw(rp, path, "Accept: application/json", f"Accept-Encoding: {coding}")
        head, self.buf = read_head(self.sock)
        assert head.startswith(b"HTTP/1.1 200") and f"content-encoding: {coding}".encode() in head.lower(), head
        self.inflater = Inflater(coding)
        self.text = b""

    def until(self, marker: bytes) -> bytes:
        """The chunk bytes received until ``marker`` is in the decoded text."""
        got = b""
        while marker not in self.text:
            chunks, self.buf = split_chunks(self.buf)
            for c in chunks:
                got += c
                self.text += self.inflater.feed(c)
            if marker in self.text:
                break
            data = self.sock.recv(65536)
            assert data, self.text[-200:]
            self.buf += data
        return got


@pytest.mark.parametrize("coding", ["zstd", "gzip"])
def test_cached_watches_in_step_get_the_same_compressed_bytes(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str, coding: str
) -> None:
    """Watchers in step share one compressor: the same bytes on every connection. One that starts
    later gets frames of its own, then joins the shared stream when it starts a new frame."""
    rp = proxy_factory(extra={"filters": [{"name": "compression", "watch": True}, *CACHED["filters"]]})
    _ready(rp)
    path = f"/api/v1/namespaces/{namespace}/configmaps?watch=1"
    status, listed = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/configmaps")
    assert status == 200
    rv = json.loads(listed)["metadata"]["resourceVersion"]
    watches = [_CompressedWatch(rp, f"{path}&resourceVersion={rv}", coding) for _ in range(3)]
    eventually(lambda: _cache_watches(rp) == 3, 20, "the watches to be served from the cache")
    for i in range(3):
        _configmap(control_plane, namespace, f"s{i}", str(i))
        got = [w.until(f'"name":"s{i}"'.encode()) for w in watches]
        assert got[0] == got[1] == got[2], f"write {i}: the watchers in step got different bytes"
    late = _CompressedWatch(rp, path, coding)  # unset resourceVersion: the current state first
    eventually(lambda: _cache_watches(rp) == 4, 20, "the late watch to be served from the cache")
    late.until(b'"name":"s2"')
    joined = False
    deadline = time.monotonic() + 20
    i = 2
    while time.monotonic() < deadline:  # one write after another until it has joined (about a second)
        i += 1
        _configmap(control_plane, namespace, f"s{i}", str(i))
        got = [w.until(f'"name":"s{i}"'.encode()) for w in (*watches, late)]
        assert got[0] == got[1] == got[2]
        if got[3] == got[0]:
            joined = True
            break
    assert joined, "the late watcher never joined the shared stream"
    for w in (*watches, late):
        events = [json.loads(line) for line in w.text.splitlines()]
        names = [e["object"]["metadata"]["name"] for e in events]
        assert names == [f"s{k}" for k in range(i + 1)] and {e["type"] for e in events} == {"ADDED"}
        w.sock.close()


async def test_websocket_watch_passes_through_to_the_apiserver(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    """A WebSocket watch (one event per message) is the apiserver's to serve: kproxy splices it."""
    rp = proxy_factory(extra=CACHED)
    _ready(rp)
    url = rp.url.replace("http://", "ws://") + f"/api/v1/namespaces/{namespace}/configmaps?watch=1&resourceVersion=0"
    async with aiohttp.ClientSession() as session, session.ws_connect(url, origin="http://localhost") as ws:
        _configmap(control_plane, namespace, "w0", "0")
        msg = await ws.receive(timeout=20)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        event = json.loads(msg.data)
        assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "w0")
    passed = metric(rp, "kproxy_watchcache_reads_total", resource="configmaps", verb="watch", reason="websocket")
    assert passed == 1
