"""TokenReviews are sent under kproxy's identity, so the apiserver's fairness charges them to kproxy:
a caller spraying random tokens must not be able to make kproxy send one review per token. The
sprayer (its own client address, 127.0.0.2) runs a few reviews at once, has a few more waiting in
its own queue, and the rest of its requests are answered APF's 429 with Retry-After, while a
legitimate forward-mode caller's first request (its token not yet reviewed, from another address)
takes the next turn and goes through at once.
Counted on kproxy's process (kproxy_token_reviews, kproxy_token_reviews_refused) and judged at the
apiserver (the SelfSubjectReview names the legitimate caller)."""

from __future__ import annotations

import asyncio
import json
import secrets
import ssl
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

SPRAYERS = 48
SPRAY_SECONDS = 4.0
SSR = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
SSR_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
# A rule by user: every request needs the caller's identity, hence a TokenReview of its token.
RULE_BY_USER = {
    "name": "dryrun",
    "rules": [{"name": "ci", "match": {"users": ["system:serviceaccount:ci:*"]}, "action": "enforce"}],
}


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


async def _spray(url: str, ctx: ssl.SSLContext, stop: asyncio.Event, codes: Counter[int], retry: Counter[str]) -> None:
    connector = aiohttp.TCPConnector(ssl=ctx, local_addr=("127.0.0.2", 0), limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            while not stop.is_set():
                headers = {"Authorization": f"Bearer {secrets.token_urlsafe(24)}", "Content-Type": "application/json"}
                async with session.post(url + SSR_PATH, data=json.dumps(SSR), headers=headers) as resp:
                    await resp.read()
                    codes[resp.status] += 1
                    if resp.status == 429:
                        retry[resp.headers.get("Retry-After", "")] += 1

        await asyncio.gather(*(one() for _ in range(SPRAYERS)))


async def _legitimate(url: str, ctx: ssl.SSLContext, token: str) -> tuple[float, int, dict[str, Any]]:
    connector = aiohttp.TCPConnector(ssl=ctx, local_addr=("127.0.0.1", 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        started = time.monotonic()
        async with session.post(url + SSR_PATH, data=json.dumps(SSR), headers=headers) as resp:
            body = await resp.json()
            return time.monotonic() - started, resp.status, body


async def _scenario(rp: RunningProxy, token: str) -> tuple[Counter[int], Counter[str], float, int, dict[str, Any]]:
    assert rp.ca_file is not None
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    stop = asyncio.Event()
    codes: Counter[int] = Counter()
    retry: Counter[str] = Counter()
    spray = asyncio.create_task(_spray(rp.url, ctx, stop, codes, retry))
    # Once the spray is under way (answers coming back), the legitimate caller's first request.
    while sum(codes.values()) < 200 and not spray.done():
        await asyncio.sleep(0.05)
    latency, code, body = await _legitimate(rp.url, ctx, token)
    await asyncio.sleep(max(0.0, SPRAY_SECONDS - 1))
    stop.set()
    await spray
    return codes, retry, latency, code, body


def test_token_spray_is_bounded_and_a_new_caller_gets_through(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo
) -> None:
    rp = proxy_factory(credentials="forward", tls=True, extra={"filters": [RULE_BY_USER]})
    codes, retry, latency, code, body = asyncio.run(_scenario(rp, control_plane.user_token))
    metrics = rp.metrics()
    sent = _metric(metrics, "kproxy_token_reviews_total")
    refused = _metric(metrics, "kproxy_token_reviews_refused_total", bound="client")  # its own queue full
    sprayed = sum(codes.values())
    print(f"sprayed {sprayed} ({dict(codes)}), reviews sent {sent:.0f}, legitimate caller {latency * 1000:.0f} ms")

    # The legitimate caller: through at once, and the apiserver saw exactly it.
    assert code == 201, body
    assert body["status"]["userInfo"]["username"] == control_plane.user_name
    assert latency < 3.0, latency  # not queued behind the sprayer (typically 0.25-0.5 s here)
    # The sprayer: only 401 (its token reviewed and rejected) or 429 (not reviewed), never a 5xx.
    assert set(codes) <= {401, 429}, codes
    # APF's Retry-After: 1 s, raised (up to 32) while many are refused (kproxy.core.fairness.RetryAfter).
    assert codes[429] > 0 and sum(retry.values()) == codes[429], (codes, retry)
    assert all(v.isdigit() and 1 <= int(v) <= 32 for v in retry), retry
    assert refused == codes[429]
    # Every sprayed request cost a review before; now far fewer, and none failed at the apiserver.
    assert sent == codes[401] + 1, (sent, codes)
    assert sent < sprayed / 2, (sent, sprayed)
    assert _metric(metrics, "kproxy_token_reviews_total", result="error") == 0
