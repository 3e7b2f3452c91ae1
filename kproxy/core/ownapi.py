"""What kproxy's own line to the apiserver offers to the code that lists, watches and reads
discovery with it: the part of :class:`kproxy.core.context.ApiClient` they use, as a protocol, so
that ``kproxy.core.listwatch`` and ``kproxy.core.discovery`` need not import the context (which
holds the discovery service: the import graph stays without a cycle)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol


class OwnApi(Protocol):
    """kproxy's own requests with its own credentials (``ApiClient`` is one)."""

    @property
    def rtt(self) -> float | None: ...

    def request(
        self,
        method: str,
        target: str,
        *,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
        timeout: float | None = 30.0,
    ) -> AbstractAsyncContextManager[Any]: ...

    async def json(
        self,
        method: str,
        target: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = 30.0,
    ) -> tuple[int, Any]: ...
