"""A write's own event reaches a watch served from the cache no later than the write's answer.

The controllers check that their informer has seen their own last write before they act again
(kube-controller-manager's ``consistency.go``: ``read version: N is not as new as written version:
M``). Directly, the apiserver's event mostly reaches the watch before the write's answer reaches the
writer. Through kproxy, whether it did depended on kproxy's loop: on a loaded machine (load ~15 on
2 cores) the event came after the answer for 19 and 25 of 40 writes, on an idle one for none. Now
the answer to a write of a cached resource waits until the cache has written the event to its
watchers (``kproxy/filters/watchcache/writes.py``), so the bound is exact whatever the load: when a
client has the answer, the event is already in its watch connection (loopback TCP: what kproxy
wrote first is in the client's socket first). Measured both ways, writing and watching through
kproxy and straight at the apiserver: how many events were on the watch when the answer arrived,
and write-to-event latency (printed with ``-s``). The controller-manager's own count is in
``tests/e2e/living/test_read_after_write.py``.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import ssl
import statistics
import time
from typing import Any

from watchstream import split_chunks

from kproxy.localcluster.envtest import ControlPlaneInfo

WRITES = 40


class Watch:
    """A JSON watch over a raw (TLS or plain) socket; ``poll`` takes what is there without waiting."""

    def __init__(self, sock: socket.socket, path: str, headers: dict[str, str]) -> None:
        self.sock = sock
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n{extra}\r\n".encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            assert data, buf
            buf += data
        head, _, self._wire = buf.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        self._lines = b""
        self.seen: dict[int, float] = {}  # resource version -> when it arrived
        sock.setblocking(False)
        self._absorb()

    def _absorb(self) -> None:
        chunks, self._wire = split_chunks(self._wire)
        now = time.monotonic()
        self._lines += b"".join(chunks)
        *lines, self._lines = self._lines.split(b"\n")
        for line in lines:
            ev = json.loads(line)
            assert ev["type"] in ("ADDED", "MODIFIED", "BOOKMARK"), ev
            self.seen[int(ev["object"]["metadata"]["resourceVersion"])] = now

    def poll(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError):
                break
            assert data, "the watch ended"
            self._wire += data
        self._absorb()

    def wait_for(self, rv: int, timeout: float = 10.0) -> float:
        deadline = time.monotonic() + timeout
        while rv not in self.seen:
            assert time.monotonic() < deadline, f"no event at {rv}"
            select.select([self.sock], [], [], 0.05)
            self.poll()
        return self.seen[rv]


def _run(connect: Any, headers: dict[str, str], ns: str, name: str, rv: int) -> tuple[int, list[float], list[float]]:
    """WRITES patches of the config map and one watch of it, both over ``connect()``; (events on
    the watch when their write's answer arrived, write-to-event ms, answer-to-event ms)."""
    base = f"/api/v1/namespaces/{ns}/configmaps"
    w = Watch(connect(), f"{base}?watch=1&resourceVersion={rv}&fieldSelector=metadata.name%3D{name}", headers)
    conn = http.client.HTTPConnection("x")
    conn.sock = connect()
    early, latency, after = 0, [], []
    for i in range(WRITES):
        body = json.dumps({"data": {"i": str(i)}}).encode()
        start = time.monotonic()
        conn.request("PATCH", f"{base}/{name}", body, {**headers, "Content-Type": "application/merge-patch+json"})
        resp = conn.getresponse()
        data = resp.read()
        answered = time.monotonic()
        assert resp.status == 200, data
        written = int(json.loads(data)["metadata"]["resourceVersion"])
        w.poll()
        early += written in w.seen
        arrived = w.wait_for(written)
        latency.append((arrived - start) * 1000)
        after.append((arrived - answered) * 1000)
    conn.close()
    w.sock.close()
    return early, latency, after


def test_own_write_event_reaches_a_cached_watch_before_the_answer(
    control_plane: ControlPlaneInfo, proxy_factory: Any, namespace: str
) -> None:
    rp = proxy_factory(extra={"filters": [{"name": "watchcache", "resources": ["configmaps"]}]})
    rp.wait_cached(f"/api/v1/namespaces/{namespace}/configmaps", "configmaps")  # else the watch goes upstream
    code, body = control_plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        body=json.dumps({"metadata": {"name": "order"}, "data": {}}).encode(),
    )
    assert code == 201, body
    rv = int(json.loads(body)["metadata"]["resourceVersion"])
    host, port = rp.url.removeprefix("http://").split(":")

    def via_proxy() -> socket.socket:
        return socket.create_connection((host, int(port)), timeout=10)

    ctx = control_plane.ssl_context(client_cert=False)

    def direct() -> socket.socket:
        raw = socket.create_connection(("127.0.0.1", control_plane.apiserver_port), timeout=10)
        return ctx.wrap_socket(raw, server_hostname="127.0.0.1")

    token = {"Authorization": f"Bearer {control_plane.admin_token}"}
    p_early, p_latency, p_after = _run(via_proxy, {}, namespace, "order", rv)
    d_early, d_latency, d_after = _run(direct, token, namespace, "order", rv)

    served = [
        line
        for line in rp.metrics().splitlines()
        if line.startswith("kproxy_watchcache_reads_total{") and 'verb="watch"' in line and 'served="cache"' in line
    ]
    assert served, "the watch was not served from the cache"
    waited = [
        line for line in rp.metrics().splitlines() if line.startswith("kproxy_watchcache_write_wait_seconds_count{")
    ]
    print(
        f"\nwrite -> own event, {WRITES} writes: through kproxy's cache {p_early} on the watch with the answer, "
        f"latency median {statistics.median(p_latency):.1f} ms, max {max(p_latency):.1f} ms; directly {d_early} "
        f"with the answer, latency median {statistics.median(d_latency):.1f} ms, max {max(d_latency):.1f} ms, "
        f"event after the answer by up to {max(d_after):.1f} ms\n" + "\n".join(waited)
    )
    # The bound: every event was on the watch when its answer arrived (none after it).
    assert p_early == WRITES, (p_early, p_after)
    assert 'outcome="delivered"' in "".join(waited) and 'outcome="timeout"' not in "".join(
        line for line in waited if not line.endswith(" 0.0")
    ), waited
