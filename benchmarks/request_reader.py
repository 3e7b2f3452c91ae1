"""kproxy's HTTP/1.1 request reader in memory: Go's rules first, then aiohttp's parser, against
aiohttp's parser (llhttp) alone, on the same bytes in the same run.

    python -m benchmarks.request_reader [--repeat 7] [--quick]

kproxy reads every request head by Go's rules (``kproxy.server.h1request``) before llhttp builds
the request from it, so the listener's cost per request is llhttp's plus the reader's. Per
scenario, process CPU µs per request (the median of ``--repeat`` runs) for llhttp alone and for
the reader stack as the listener runs it (``listener._HeadLimit``), and what the reader adds:

- a controller's GET, the same head each time (its reading remembered);
- the same GET with a head never seen before (a fresh ``X-Request`` value each time);
- a create with a 1 KiB JSON body (Content-Length);
- the same create with a chunked body (re-encoded by Go's chunked reader);
- a head of 60,000 short lines (470 KiB, within Go's 1 MiB limit), as a flood would send;
- a head of 262,000 folded lines (1 MiB), each joined to the one before;
- a 1 MiB body of one-byte chunks.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

from aiohttp._http_parser import HttpRequestParser  # type: ignore[import-not-found]
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import BadHttpMessage

from kproxy.server.listener import MAX_HEAD_BYTES, MAX_HEADERS, _HeadLimit

GET = (
    b"GET /api/v1/namespaces/default/pods?limit=500 HTTP/1.1\r\nHost: 127.0.0.1:6443\r\n"
    b"User-Agent: kube-controller-manager/v1.37.1 (linux/amd64) kubernetes/abc/system:serviceaccount:kube-system:x\r\n"
    b"Accept: application/vnd.kubernetes.protobuf, */*\r\n"
    b"Authorization: Bearer eyJhbGciOiJSUzI1NiIsImtpZCI6IjEyMyJ9.eyJpc3MiOiJrdWJlcm5ldGVzIn0.abcdefghijklmnop\r\n"
    b"Accept-Encoding: gzip\r\n"
)
BODY = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"},"data":{"k":"' + b"v" * 960 + b'"}}'
POST = b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n"
FLOOD = b"GET / HTTP/1.1\r\nHost: a\r\n" + b"X-A: 1\r\n" * 60_000 + b"\r\n"
FOLDS = b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n" + b" b\r\n" * 262_000 + b"\r\n"
TINY = POST + b"Transfer-Encoding: chunked\r\n\r\n" + b"1\r\nx\r\n" * 174_000 + b"0\r\n\r\n"


class _Socket(BaseProtocol):
    """The connection under the parser: reading never pauses (each body is dropped as it comes)."""

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


class _Conn:
    def head_done(self) -> None:
        pass

    def holding(self) -> bool:
        return True

    def close(self) -> None:
        pass


def _scenarios(quick: bool) -> dict[str, tuple[int, Callable[[int], bytes]]]:
    n = 200 if quick else 5000
    return {
        "GET, a head seen before": (n, lambda i: GET + b"\r\n"),
        "GET, a new head": (n, lambda i: GET + b"X-Request: %d\r\n\r\n" % i),
        "create, 1 KiB body by length": (n, lambda i: POST + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY),
        "create, 1 KiB body chunked": (
            n,
            lambda i: POST + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY),
        ),
        "a head of 60,000 lines": (2 if quick else 10, lambda i: FLOOD),
        "a head of 262,000 folded lines": (2 if quick else 10, lambda i: FOLDS),
        "1 MiB body of 1-byte chunks": (2 if quick else 10, lambda i: TINY),
    }


async def _run(requests: list[bytes], wrapped: bool) -> float | None:
    """CPU µs per request; None where llhttp alone refuses the requests (a folded line)."""
    loop = asyncio.get_running_loop()
    parser: Any = HttpRequestParser(
        _Socket(loop), loop, 2**16, max_line_size=MAX_HEAD_BYTES, max_field_size=MAX_HEAD_BYTES,
        max_headers=MAX_HEADERS, auto_decompress=False,
    )  # fmt: skip
    reader: Any = _HeadLimit(parser, _Conn(), lambda: parser) if wrapped else parser  # type: ignore[arg-type]
    seen = 0
    start = time.process_time()
    for raw in requests:
        try:
            messages, _, _ = reader.feed_data(raw)
        except BadHttpMessage:
            return None
        for _, payload in messages:  # each body dropped as the handler would read it
            buffered = getattr(payload, "_buffer", None)
            if buffered is not None:
                buffered.clear()
                payload._size = 0
            seen += 1
        if wrapped:
            reader._queued.clear()
    spent = time.process_time() - start
    if seen != len(requests):
        raise RuntimeError(f"{seen} of {len(requests)} requests read")
    return spent / len(requests) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="a few requests per scenario (a smoke run)")
    args = p.parse_args()
    repeat = 2 if args.quick else args.repeat
    print("| scenario | llhttp alone µs | kproxy's reader µs | added µs |")
    print("| --- | --: | --: | --: |")
    for name, (n, make) in _scenarios(args.quick).items():
        requests = [make(i) for i in range(n)]
        alone: list[float | None] = []
        ours: list[float | None] = []
        for _ in range(repeat):  # alternated, so drift hits both alike
            alone.append(asyncio.run(_run(requests, wrapped=False)))
            ours.append(asyncio.run(_run(requests, wrapped=True)))
        o = statistics.median(x for x in ours if x is not None)
        if None in alone:
            print(f"| {name} | refuses | {o:.1f} | - |")
            continue
        a = statistics.median(x for x in alone if x is not None)
        print(f"| {name} | {a:.1f} | {o:.1f} | {o - a:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
