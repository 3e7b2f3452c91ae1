"""kproxy's real ``ProxyServer`` in the test process, in front of a :class:`ReplayUpstream`.

No subprocess and no Go binaries: the server, its chain and the built-in filters named in the
config run on the test's event loop, and the upstream answers with recorded apiserver answers::

    async with inprocess_proxy({"filters": [{"name": "dryrun", ...}]}) as (proxy, upstream):
        async with proxy.session.get(proxy.url + "/api/v1/namespaces") as resp: ...
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from kproxy.config import parse_config
from kproxy.filters import build_filters
from kproxy.server.kubeconfig import UpstreamTarget
from kproxy.server.proxy import ProxyServer
from kproxy.testing.replay import ReplayUpstream

__all__ = ["InProcessProxy", "inprocess_proxy"]


@dataclass
class InProcessProxy:
    server: ProxyServer
    url: str
    session: aiohttp.ClientSession

    async def request(
        self, method: str, target: str, headers: Mapping[str, str] | None = None, body: bytes = b""
    ) -> tuple[int, aiohttp.typedefs.LooseHeaders, bytes]:
        """Send one request (the target as written, no automatic decompression); return status,
        headers, raw body."""
        async with self.session.request(
            method,
            URL(self.url + target, encoded=True),
            headers=dict(headers or {}),
            data=body or None,
            auto_decompress=False,
        ) as resp:
            return resp.status, resp.headers, await resp.read()


@contextlib.asynccontextmanager
async def inprocess_proxy(
    config: Mapping[str, Any] | None = None, upstream: ReplayUpstream | None = None
) -> AsyncIterator[tuple[InProcessProxy, ReplayUpstream]]:
    """Start a replay upstream (unless given) and a ProxyServer on free loopback ports with
    ``config`` (access log off); stop both on exit."""
    data: dict[str, Any] = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "log": {"access_log": False}}
    data.update(config or {})
    cfg = parse_config(data)
    up = upstream or ReplayUpstream()
    if not up.url:
        await up.start()
    server = ProxyServer(cfg, UpstreamTarget(server=up.url, source="replay"), build_filters(cfg))
    try:
        await server.start()
        assert server.bound is not None
        host, port = server.bound
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            yield InProcessProxy(server, f"http://{host}:{port}", session), up
    finally:
        await server.shutdown(deadline=1.0)
        await up.close()
