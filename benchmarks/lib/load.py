"""Closed-loop HTTP load generator, run as its own process: ``python -m benchmarks.lib.load < spec.json``.

One process per measurement, so the load generator never shares an event loop (or a Python
interpreter lock) with the runner or with a proxy under test.  It reads a :class:`LoadSpec` as
JSON on stdin and writes a :class:`LoadResult` as JSON on stdout.

Model: ``concurrency`` workers share one keep-alive ``aiohttp.ClientSession`` (a connection pool
of exactly ``concurrency`` connections); each worker sends its next request as soon as the
previous response body has been read in full.  Latency is ``time.perf_counter()`` from just
before the request is sent to the end of the body.  A request counts in the measurement when it
*completes* inside the window ``[start + warmup, start + warmup + duration)``, so requests/s is
``completed / duration``; requests completing during the warm-up or after the window are
discarded.  Non-2xx answers and exceptions are errors: counted by kind, never in the latencies.

Bodies are not decompressed (``auto_decompress=False``): the generator pays only for reading
bytes, the same for every peer.  One request before the warm-up checks that the peer answers
what it should (right ``kind``, right number of items), decompressing gzip for that check only.

The generator also samples the CPU time (user + system, all threads, from ``/proc/PID/stat``)
of the processes named in ``pids`` and of itself at both edges of the window, so the report can
show where the CPU of a two-core machine went, and the busy time of the whole machine, which
shows when something else (a build, another test run) competed for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import ssl
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from benchmarks.lib.common import REPO_ROOT, BenchError, child_env
from benchmarks.lib.procs import cpu_seconds_or_none, machine_busy_seconds, self_cpu_seconds
from kproxy.localcluster.controlplane import client_ssl_context

_REQUEST_TIMEOUT = 60.0
_ERROR_BACKOFF = 0.01  # after an exception, so a dead peer cannot turn a worker into a busy loop
#: key of LoadResult.cpu_s for the busy time of the whole machine (every process, all CPUs)
MACHINE = "machine"


@dataclass
class TLSFiles:
    """Client TLS for an HTTPS peer: the CA to trust and an optional client certificate."""

    ca: str
    cert: str | None = None
    key: str | None = None


@dataclass
class Expect:
    """What a correct answer looks like: its ``kind`` and, for a list, how many items."""

    kind: str
    items: int | None = None


@dataclass
class LoadSpec:
    url: str
    concurrency: int
    duration: float
    warmup: float
    headers: dict[str, str]
    expect: Expect
    tls: TLSFiles | None = None
    #: name -> pid of processes whose CPU time is sampled over the measurement window
    pids: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LoadSpec:
        tls = d.get("tls")
        return cls(
            url=d["url"],
            concurrency=int(d["concurrency"]),
            duration=float(d["duration"]),
            warmup=float(d["warmup"]),
            headers=dict(d.get("headers") or {}),
            expect=Expect(**d["expect"]),
            tls=TLSFiles(**tls) if tls else None,
            pids={k: int(v) for k, v in (d.get("pids") or {}).items()},
        )


@dataclass
class LoadResult:
    #: completed 2xx requests inside the window
    ok: int = 0
    #: error kind ("HTTP 503", "ServerDisconnectedError", ...) -> count inside the window
    errors: dict[str, int] = field(default_factory=dict)
    #: latency of each ok request, milliseconds
    latencies_ms: list[float] = field(default_factory=list)
    #: body bytes read for the ok requests (compressed size when the peer compressed)
    body_bytes: int = 0
    #: length of the measurement window, seconds
    window_s: float = 0.0
    #: Content-Encoding of the checked response ("identity" when absent)
    content_encoding: str = ""
    #: why the pre-flight check failed; the measurement is not run then
    check_error: str | None = None
    #: CPU seconds spent inside the window: "loadgen", each name of LoadSpec.pids, and MACHINE
    cpu_s: dict[str, float] = field(default_factory=dict)


def _ssl_context(tls: TLSFiles | None) -> ssl.SSLContext | None:
    if tls is None:
        return None
    # The certificate alone, as client-go sends it (see kproxy/server/tlschain.py).
    return client_ssl_context(Path(tls.ca), Path(tls.cert) if tls.cert else None, Path(tls.key) if tls.key else None)


def _machine_busy() -> float | None:
    try:
        return machine_busy_seconds()
    except OSError:
        return None


def _cpu_snapshot(pids: dict[str, int]) -> dict[str, float | None]:
    snap: dict[str, float | None] = {name: cpu_seconds_or_none(pid) for name, pid in pids.items()}
    snap["loadgen"] = self_cpu_seconds()
    snap[MACHINE] = _machine_busy()
    return snap


def _check(body: bytes, encoding: str, expect: Expect) -> str | None:
    """None when ``body`` is what ``expect`` describes, else what is wrong with it."""
    try:
        raw = gzip.decompress(body) if encoding == "gzip" else body
        doc = json.loads(raw)
    except (OSError, ValueError) as e:
        return f"body is not {encoding} JSON: {e}"
    if not isinstance(doc, dict) or doc.get("kind") != expect.kind:
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        return f"expected kind {expect.kind}, got {kind}"
    if expect.items is not None:
        items = doc.get("items")
        if not isinstance(items, list) or len(items) != expect.items:
            count = len(items) if isinstance(items, list) else items
            return f"expected {expect.items} items, got {count}"
    return None


async def _preflight(session: aiohttp.ClientSession, url: URL, spec: LoadSpec, result: LoadResult) -> bool:
    try:
        async with session.get(url, headers=spec.headers) as resp:
            body = await resp.read()
            result.content_encoding = resp.headers.get("Content-Encoding", "identity")
            if resp.status != 200:
                snippet = body[:300].decode(errors="replace")
                result.check_error = f"HTTP {resp.status} {resp.reason}: {snippet}"
                return False
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        result.check_error = f"{type(e).__name__}: {e}"
        return False
    result.check_error = _check(body, result.content_encoding, spec.expect)
    return result.check_error is None


async def run_load(spec: LoadSpec) -> LoadResult:
    result = LoadResult()
    url = URL(spec.url, encoded=True)
    connector = aiohttp.TCPConnector(limit=spec.concurrency, ssl=_ssl_context(spec.tls) or False)
    timeout = aiohttp.ClientTimeout(total=_REQUEST_TIMEOUT)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
    ) as session:
        if not await _preflight(session, url, spec, result):
            return result

        loop = asyncio.get_running_loop()
        start = loop.time()
        window_start = time.perf_counter() + spec.warmup
        window_end = window_start + spec.duration
        errors: Counter[str] = Counter()
        latencies: list[float] = []
        body_bytes = 0
        headers = spec.headers

        async def worker() -> None:
            nonlocal body_bytes
            while (t0 := time.perf_counter()) < window_end:
                try:
                    async with session.get(url, headers=headers) as resp:
                        body = await resp.read()
                        status = resp.status
                except (TimeoutError, aiohttp.ClientError, OSError) as e:
                    if window_start <= time.perf_counter() < window_end:
                        errors[type(e).__name__] += 1
                    await asyncio.sleep(_ERROR_BACKOFF)
                    continue
                t1 = time.perf_counter()
                if not window_start <= t1 < window_end:
                    continue
                if 200 <= status < 300:
                    latencies.append(t1 - t0)
                    body_bytes += len(body)
                else:
                    errors[f"HTTP {status}"] += 1

        cpu: list[dict[str, float | None]] = []

        async def sample_cpu() -> None:
            # loop.time() and perf_counter() both tick monotonically; sleep to the window edges.
            await asyncio.sleep(max(0.0, start + spec.warmup - loop.time()))
            cpu.append(_cpu_snapshot(spec.pids))
            await asyncio.sleep(max(0.0, start + spec.warmup + spec.duration - loop.time()))
            cpu.append(_cpu_snapshot(spec.pids))

        sampler = asyncio.create_task(sample_cpu())
        await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
        with contextlib.suppress(asyncio.CancelledError):
            await sampler

    result.ok = len(latencies)
    result.errors = dict(errors)
    result.latencies_ms = [round(x * 1000, 4) for x in latencies]
    result.body_bytes = body_bytes
    result.window_s = spec.duration
    if len(cpu) == 2:
        for name, before in cpu[0].items():
            after = cpu[1].get(name)
            if before is not None and after is not None:
                result.cpu_s[name] = round(after - before, 3)
    return result


def run_in_process(spec: dict[str, Any], timeout: float) -> LoadResult:
    """One measurement in a fresh ``python -m benchmarks.lib.load`` process (``spec``: a
    :class:`LoadSpec` as JSON)."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.lib.load"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        env=child_env(),
        check=False,
    )
    if proc.returncode != 0:
        raise BenchError(f"load generator failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    return LoadResult(**json.loads(proc.stdout))


def main() -> int:
    spec = LoadSpec.from_json(json.load(sys.stdin))
    result = asyncio.run(run_load(spec))
    json.dump(asdict(result), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
