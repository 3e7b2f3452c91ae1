"""Side-by-side HTTP helpers: the same request straight to the apiserver and through kproxy.

Direct requests present the admin client certificate; requests through kproxy go to its plain
HTTP listener (``credentials: proxy`` adds kproxy's own credentials upstream).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

from kproxy.localcluster.envtest import ControlPlaneInfo

JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"


@dataclass
class Answer:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")

    def json(self) -> Any:
        return json.loads(self.body)


class Sides:
    """One aiohttp session to the apiserver and one to kproxy."""

    def __init__(self, cp: ControlPlaneInfo, proxy_url: str) -> None:
        self.cp = cp
        self.proxy_url = proxy_url.rstrip("/")
        self._direct = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=cp.ssl_context()),
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent"),
        )
        self._proxy = aiohttp.ClientSession(
            auto_decompress=False, skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent")
        )

    async def close(self) -> None:
        await self._direct.close()
        await self._proxy.close()

    def url(self, path: str, via_proxy: bool) -> str:
        return (self.proxy_url if via_proxy else self.cp.server.rstrip("/")) + path

    def session(self, via_proxy: bool) -> aiohttp.ClientSession:
        return self._proxy if via_proxy else self._direct

    async def request(
        self,
        method: str,
        path: str,
        *,
        via_proxy: bool,
        accept: str | None = JSON,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
    ) -> Answer:
        hdrs = dict(headers or {})
        if accept is not None:
            hdrs["Accept"] = accept
        async with self.session(via_proxy).request(
            method, self.url(path, via_proxy), headers=hdrs, data=data, timeout=aiohttp.ClientTimeout(total=60)
        ) as resp:
            return Answer(resp.status, resp.headers, await resp.read())

    async def both(self, method: str, path: str, **kw: Any) -> tuple[Answer, Answer]:
        """(direct, through kproxy)."""
        return await self.request(method, path, via_proxy=False, **kw), await self.request(
            method, path, via_proxy=True, **kw
        )

    @asynccontextmanager
    async def stream(
        self, path: str, *, via_proxy: bool, accept: str | None = JSON
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        hdrs = {"Accept": accept} if accept is not None else {}
        async with self.session(via_proxy).get(
            self.url(path, via_proxy), headers=hdrs, timeout=aiohttp.ClientTimeout(total=None, sock_read=60)
        ) as resp:
            yield resp


INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def is_initial_events_end(event: dict[str, Any]) -> bool:
    annotations = event.get("object", {}).get("metadata", {}).get("annotations") or {}
    return bool(event.get("type") == "BOOKMARK" and annotations.get(INITIAL_EVENTS_END) == "true")


async def initial_events(resp: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    """Read a JSON watch (sendInitialEvents + bookmarks) up to its initial-events-end bookmark."""
    events: list[dict[str, Any]] = []
    while True:
        line = await resp.content.readline()
        if not line:
            raise AssertionError(f"watch ended before the initial-events-end bookmark; got {events!r}"[:2000])
        event = json.loads(line)
        events.append(event)
        if is_initial_events_end(event):
            return events
