"""A watch kproxy passes through from the apiserver ends after a whole event on a drain or a reload.

The apiserver never ends a watch inside an event; neither does kproxy when it ends one itself
(SIGTERM, or a reload that sends its HTTP/2 clients elsewhere): the event being passed on is
passed on to its end, then the stream ends cleanly (the last chunk of a chunked body, END_STREAM),
a gzip stream with its trailer. client-go then watches again from the last event it got; a torn
event would be an "unexpected EOF" to it.

To land the end inside an event every time, kproxy reaches the apiserver through a relay the test
holds: it lets the first bytes of a large event through, holds the rest until kproxy has been told
to end the watch, then lets it go.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h2.events
import pytest
import yaml
from h2client import H2Client

from kproxy.compress.stream import COALESCE
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually, eventually_async
from kproxy.testing.proxyproc import RunningProxy

PROTOBUF_WATCH = "application/vnd.kubernetes.protobuf;type=watch"
#: The large ConfigMap's value (a ConfigMap holds at most 1 MiB): random, so that its gzip stream
#: is about as long as the event.
VALUE_SIZE = 900 * 1024
#: What the relay lets through once armed before it holds: the event's first part, more than the
#: compression filter gathers before it compresses a part of an event (COALESCE).
LET_THROUGH = COALESCE + 128 * 1024


class HoldingRelay:
    """A TCP relay between kproxy and the apiserver; ``arm(n)``: after ``n`` more bytes from the
    apiserver to kproxy, hold the rest until ``release()``."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self._lock = threading.Lock()
        self._budget: int | None = None
        self.held = threading.Event()
        self.released = threading.Event()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="holding-relay", daemon=True).start()

    def kubeconfig(self, admin: Path, out: Path) -> Path:
        cfg = yaml.safe_load(admin.read_text())
        for cluster in cfg["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        out.write_text(yaml.safe_dump(cfg))
        return out

    def arm(self, n: int) -> None:
        with self._lock:
            self._budget = n

    def release(self) -> None:
        with self._lock:
            self._budget = None
        self.released.set()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            up.settimeout(None)
            with self._lock:
                self._open |= {conn, up}
            threading.Thread(target=self._pump, args=(conn, up, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, conn, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, down: bool) -> None:
        try:
            while data := src.recv(65536):
                if down:
                    with self._lock:
                        budget = self._budget
                        if budget is not None:
                            self._budget = max(0, budget - len(data))
                    if budget is not None and budget < len(data):
                        dst.sendall(data[:budget])
                        data = data[budget:]
                        self.held.set()
                        self.released.wait()
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.release()
        self.server.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def relay(control_plane: ControlPlaneInfo) -> Iterator[HoldingRelay]:
    r = HoldingRelay(control_plane.apiserver_port)
    yield r
    r.close()


# --------------------------------------------------------------------------- clients


class Watch:
    """One watch's raw body as the client got it, and how its stream ended."""

    def __init__(self) -> None:
        self.head: dict[str, str] = {}
        self.status = 0
        self.body = bytearray()
        self.clean_end = False  # the last chunk of a chunked body / END_STREAM
        self.error = ""  # how the stream broke, if it did
        self.ended = asyncio.Event()

    def decoded(self) -> bytes:
        """The body without its content coding; a gzip stream must be complete."""
        data = bytes(self.body)
        if self.head.get("content-encoding") != "gzip":
            return data
        out = b""
        while data:
            d = zlib.decompressobj(wbits=31)
            out += d.decompress(data)
            assert d.eof, f"the gzip stream is cut short ({len(self.body)} bytes)"
            data = d.unused_data
        return out

    def seen(self) -> int:
        """How much of the (decoded) body has come so far."""
        if self.head.get("content-encoding") != "gzip":
            return len(self.body)
        return len(zlib.decompressobj(wbits=31).decompress(bytes(self.body)))


async def _h1_watch(url: str, ca: Path, path: str, headers: dict[str, str], w: Watch) -> None:
    """GET over HTTP/1.1 read with a strict chunked decoder: the body must end with its last chunk."""
    host, port = url.split("//", 1)[1].rstrip("/").split(":")
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["http/1.1"])
    reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx)
    try:
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", *(f"{k}: {v}" for k, v in headers.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        w.status = int(head[0].split()[1])
        w.head = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
        assert w.head.get("transfer-encoding") == "chunked", w.head
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                assert await reader.readexactly(2) == b"\r\n"
                w.clean_end = True
                return
            w.body += await reader.readexactly(size)
            assert await reader.readexactly(2) == b"\r\n"
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError) as err:
        w.error = f"truncated chunked body: {type(err).__name__}"
    finally:
        w.ended.set()
        writer.close()


