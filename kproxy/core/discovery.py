"""The apiserver's discovery and its CustomResourceDefinitions, read and watched once for the process.

Discovery (which resources the apiserver serves, at which versions, with which verbs) has one
reader here; the metrics' ``resource`` labels (``kproxy.server.servedresources``) and the watch
cache's choice of resources (``kproxy.filters.watchcache.resources``) both read what it read. The
aggregated form (``apidiscovery.k8s.io/v2``: two requests, ``/api`` and ``/apis``) is asked for;
an apiserver that answers the legacy form is read group version by group version.

CustomResourceDefinitions have one list+watch here (:class:`CrdFeed`: the cache engine's
``Reflector`` over ``kproxy.core.listwatch``, so a broken watch is resumed, a 410 relists and the
relist's differences arrive as events). The validation filter follows schema changes from its
events, and the watch cache both serves ``customresourcedefinitions`` from it (with ``*``) and
drops a deleted definition's cache from them: kproxy holds one apiserver watch of CRDs, whoever
reads them. It starts when something first asks for it (:meth:`Discovery.crds`).

Offered to filters as ``ctx.discovery`` (``kproxy.core.context.FilterContext``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kproxy.core.ownapi import OwnApi

if TYPE_CHECKING:  # the cache engine and the codec load with the first follower of CRDs
    from kproxy.cacher import CacheEvent
    from kproxy.codec import ProtobufCodec
    from kproxy.core.crdfeed import CrdFeed

log = logging.getLogger("kproxy.discovery")

_AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"



class DiscoveryError(Exception):
    """Discovery could not be read."""


@dataclass(frozen=True, slots=True)
class ServedResource:
    """One resource of one served group version (subresources are named in ``subresources``)."""

    group: str
    version: str
    resource: str
    #: Whether ``version`` is its group's preferred version.
    preferred: bool
    namespaced: bool
    kind: str
    verbs: tuple[str, ...] = ()
    singular: str = ""
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``resource[.group]``: how metrics, logs and configs name it."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def labels(self) -> Iterator[str]:
        """Its label and ``resource/subresource[.group]`` of each subresource (a request's
        resource never holds a ``/``, so a subresource entry never labels a resource)."""
        yield self.label
        for sub in self.subresources:
            named = f"{self.resource}/{sub}"
            yield f"{named}.{self.group}" if self.group else named

    @property
    def list_watch(self) -> bool:
        return "list" in self.verbs and "watch" in self.verbs


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value or () if isinstance(v, str))


def from_aggregated(doc: Any) -> list[ServedResource]:
    """The resources of an ``APIGroupDiscoveryList`` (staging/src/k8s.io/api/apidiscovery/v2/types.go:
    groups in priority order, each group's versions in descending order of preference, the first
    one preferred)."""
    out: list[ServedResource] = []
    for item in (doc or {}).get("items") or []:
        group = str(((item or {}).get("metadata") or {}).get("name") or "")
        for i, version in enumerate(item.get("versions") or []):
            v = str((version or {}).get("version") or "")
            if not v:
                continue
            for res in (version or {}).get("resources") or []:
                name = str((res or {}).get("resource") or "")
                if not name or "/" in name:
                    continue
                subs = tuple(
                    str(s.get("subresource")) for s in res.get("subresources") or [] if (s or {}).get("subresource")
                )
                out.append(
                    ServedResource(
                        group,
                        v,
                        name,
                        preferred=i == 0,
                        namespaced=res.get("scope") == "Namespaced",
                        kind=str((res.get("responseKind") or {}).get("kind") or ""),
                        verbs=_strs(res.get("verbs")),
                        singular=str(res.get("singularResource") or ""),
                        short_names=_strs(res.get("shortNames")),
                        subresources=subs,
                    )
                )
    return out


def from_resource_list(group: str, version: str, preferred: bool, doc: Any) -> list[ServedResource]:
    """The resources of a legacy ``APIResourceList`` of one group version (subresources are its
    ``resource/subresource`` entries)."""
    entries = [e for e in (doc or {}).get("resources") or [] if isinstance(e, dict) and e.get("name")]
    subs: dict[str, list[str]] = {}
    for e in entries:
        name, _, sub = str(e["name"]).partition("/")
        if sub:
            subs.setdefault(name, []).append(sub)
    return [
        ServedResource(
            group,
            version,
            str(e["name"]),
            preferred=preferred,
            namespaced=bool(e.get("namespaced")),
            kind=str(e.get("kind") or ""),
            verbs=_strs(e.get("verbs")),
            singular=str(e.get("singularName") or ""),
            short_names=_strs(e.get("shortNames")),
            subresources=tuple(subs.get(str(e["name"]), ())),
        )
        for e in entries
        if "/" not in str(e["name"])
    ]


#: GET a discovery path with an Accept header -> (status, decoded JSON).
Fetch = Callable[[str, str], Awaitable[tuple[int, Any]]]


async def read_discovery(fetch: Fetch) -> list[ServedResource]:
    """Every resource the apiserver serves: the core group first, then the others in discovery's
    priority order. Raises DiscoveryError when ``/api`` or ``/apis`` cannot be read."""
    out: list[ServedResource] = []
    for root in ("/api", "/apis"):
        status, doc = await fetch(root, _AGGREGATED)
        if status != 200 or not isinstance(doc, dict):
            raise DiscoveryError(f"{root}: the apiserver answered {status}")
        if doc.get("kind") == "APIGroupDiscoveryList":
            out += from_aggregated(doc)
            continue
        # The legacy form: APIVersions (/api) or APIGroupList (/apis), then each group version
        # (one that does not answer, an aggregated API that is down, is left out).
        if root == "/api":
            versions = [("", str(v), True) for v in doc.get("versions") or ["v1"]]
        else:
            versions = []
            for g in doc.get("groups") or []:
                preferred = (g.get("preferredVersion") or {}).get("version")
                for v in g.get("versions") or []:
                    # GroupVersionForDiscovery: groupVersion "group/version", and version alone.
                    version = str(v.get("version") or str(v.get("groupVersion") or "").rpartition("/")[2])
                    versions.append((str(g.get("name") or ""), version, preferred in (None, version)))
        for group, version, is_preferred in versions:
            path = f"/apis/{group}/{version}" if group else f"/api/{version}"
            status, listing = await fetch(path, "application/json")
            if status == 200:
                out += from_resource_list(group, version, is_preferred, listing)
    return out


#: The listener of CRD events: each event's object is a definition (its name ``plural.group``).
CrdListener = Callable[[list["CacheEvent"]], None]


class Discovery:
    """The process's one reader of discovery and one watch of CustomResourceDefinitions.

    Nothing is asked of the apiserver until something reads (:meth:`read`, :meth:`read_soon`,
    :meth:`keep_reading`) or follows CRDs (:meth:`crds`); constructing it is free."""

    def __init__(self, api: OwnApi, codec: Callable[[], ProtobufCodec] | None = None) -> None:
        self._api = api
        self._codec = codec
        #: What the last successful read found, and its ``resource[.group]`` and subresource labels.
        self.resources: tuple[ServedResource, ...] = ()
        self.labels: frozenset[str] = frozenset()
        #: Discovery reads sent (each one is two requests in the aggregated form).
        self.reads = 0
        self._lock = asyncio.Lock()
        self._started = 0  # reads started
        self._succeeded = 0  # the number of the last read that succeeded
        self._last = -1e9  # monotonic time the last read started
        self._background: asyncio.Task[None] | None = None
        self._keeping: asyncio.Task[None] | None = None
        self._feed: CrdFeed | None = None
        self._crd_listeners: list[CrdListener] = []

    # -- discovery --------------------------------------------------------------------------------
    async def _fetch(self, path: str, accept: str) -> tuple[int, Any]:
        return await self._api.json("GET", path, headers={"Accept": accept}, timeout=30)

    async def read(self, *, fresh: bool = True) -> tuple[ServedResource, ...]:
        """Discovery as read by a read started after this call (callers that wait together
        share one), or with ``fresh=False`` by the one under way if there is one. Raises
        (DiscoveryError, or the line's error) when it cannot be read."""
        wanted = self._started if not fresh and self._lock.locked() else self._started + 1
        async with self._lock:
            if self._succeeded >= wanted:
                return self.resources
            self._started += 1
            number = self._started
            self._last = time.monotonic()
            self.reads += 1
            found = tuple(await read_discovery(self._fetch))
            self.resources = found
            self.labels = frozenset(label for r in found for label in r.labels())
            self._succeeded = number
            return found

    def read_soon(self, min_interval: float) -> None:
        """Read discovery again in the background, unless a read started less than
        ``min_interval`` seconds ago or one is under way (a request naming a resource not known
        yet asks for this: random names cost at most one read per interval)."""
        if self._background is not None and not self._background.done():
            return
        if self._lock.locked() or time.monotonic() - self._last < min_interval:
            return
        self._background = asyncio.create_task(self._read_logged(), name="kproxy-discovery")

    async def _read_logged(self) -> None:
        try:
            await self.read()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.warning("cannot read the apiserver's discovery (%s)", err)

    def keep_reading(self, max_delay: float = 30.0) -> None:
        """Read discovery now, in the background, retried until a read succeeds."""
        if self._keeping is None:
            self._keeping = asyncio.create_task(self._first(max_delay), name="kproxy-discovery-first")

    async def _first(self, max_delay: float) -> None:
        delay = 1.0
        while not self._succeeded:
            try:
                await self.read(fresh=False)
                return
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("cannot read the apiserver's discovery (%s); retrying in %.0f s", err, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)

    # -- CustomResourceDefinitions ----------------------------------------------------------------
    def crds(self) -> CrdFeed:
        """The CRD feed, its list+watch started by the first call."""
        if self._feed is None:
            # Imported here: a gateway that follows no CRDs never loads the cache engine or the codec.
            from kproxy.codec import shared_codec
            from kproxy.core.crdfeed import CrdFeed

            codec = self._codec() if self._codec is not None else shared_codec()
            self._feed = CrdFeed(self._api, codec, self._crds_changed)
            self._feed.start()
        return self._feed

    @property
    def crd_feed(self) -> CrdFeed | None:
        """The CRD feed if something started it, else None (nothing watches CRDs)."""
        return self._feed

    def subscribe_crds(self, listener: CrdListener) -> None:
        """Call ``listener`` with every change of the CRDs the feed sees (once it runs)."""
        self._crd_listeners.append(listener)

    def unsubscribe_crds(self, listener: CrdListener) -> None:
        with contextlib.suppress(ValueError):
            self._crd_listeners.remove(listener)

    def _crds_changed(self, events: list[CacheEvent]) -> None:
        for listener in list(self._crd_listeners):
            try:
                listener(events)
            except Exception:  # one follower's bug must not stop the others hearing of it
                log.exception("a CRD listener failed")

    async def close(self) -> None:
        tasks = [t for t in (self._background, self._keeping) if t is not None]
        self._background = self._keeping = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        feed, self._feed = self._feed, None
        if feed is not None:
            await feed.stop()


def crd_group(name: str) -> str:
    """The group of a definition named ``plural.group`` (the apiserver requires that name:
    apiextensions-apiserver/pkg/apis/apiextensions/validation/validation.go)."""
    return name.partition(".")[2]


def groups_of(events: Iterable[CacheEvent]) -> set[str]:
    """The groups whose definitions the events changed."""
    return {crd_group(ev.obj.name) for ev in events}
