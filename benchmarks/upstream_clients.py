"""kproxy's two upstream clients in memory: the HTTP/2 client against the HTTP/1.1 pool.

    python -m benchmarks.upstream_clients [--repeat 7] [--quick]

Each client is given an in-memory transport and answers shaped like the apiserver's (its
response headers, a fresh ``audit-id`` each, HPACK with Huffman coding as Go writes it; a LIST as
4 KiB DATA frames or 4 KiB chunks, one per read, as the apiserver writes a list while it encodes
it). No network, no TLS, no other process: what is measured is the Python each client runs per
request, which the end-to-end benchmarks (``benchmarks.http2``, ``benchmarks.http2_upstream``)
cannot separate from the apiserver's and the machine's noise. Per scenario, process CPU µs per
request (the median of ``--repeat`` runs) for each client and their ratio:

- a small GET, 16 in flight at once (answers arriving together);
- a small GET, one at a time;
- the same with the CPU's caches flushed between requests (32 MiB touched), as happens when kproxy
  waits on the apiserver and the apiserver and etcd run on the same cores meanwhile;
- a LIST of 500 ConfigMaps (497 KB), a 4 KiB frame or chunk per read, read as it arrives.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from hpack import Encoder

from kproxy.server.http2.client import H2Conn, H2Response, request_fields
from kproxy.server.pool import Pool, _Conn
from kproxy.testing.h2fakes import FakeH2Pool, MemoryTransport, frame

HEADERS = [
    ("User-Agent", "kube-controller-manager/v1.37.1 (linux/amd64) kubernetes/abc/system:serviceaccount:kube-system:x"),
    ("Accept", "application/json, */*"),
    ("X-Forwarded-For", "127.0.0.1"),
    ("Impersonate-User", "system:serviceaccount:kube-system:deployment-controller"),
    ("Impersonate-Group", "system:serviceaccounts"),
    ("Impersonate-Group", "system:authenticated"),
    ("Accept-Encoding", "gzip"),
]
GET = "/api/v1/namespaces/default/configmaps/p"
SMALL = b'{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"p","namespace":"default"},"data":{"a":"b"}}'
LARGE = (b'{"kind":"ConfigMap","metadata":{"name":"x"},"data":{"k":"v"}}' * 8200)[:497_000]
FRAME = 4096
_FLUSH = bytearray(32 << 20)


def flush_caches() -> None:
    _FLUSH[:: 4096] = b"\x01" * (len(_FLUSH) // 4096)
    sum(memoryview(_FLUSH)[::64])


# ------------------------------------------------------------------ HTTP/2: an apiserver's answers


class H2Side:
    def __init__(self) -> None:
        self.encoder = Encoder()
        self.conn = H2Conn(FakeH2Pool())  # type: ignore[arg-type]
        self.conn.connection_made(MemoryTransport(keep=False))  # type: ignore[arg-type]
        settings = frame(0x4, 0, 0, (5).to_bytes(2, "big") + (16384).to_bytes(4, "big"))
        self.conn.data_received(settings + frame(0x4, 0x1, 0, b""))
        self.conn.flush_now()

    def answer(self, sid: int, body: bytes, chunked: bool) -> list[bytes]:
        fields = [
            (b":status", b"200"),
            (b"audit-id", str(uuid.uuid4()).encode()),
            (b"cache-control", b"no-cache, private"),
            (b"content-type", b"application/json"),
            (b"x-kubernetes-pf-flowschema-uid", b"afb0b5de-4911-45ce-b511-f8e9ad5c0b3d"),
            (b"x-kubernetes-pf-prioritylevel-uid", b"33e9df91-7e70-471a-8259-91da2198eb6f"),
            (b"date", b"Sun, 29 Nov 2026 15:03:10 GMT"),
        ]
        if not chunked:
            fields.append((b"content-length", str(len(body)).encode()))
        head = frame(0x1, 0x4, sid, self.encoder.encode(fields, huffman=True))
        if not chunked:
            return [head + frame(0x0, 0x1, sid, body)]
        reads = [head]
        for pos in range(0, len(body), FRAME):
            last = pos + FRAME >= len(body)
            reads.append(frame(0x0, 0x1 if last else 0, sid, body[pos : pos + FRAME]))
        return reads

    def answers(self, n: int) -> bytes:
        """The answers to the next ``n`` streams, together."""
        first = self.next_sid()
        return b"".join(self.answer(first + 2 * i, SMALL, False)[0] for i in range(n))

    async def gets(self, answers: bytes, n: int) -> None:
        conn = self.conn
        streams = []
        for _ in range(n):
            fields = request_fields("GET", GET, "127.0.0.1:6443", HEADERS, None)
            streams.append(conn.open_stream(fields, end_stream=True))
        conn.flush_now()
        conn.data_received(answers)
        for st in streams:
            await st.head
            await H2Response(st).read()
        if conn._flush_scheduled:
            conn.flush_now()

    async def get(self, answer: list[bytes]) -> None:
        conn = self.conn
        st = conn.open_stream(request_fields("GET", GET, "127.0.0.1:6443", HEADERS, None), end_stream=True)
        conn.flush_now()
        for read in answer:
            conn.data_received(read)
        await st.head
        await H2Response(st).read()
        if conn._flush_scheduled:
            conn.flush_now()

    async def list_(self, answer: list[bytes]) -> None:
        conn = self.conn
        st = conn.open_stream(request_fields("GET", "/api/v1/configmaps", "127.0.0.1:6443", HEADERS, None), True)
        conn.flush_now()
        conn.data_received(answer[0])
        await st.head
        reading = asyncio.ensure_future(_consume(H2Response(st).chunks()))
        for read in answer[1:]:
            conn.data_received(read)
            await asyncio.sleep(0)
        if await reading != len(LARGE):
            raise RuntimeError("the HTTP/2 client did not read the whole LIST")
        if conn._flush_scheduled:
            conn.flush_now()

    def next_sid(self) -> int:
        return self.conn.h2.get_next_available_stream_id()


# ------------------------------------------------------------------ HTTP/1.1: the same answers


class H1Side:
    def __init__(self, conns: int) -> None:
        self.pool = Pool("127.0.0.1", 6443, None, None, 5.0)
        self.conns = []
        for _ in range(conns):
            conn = _Conn(self.pool)
            conn.connection_made(MemoryTransport(keep=False))  # type: ignore[arg-type]
            self.conns.append(conn)

    @staticmethod
    def answer(body: bytes, chunked: bool) -> list[bytes]:
        head = (
            b"HTTP/1.1 200 OK\r\nAudit-Id: %s\r\nCache-Control: no-cache, private\r\n"
            b"Content-Type: application/json\r\nX-Kubernetes-Pf-Flowschema-Uid: afb0b5de-4911-45ce-b511-f8e9ad5c0b3d"
            b"\r\nX-Kubernetes-Pf-Prioritylevel-Uid: 33e9df91-7e70-471a-8259-91da2198eb6f\r\n"
            b"Date: Sun, 29 Nov 2026 15:03:10 GMT\r\n" % str(uuid.uuid4()).encode()
        )
        if not chunked:
            return [head + b"Content-Length: %d\r\n\r\n" % len(body) + body]
        reads = [head + b"Transfer-Encoding: chunked\r\n\r\n"]
        for pos in range(0, len(body), FRAME):
            piece = body[pos : pos + FRAME]
            reads.append(b"%x\r\n%s\r\n" % (len(piece), piece))
        reads[-1] += b"0\r\n\r\n"
        return reads

    def _idle(self) -> None:
        now = time.monotonic()
        self.pool.idle = []
        for conn in self.conns:
            conn.idle_since = now
            self.pool.idle.append(conn)

    async def gets(self, answers: list[bytes], n: int) -> None:
        self._idle()
        taken = list(reversed(self.pool.idle))  # the pool takes the last idle connection first
        sent = [asyncio.ensure_future(self.pool.request("GET", GET, HEADERS, None, None)) for _ in range(n)]
        await asyncio.sleep(0)
        for conn, data in zip(taken, answers, strict=False):
            conn.data_received(data)
        for fut in sent:
            await (await fut).read()

    async def get(self, answer: list[bytes]) -> None:
        self._idle()
        conn = self.pool.idle[-1]
        sent = asyncio.ensure_future(self.pool.request("GET", GET, HEADERS, None, None))
        await asyncio.sleep(0)
        for read in answer:
            conn.data_received(read)
        await (await sent).read()

    async def list_(self, answer: list[bytes]) -> None:
        self._idle()
        conn = self.pool.idle[-1]
        sent = asyncio.ensure_future(self.pool.request("GET", "/api/v1/configmaps", HEADERS, None, None))
        await asyncio.sleep(0)
        conn.data_received(answer[0])
        resp = await sent
        reading = asyncio.ensure_future(_consume(resp.chunks()))
        for read in answer[1:]:
            conn.data_received(read)
            await asyncio.sleep(0)
        if await reading != len(LARGE):
            raise RuntimeError("the HTTP/1.1 pool did not read the whole LIST")


async def _consume(chunks: Any) -> int:
    n = 0
    async for chunk in chunks:
        n += len(chunk)
    return n


# ------------------------------------------------------------------ scenarios


async def _timed(rounds: int, per_round: int, prepare: Callable[[], Any], run: Callable[[Any], Awaitable[None]],
                 cold: bool = False) -> float:  # fmt: skip
    total = 0.0
    for _ in range(rounds):
        prepared = prepare()
        if cold:
            flush_caches()
        start = time.process_time()
        await run(prepared)
        total += time.process_time() - start
    return total / (rounds * per_round) * 1e6


#: Rounds of each scenario are divided by this (``--quick``: a check that it runs, not a measure).
_SCALE = 1


async def _timed_scaled(rounds: int, *args: Any, **kwargs: Any) -> float:
    return await _timed(max(1, rounds // _SCALE), *args, **kwargs)


async def scenario(name: str, client: str) -> float:
    if client == "h2":
        h2side = H2Side()
        if name == "GET, 16 at once":
            return await _timed_scaled(200, 16, lambda: h2side.answers(16), lambda a: h2side.gets(a, 16))
        if name == "LIST, a frame per read":
            return await _timed_scaled(20, 1, lambda: h2side.answer(h2side.next_sid(), LARGE, True), h2side.list_)
        cold = name.endswith("caches flushed")
        return await _timed_scaled(
            150 if cold else 1500, 1, lambda: h2side.answer(h2side.next_sid(), SMALL, False), h2side.get, cold
        )
    h1side = H1Side(16)
    if name == "GET, 16 at once":
        return await _timed_scaled(
            200, 16, lambda: [H1Side.answer(SMALL, False)[0] for _ in range(16)], lambda a: h1side.gets(a, 16)
        )
    if name == "LIST, a frame per read":
        return await _timed_scaled(20, 1, lambda: H1Side.answer(LARGE, True), h1side.list_)
    cold = name.endswith("caches flushed")
    return await _timed_scaled(150 if cold else 1500, 1, lambda: H1Side.answer(SMALL, False), h1side.get, cold)


SCENARIOS = ["GET, 16 at once", "GET, one at a time", "GET, one at a time, caches flushed", "LIST, a frame per read"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="a tenth of the rounds, once: that it runs")
    args = p.parse_args()
    global _SCALE
    if args.quick:
        _SCALE, args.repeat = 10, 1
    print("| scenario | HTTP/2 client µs | HTTP/1.1 pool µs | ratio |")
    print("| --- | --: | --: | --: |")
    for name in SCENARIOS:
        got = {}
        for client in ("h2", "h1"):
            got[client] = statistics.median(asyncio.run(scenario(name, client)) for _ in range(args.repeat))
        print(f"| {name} | {got['h2']:.1f} | {got['h1']:.1f} | {got['h2'] / got['h1']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