class _Client(H2Client):
    """The test's HTTP/2 client, noting which streams ended with END_STREAM."""

    ended_clean: set[int]

    def _event(self, ev: h2.events.Event) -> None:
        if isinstance(ev, h2.events.StreamEnded):
            self.ended_clean = getattr(self, "ended_clean", set()) | {ev.stream_id}
        super()._event(ev)


async def _h2_watch(client: _Client, path: str, headers: dict[str, str], w: Watch) -> None:
    sid = client.open("GET", path, [(k.lower(), v) for k, v in headers.items()])
    resp = client.responses[sid]
    await resp.headers_in.wait()
    w.status = resp.status
    w.head = dict(resp.headers)
    w.body = resp.body  # filled as DATA comes
    await resp.ended.wait()
    w.clean_end = sid in getattr(client, "ended_clean", set()) and resp.reset is None
    if not w.clean_end:
        w.error = f"stream reset ({resp.reset})" if resp.reset is not None else "connection closed mid-stream"
    w.ended.set()


# --------------------------------------------------------------------------- checks


def _json_events(data: bytes) -> list[dict[str, Any]]:
    """Newline-delimited events, as encoding/json's Encoder writes them: each line whole."""
    assert data.endswith(b"\n"), f"the stream ends inside an event: ...{data[-80:]!r}"
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


def _proto_frames(data: bytes) -> list[bytes]:
    """Length-prefixed frames (staging/src/k8s.io/apimachinery/pkg/util/framer/framer.go): each whole."""
    frames, pos = [], 0
    while pos < len(data):
        assert len(data) - pos >= 4, "the stream ends inside a frame's length"
        n = int.from_bytes(data[pos : pos + 4], "big")
        assert len(data) - pos - 4 >= n, f"the stream ends inside a frame: {len(data) - pos - 4} of {n} bytes"
        frames.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return frames


def _big_configmap(name: str) -> bytes:
    value = base64.b64encode(os.urandom(VALUE_SIZE * 3 // 4)).decode()
    return json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}}
    ).encode()


# --------------------------------------------------------------------------- the test

CASES = [
    # (client protocol, how kproxy is told to end, protobuf, gzip, kproxy to the apiserver)
    *[("http/1.1", "SIGTERM", pb, gz, "h2") for pb in (False, True) for gz in (False, True)],
    *[("h2", "SIGHUP", pb, gz, "h2") for pb in (False, True) for gz in (False, True)],
    ("h2", "SIGTERM", False, False, "h2"),
    # Over HTTP/1.1 a watch aborted upstream breaks off: its gzip stream would lack its trailer.
    ("http/1.1", "SIGTERM", False, True, "http/1.1"),
    ("h2", "SIGHUP", True, True, "http/1.1"),
    # The transcode filter asks the apiserver for protobuf and sends JSON on.
    ("http/1.1", "SIGTERM", False, False, "h2-protobuf"),
    ("h2", "SIGHUP", False, True, "h2-protobuf"),
]


