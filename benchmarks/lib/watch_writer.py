"""The writer of ``benchmarks.watchfanout``: merge patches that stamp pods with the wall clock.

Its own process (its CPU is reported apart, and it never shares an event loop with the
watchers or the sampling). Every patch sets one annotation, ``fanout.kproxy.dev/ts``, to
``time.time()`` as the request leaves (fixed width, 6 decimals): the watchers read it back from
the event and subtract it from their receipt time. The pods are patched round robin, straight at
the apiserver (HTTPS, admin client certificate), with one field manager, so each event's object
keeps a single ``managedFields`` entry.

Two modes: ``rate`` patches per second on a fixed schedule (``concurrency`` workers share the
ticks; a worker more than half a second late drops the ticks it missed, counted, instead of
bursting to catch up), or ``rate=None``: ``concurrency`` workers patching back to back, as fast
as the apiserver answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import aiohttp

from benchmarks.lib.watch_client import TS_ANNOTATION, recv

FIELD_MANAGER = "watchfanout-bench"
_LATE = 0.5


@dataclass
class WriterSpec:
    server: str
    ca: str
    cert: str
    key: str
    namespace: str
    pods: list[str]
    #: patches per second, None = as fast as the apiserver allows
    rate: float | None
    concurrency: int


@dataclass
class WriterResult:
    #: patches answered 200 inside the window
    patches: int = 0
    #: ticks dropped because every worker was late (rate mode)
    missed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    #: patch round trips inside the window, seconds (sorted)
    latencies: list[float] = field(default_factory=list)


async def run(spec: WriterSpec, conn: Connection) -> None:
    ctx = ssl.create_default_context(cafile=spec.ca)
    ctx.load_cert_chain(spec.cert, spec.key)
    res = WriterResult()
    errors: Counter[str] = Counter()
    start_at = end_at = float("inf")
    nxt = 0
    t0 = time.monotonic()
    headers = {"Content-Type": "application/merge-patch+json", "Accept": "application/json"}
    paths = [f"/api/v1/namespaces/{spec.namespace}/pods/{p}?fieldManager={FIELD_MANAGER}" for p in spec.pods]
    connector = aiohttp.TCPConnector(ssl=ctx, limit=spec.concurrency)
    async with aiohttp.ClientSession(
        base_url=spec.server,
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=30),
        skip_auto_headers=("User-Agent",),
    ) as session:

        async def worker() -> None:
            nonlocal nxt
            while True:
                k = nxt
                nxt += 1
                if spec.rate is not None:
                    due = t0 + k / spec.rate
                    late = time.monotonic() - due
                    if late > _LATE:  # drop the ticks nobody could serve in time
                        skip = int(late * spec.rate)
                        nxt += skip
                        if start_at <= time.time() < end_at:
                            res.missed += skip
                    elif late < 0:
                        await asyncio.sleep(-late)
                body = b'{"metadata":{"annotations":{"%s":"%.6f"}}}' % (TS_ANNOTATION.encode(), time.time())
                t = time.perf_counter()
                try:
                    async with session.patch(paths[k % len(paths)], data=body, headers=headers) as r:
                        await r.read()
                        status = r.status
                except (aiohttp.ClientError, OSError, TimeoutError) as e:
                    status, why = 0, type(e).__name__
                took = time.perf_counter() - t
                if start_at <= time.time() < end_at:
                    if status == 200:
                        res.patches += 1
                        res.latencies.append(took)
                    else:
                        errors[f"HTTP {status}" if status else why] += 1
                if status != 200:
                    await asyncio.sleep(0.05)

        tasks = [asyncio.create_task(worker()) for _ in range(spec.concurrency)]
        conn.send("writing")
        window = await recv(conn)
        assert isinstance(window, tuple)
        start_at, end_at = window
        await asyncio.sleep(max(0.0, end_at - time.time()) + 0.05)
        res.errors = dict(errors)
        res.latencies.sort()
        conn.send(res)
        await recv(conn)  # "stop"
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def writer_main(spec: WriterSpec, conn: Connection) -> None:
    """Entry point of the writer process (``multiprocessing`` spawn target)."""
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(run(spec, conn))
