"""The resources the apiserver serves, from its discovery: the bounded set of ``resource`` labels.

A request's resource is whatever its path says; labelling metrics with it as it is lets any caller
add a series per random name (8,000 such requests made /metrics 21 MB and each scrape block the
loop for seconds). The apiserver counts requests only on the routes it installed, one per
resource it serves (staging/src/k8s.io/apiserver/pkg/endpoints/metrics/metrics.go
``InstrumentRouteFunc``, called by endpoints/installer.go). kproxy does the same from discovery:
a resource the apiserver serves keeps its name, any other is ``other``.

Discovery is read with kproxy's own credentials when it starts, and again when a request names a
resource not known yet (a new custom resource), at most once per ``REFRESH_INTERVAL``: random
names cost at most that one request per interval. The aggregated form (``apidiscovery.k8s.io/v2``,
two requests: ``/api`` and ``/apis``) is asked for; an apiserver that answers the legacy form is
read group version by group version.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kproxy.core.context import ApiClient

log = logging.getLogger("kproxy")

#: The label of any resource the apiserver does not serve (or not known yet).
OTHER = "other"
#: At most one discovery refresh per this many seconds, whatever requests arrive.
REFRESH_INTERVAL = 30.0

_AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"

#: GET a discovery path with an Accept header -> (status, decoded JSON).
Fetch = Callable[[str, str], Awaitable[tuple[int, Any]]]


class DiscoveryError(Exception):
    pass


def labels_from_aggregated(doc: Any) -> set[str]:
    """``resource[.group]`` of each resource, and ``resource/subresource[.group]`` of each of its
    subresources, in an ``APIGroupDiscoveryList`` (staging/src/k8s.io/api/apidiscovery/v2/types.go).
    A request's resource never holds a ``/``, so a subresource entry never labels a resource."""
    out: set[str] = set()
    for item in doc.get("items") or []:
        group = ((item or {}).get("metadata") or {}).get("name") or ""
        for version in item.get("versions") or []:
            for res in (version or {}).get("resources") or []:
                name = (res or {}).get("resource") or ""
                if not name:
                    continue
                subs = [f"{name}/{(sub or {}).get('subresource') or ''}" for sub in res.get("subresources") or []]
                for label in (name, *subs):
                    out.add(f"{label}.{group}" if group else label)
    return out


def _labels_from_list(group: str, doc: Any) -> set[str]:
    """The same from a legacy ``APIResourceList`` of one group version."""
    out: set[str] = set()
    for res in (doc or {}).get("resources") or []:
        name = (res or {}).get("name") or ""  # "pods" or a subresource's "pods/status"
        if name:
            out.add(f"{name}.{group}" if group else name)
    return out


async def discover(fetch: Fetch) -> set[str]:
    """Every resource label the apiserver serves. Raises DiscoveryError when it cannot be read."""
    out: set[str] = set()
    for root in ("/api", "/apis"):
        status, doc = await fetch(root, _AGGREGATED)
        if status != 200 or not isinstance(doc, dict):
            raise DiscoveryError(f"{root}: the apiserver answered {status}")
        if doc.get("kind") == "APIGroupDiscoveryList":
            out |= labels_from_aggregated(doc)
            continue
        # The legacy form: APIVersions (/api) or APIGroupList (/apis), then each group version.
        if root == "/api":
            versions = [("", f"/api/{v}") for v in doc.get("versions") or []]
        else:
            versions = [
                (g.get("name") or "", f"/apis/{v.get('groupVersion')}")
                for g in doc.get("groups") or []
                for v in g.get("versions") or []
            ]
        for group, path in versions:
            status, listing = await fetch(path, "application/json")
            if status == 200:
                out |= _labels_from_list(group, listing)
    return out


class ServedResources:
    """The set of ``resource`` labels, kept from discovery (empty until it was first read)."""

    def __init__(self) -> None:
        self.known: frozenset[str] = frozenset()
        self._fetch: Fetch | None = None
        self._task: asyncio.Task[Any] | None = None
        self._last = -REFRESH_INTERVAL

    def label(self, resource: str) -> str:
        """``resource`` if the apiserver serves it (or ``""``, a non-resource request), else
        ``other`` (and discovery is read again if it was not read for a while)."""
        if not resource or resource in self.known:
            return resource
        self._refresh_soon()
        return OTHER

    def start(self, api: ApiClient) -> None:
        """Read discovery now (in the background, retried until it succeeds) and on misses."""

        async def fetch(path: str, accept: str) -> tuple[int, Any]:
            return await api.json("GET", path, headers={"Accept": accept}, timeout=30)

        self.start_with(fetch)

    def start_with(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._task = asyncio.create_task(self._first(), name="kproxy-discovery")

    async def stop(self) -> None:
        task, self._task, self._fetch = self._task, None, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _first(self) -> None:
        delay = 1.0
        while not await self._refresh():
            await asyncio.sleep(delay)
            delay = min(delay * 2, REFRESH_INTERVAL)

    def _refresh_soon(self) -> None:
        if self._fetch is None or (self._task is not None and not self._task.done()):
            return
        if time.monotonic() - self._last < REFRESH_INTERVAL:
            return
        self._task = asyncio.create_task(self._refresh(), name="kproxy-discovery")

    async def _refresh(self) -> bool:
        fetch = self._fetch
        if fetch is None:
            return True
        self._last = time.monotonic()
        try:
            self.known = frozenset(await discover(fetch))
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.warning("metrics: cannot read the apiserver's discovery (%s); resources are labelled %r", err, OTHER)
            return False
        return True