@pytest.mark.parametrize(
    ("proto", "end", "protobuf", "gzip", "upstream"),
    CASES,
    ids=[
        f"{p}-{e}-{'protobuf' if pb else 'json'}-{'gzip' if gz else 'plain'}-upstream-{u}" for p, e, pb, gz, u in CASES
    ],
)
async def test_a_passed_through_watch_ends_after_the_event_it_was_passing_on(
    control_plane: ControlPlaneInfo,
    proxy_factory: Callable[..., RunningProxy],
    relay: HoldingRelay,
    namespace: str,
    tmp_path: Path,
    proto: str,
    end: str,
    protobuf: bool,
    gzip: bool,
    upstream: str,
) -> None:
    """kproxy is told to end the watch while a large event is half through it (the relay holds
    the rest): the client gets that event whole, then a clean end of stream."""
    filters: list[dict[str, Any]] = [{"name": "compression", "watch": True}] if gzip else []
    if upstream.endswith("-protobuf"):
        filters.append({"name": "transcode", "upstream": "protobuf"})
    rp = proxy_factory(
        credentials="forward",
        tls=True,
        token=control_plane.admin_token,
        upstream_kubeconfig=relay.kubeconfig(control_plane.admin_kubeconfig, tmp_path / "relay.kubeconfig"),
        extra={
            "filters": filters,
            "reload_interval": "0s",
            "shutdown_timeout": "20s",
            "upstream": {"http2": upstream.startswith("h2")},
        },
    )
    headers = {"Authorization": f"Bearer {control_plane.admin_token}"}
    if protobuf:
        headers["Accept"] = PROTOBUF_WATCH
    if gzip:
        headers["Accept-Encoding"] = "gzip"
    path = f"/api/v1/namespaces/{namespace}/configmaps?watch=1&timeoutSeconds=300"
    name = "big-" + os.urandom(3).hex()
    w = Watch()
    client: _Client | None = None
    assert rp.ca_file is not None
    if proto == "h2":
        client = await _Client.connect(rp.url, str(rp.ca_file))
        task = asyncio.create_task(_h2_watch(client, path, headers, w))
    else:
        task = asyncio.create_task(_h1_watch(rp.url, rp.ca_file, path, headers, w))
    try:
        await eventually_async(lambda: w.status != 0, 30, "the watch's answer", 0.02)
        assert w.status == 200, bytes(w.body)[:300]
        started = time.monotonic()
        relay.arm(LET_THROUGH)
        code, out = await asyncio.to_thread(
            control_plane.request, "POST", f"/api/v1/namespaces/{namespace}/configmaps", body=_big_configmap(name)
        )
        assert code == 201, out[:300]
        await eventually_async(relay.held.is_set, 30, "the relay to hold the event", 0.02)
        if upstream.endswith("-protobuf"):  # the event goes on once whole: its first bytes are in kproxy
            await eventually_async(
                lambda: _transcoded_in(rp) > LET_THROUGH // 2, 30, "the event's first bytes in kproxy", 0.02
            )
        else:
            await eventually_async(lambda: w.seen() > 0, 30, "the event's first bytes through kproxy", 0.02)
        assert not w.ended.is_set()

        if end == "SIGTERM":
            rp.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(eventually, lambda: '"draining"' in rp.log_text(), 20, "kproxy draining")
        else:
            assert client is not None
            # A watch younger than client-go's shortest (a second) is ended only once it is that old.
            await asyncio.sleep(max(0.0, started + 1.0 - time.monotonic()))
            rp.write_config({"shutdown_timeout": "30s"})
            rp.proc.send_signal(signal.SIGHUP)
            await asyncio.wait_for(client.goaway_in.wait(), 20)
        relay.release()
        await asyncio.wait_for(w.ended.wait(), 30)
        await task

        data = w.decoded()
        if protobuf:
            frames = _proto_frames(data)
            assert len(frames) == 1 and name.encode() in frames[0]
            assert len(frames[0]) > VALUE_SIZE
        else:
            events = _json_events(data)
            assert [(e["type"], e["object"].get("metadata", {}).get("name")) for e in events] == [("ADDED", name)], [
                e["object"].get("message") for e in events
            ]
            assert len(events[0]["object"]["data"]["v"]) == VALUE_SIZE
        assert w.clean_end, w.error
    finally:
        relay.release()
        if not task.done():
            task.cancel()
        if client is not None:
            await client.close()
        control_plane.request("DELETE", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    code, _ = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    assert code == 404


def _transcoded_in(rp: RunningProxy) -> float:
    found = re.search(r"^kproxy_transcode_input_bytes_total (\S+)$", rp.metrics(), re.M)
    return float(found.group(1)) if found else 0.0
