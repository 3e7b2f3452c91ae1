"""A watcher that stops reading is closed by kproxy without stalling the others: a bounded
buffer per watcher and a dispatch time budget, after which a slow watcher is closed.

The slow client is a raw socket with a tiny receive buffer that reads the response head and then
nothing; a writer makes large pod updates until kproxy's buffers for it are full. kproxy closes it
(``kproxy_watchcache_slow_watchers_closed_total`` grows, the socket sees its stream end) while a
normal watcher of the same pods, through the same kproxy, receives every update in time.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from test_watchcache_outage import Writer, metric, served_watches

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

#: A pod annotation this big makes every event ~200 KB: a few MB of events fill any socket buffers.
BIG = "x" * 200_000
#: Generous: the normal watcher may wait out the slow one's time budget, never much more.
MAX_LATENCY = 5.0


class SlowWatch:
    """An HTTP/1.1 watch on a raw socket that reads the response head, then stops reading."""

    def __init__(self, url: str, path: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
        self.sock.settimeout(30)
        self.sock.connect((parts.hostname, parts.port))
        request = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: application/json\r\n\r\n"
        self.sock.sendall(request.encode())
        self.buf = bytearray()
        while b"\r\n\r\n" not in self.buf:
            data = self.sock.recv(4096)
            assert data, f"kproxy closed the slow watch before answering: {self.buf!r}"
            self.buf += data
        self.head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        self.parsed = 0  # where the next chunk's size line starts in buf
        assert self.head.startswith(b"HTTP/1.1 200"), self.head
        assert b"transfer-encoding: chunked" in self.head.lower(), self.head

    def read_to_end(self, timeout: float) -> str:
        """Read everything kproxy sent, up to the end of the stream; how it ended."""
        deadline = time.monotonic() + timeout
        while True:
            if self._terminal_chunk():
                return "terminal chunk"
            self.sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 20)
            except ConnectionResetError:
                return "reset"
            except TimeoutError:
                raise AssertionError(f"the slow watch did not end within {timeout}s") from None
            if not data:
                return "eof"
            self.buf += data

    def _terminal_chunk(self) -> bool:
        """Whether the chunked body read so far is complete (its last chunk has size 0)."""
        while True:
            end = self.buf.find(b"\r\n", self.parsed)
            if end < 0:
                return False
            size = int(self.buf[self.parsed : end].split(b";")[0], 16)
            if size == 0:
                return self.buf.find(b"\r\n", end + 2) >= 0
            if end + 2 + size + 2 > len(self.buf):
                return False
            self.parsed = end + 2 + size + 2

    def close(self) -> None:
        self.sock.close()


class FastWatch:
    """A normal watcher: reads every event as it comes and notes when each resource version arrived."""

    def __init__(self, url: str, path: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: application/json\r\n\r\n".encode())
        self.file = self.sock.makefile("rb")
        self.status = self.file.readline()
        while self.file.readline() not in (b"\r\n", b""):
            pass
        self.arrived: dict[str, float] = {}
        self.types: list[str] = []
        self.ended = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        pending = b""
        try:
            while True:
                size = int(self.file.readline().split(b";")[0], 16)
                if size == 0:
                    break
                pending += self.file.read(size)
                self.file.read(2)
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    event = json.loads(line)
                    self.types.append(event["type"])
                    self.arrived[event["object"]["metadata"]["resourceVersion"]] = time.monotonic()
        except (OSError, ValueError):
            pass
        self.ended = True

    def close(self) -> None:
        self.sock.close()


def test_slow_watcher_closed_without_stalling_others(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    cp = control_plane
    writer = Writer(cp, namespace)
    writer.create("big")
    rp = proxy_factory(extra={"filters": [{"name": "watchcache", "resources": ["pods"], "watch_buffer": 10}]})
    base = f"/api/v1/namespaces/{namespace}/pods"
    eventually(lambda: rp.get(base)[0] == 200, 60, "the pods cache to be ready")
    rv = json.loads(rp.get(base)[1])["metadata"]["resourceVersion"]

    watch = f"{base}?watch=true&resourceVersion={rv}"
    slow = SlowWatch(rp.url, watch)
    fast = FastWatch(rp.url, watch)
    try:
        assert fast.status.startswith(b"HTTP/1.1 200"), fast.status
        eventually(lambda: served_watches(rp) >= 2, 30, "kproxy to serve both watches from its cache")

        def closed() -> float:
            return metric(rp, "kproxy_watchcache_slow_watchers_closed_total", resource="pods")

        written: dict[str, float] = {}
        for i in range(300):  # ~60 MB at most; kproxy gives up on the slow watcher long before
            patch = {"metadata": {"labels": {"i": str(i)}, "annotations": {"big": BIG}}}
            status, body = cp.request(
                "PATCH", f"{base}/big", body=json.dumps(patch).encode(), content_type="application/merge-patch+json"
            )
            assert status == 200, body
            written[json.loads(body)["metadata"]["resourceVersion"]] = time.monotonic()
            if i >= 20 and i % 5 == 0 and closed() >= 1:
                break
        else:
            raise AssertionError("kproxy never closed the watcher that stopped reading")

        # The normal watcher got every update, each promptly, while the slow one was being given up on.
        eventually(lambda: written.keys() <= fast.arrived.keys(), 30, "the normal watcher to receive every update")
        late = {rv: fast.arrived[rv] - t for rv, t in written.items() if fast.arrived[rv] - t > MAX_LATENCY}
        assert not late, f"updates reached the normal watcher late (s): {late}"
        assert not fast.ended, "kproxy closed the normal watcher too"
        assert set(fast.types) == {"MODIFIED"}, set(fast.types)
        assert closed() == 1, "only the slow watcher was closed"

        how = slow.read_to_end(60)
        assert how in ("terminal chunk", "eof", "reset"), how
    finally:
        slow.close()
        fast.close()
