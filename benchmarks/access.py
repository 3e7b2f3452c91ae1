"""What authorizing a cached read costs, cached and not, in one run.

    python -m benchmarks.access [--envtest-dir DIR] [--calls 20000] [--reviews 300] [--output FILE]

Every read the watch cache serves in ``credentials: forward`` first goes through
``kproxy.identity.access.authorize`` (identity from the TokenReview cache, decision from the
SubjectAccessReview cache). Rows, p50 and p99 in µs per call, one core, in one event loop:

* ``authorize``, both caches warm: what a cached read pays on every request;
* ``AccessReviewer.check``, decision cached: the decision lookup alone;
* peer: ``check`` with reuse off (``allow_ttl=0``): a SubjectAccessReview round trip to the local
  apiserver, what every read would cost without the decision cache;
* peer: ``authorize`` with both caches off: TokenReview plus SubjectAccessReview per request.

The machine's load average is printed with the table: the host is shared, so compare rows of one
run, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from benchmarks.lib.cluster import control_plane
from benchmarks.lib.common import log
from benchmarks.lib.stats import percentile
from kproxy.core.chain import BytesBody, Exchange
from kproxy.core.context import ApiClient, FilterContext
from kproxy.core.requestinfo import parse_request_info
from kproxy.identity.access import AccessReviewer, api_review, authorize
from kproxy.identity.authn import SERVICE_KEY, Authenticator, authenticator
from kproxy.localcluster import envtest
from kproxy.server.kubeconfig import from_kubeconfig
from kproxy.server.upstream import Upstream

TARGET = "/api/v1/namespaces/default/pods"
QUERY = "labelSelector=app%3Dweb"


def exchange(token: str) -> Exchange:
    headers: CIMultiDict[str] = CIMultiDict({"Authorization": f"Bearer {token}"})
    return Exchange("GET", TARGET, QUERY, headers, BytesBody(b"", ""), parse_request_info("GET", TARGET, QUERY))


async def timed(n: int, call: Callable[[], Awaitable[object]]) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def row(name: str, samples: list[float]) -> str:
    return f"| {name} | {len(samples)} | {percentile(samples, 50):.1f} | {percentile(samples, 99):.1f} |"


async def run(info: envtest.ControlPlaneInfo, calls: int, reviews: int) -> list[str]:
    upstream = Upstream(from_kubeconfig(str(info.admin_kubeconfig), None), "forward")
    await upstream.start()
    try:
        ctx = FilterContext(ApiClient(upstream), "forward", CollectorRegistry())
        token = info.admin_token  # allowed: the whole path, including the decision, is exercised
        cached = AccessReviewer(api_review(ctx), allow_ttl=3600, deny_ttl=3600)
        uncached = AccessReviewer(api_review(ctx), allow_ttl=0, deny_ttl=0)
        identity = await authenticator(ctx).identify(exchange(token))
        req_info = exchange(token).info
        await authorize(ctx, cached, exchange(token))  # warm both caches

        warm_ex = exchange(token)

        async def warm_authorize() -> None:
            warm_ex.identity = None  # identified again each time, as a new request is (from the cache)
            await authorize(ctx, cached, warm_ex)

        async def warm_check() -> None:
            await cached.check(identity, req_info, label_selector="app=web")

        async def sar() -> None:
            await uncached.check(identity, req_info, label_selector="app=web")

        cold_ctx = FilterContext(ApiClient(upstream), "forward", CollectorRegistry())
        cold_ctx.provide(SERVICE_KEY, Authenticator(cold_ctx, success_ttl=0, failure_ttl=0))

        async def cold_authorize() -> None:
            await authorize(cold_ctx, uncached, exchange(token))

        for fn in (warm_authorize, sar):  # connections open, code paths warm
            await timed(50, fn)
        rows = [
            row("authorize, identity and decision cached", await timed(calls, warm_authorize)),
            row("AccessReviewer.check, decision cached", await timed(calls, warm_check)),
            row("peer: check, SubjectAccessReview round trip", await timed(reviews, sar)),
            row("peer: authorize, TokenReview + SubjectAccessReview", await timed(reviews, cold_authorize)),
        ]
        return rows
    finally:
        await upstream.close()


def measure(args: argparse.Namespace) -> list[str]:
    with control_plane(args.envtest_dir) as info:
        log("measuring ...")
        rows = asyncio.run(run(info, args.calls, args.reviews))
    return [
        f"Authorizing a cached read (µs per call; python {sys.version.split()[0]}, "
        f"load average {os.getloadavg()[0]:.2f})",
        "",
        "| path | calls | p50 µs | p99 µs |",
        "| --- | ---: | ---: | ---: |",
        *rows,
    ]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envtest-dir", type=Path, default=None, help="a running control plane to use")
    p.add_argument("--calls", type=int, default=20000, help="calls per cached row")
    p.add_argument("--reviews", type=int, default=300, help="calls per row that talks to the apiserver")
    p.add_argument("--output", type=Path, default=None, help="also write the table here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    text = "\n".join(measure(args)) + "\n"
    sys.stdout.write(text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
