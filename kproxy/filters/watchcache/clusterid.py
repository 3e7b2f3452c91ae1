"""Which cluster a persisted watch cache belongs to: the UID of its ``kube-system`` namespace.

A persisted state names its upstream by URL and by the CA kproxy verifies it with. Two clusters
can share both (every in-cluster kproxy sees ``https://kubernetes.default.svc``; one CA can sign
several clusters' apiservers; a node re-joined to another cluster keeps its disk), and a state
resumed in the wrong one would serve the first cluster's objects and resume its watch from the
first cluster's resource version, which the second may accept. So each snapshot records the
cluster's UID as Kubernetes tools name a cluster (the ``kube-system`` namespace's: the apiserver
makes that namespace once per cluster, pkg/controlplane/controller/systemnamespaces/
system_namespaces_controller.go, and a UID once at creation, never changed,
staging/src/k8s.io/apiserver/pkg/registry/rest/meta.go ``FillObjectMetaSystemFields``; read with
kproxy's own credentials, those the cache lists and watches with), and a state loaded from disk
is compared with the apiserver's before its watch resumes or anything of it is served while the
apiserver can be reached (:meth:`ResourceCache.verify
<kproxy.filters.watchcache.resource_cache.ResourceCache.verify>`).

One read per upstream at start (shared by every cached resource), and one more for the snapshot
of a cache listed again while kproxy runs (its watch could not be resumed, as when the address now
leads to another cluster): that list is recorded for the cluster that answered it. A 403 or 404 (kproxy may not get the
namespace) counts as a different cluster: the state is discarded and nothing is persisted, with
one warning naming the permission.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from kproxy.cacher import ListerWatcher, ListPage, NotResumed, UpstreamEvent
from kproxy.core.context import ApiClient

log = logging.getLogger("kproxy.watchcache")

PATH = "/api/v1/namespaces/kube-system"


class ClusterUnknown(Exception):
    """The apiserver answered the read of ``kube-system`` with something that is not its UID
    nor a refusal (a 5xx, a 401, 429): asked again later."""


def uid_of(status: int, doc: object) -> str | None:
    """kube-system's UID from the apiserver's answer to ``GET /api/v1/namespaces/kube-system``;
    None for a 403 or 404 (kproxy may not read it, or it does not exist); ClusterUnknown else."""
    if status in (403, 404):
        return None
    if status == 200 and isinstance(doc, dict):
        meta = doc.get("metadata")
        if isinstance(meta, dict) and doc.get("kind") == "Namespace" and meta.get("name") == "kube-system":
            uid = meta.get("uid")
            if isinstance(uid, str) and uid:
                return uid
    raise ClusterUnknown(f"GET {PATH}: HTTP {status}")


def same_cluster(recorded: str | None, found: str | None) -> bool:
    """Whether a state recorded for ``recorded`` may be resumed where the apiserver says ``found``:
    only both known and equal (a state without a UID is unverified, a UID that cannot be read
    proves nothing)."""
    return recorded is not None and found is not None and recorded == found


class ClusterIdentity:
    """kube-system's UID, read through ``api`` (kproxy's own credentials) and kept; read again
    for a caller that needs it as of a later time (a snapshot of a cache listed again)."""

    def __init__(self, api: ApiClient, *, timeout: float = 10.0) -> None:
        self._api = api
        self._timeout = timeout
        self.uid: str | None = None
        self.denied = ""  # why it cannot be read (a 403 or 404): nothing is persisted
        self._task: asyncio.Task[str | None] | None = None
        self._task_sent = 0.0  # when the request of ``_task`` was sent (time.monotonic())
        self._uid_sent = 0.0  # when the request that read ``uid`` was sent
        self._warned: set[tuple[str | None, str | None]] = set()
        self.reads = 0  # requests sent

    def settled(self) -> bool:
        return self.uid is not None or bool(self.denied)

    async def read(self, since: float = 0.0) -> str | None:
        """The UID (None: denied) as read by a request sent at ``since`` (``time.monotonic()``)
        or later; raises when the apiserver could not be asked or answered something else. One
        request at a time, shared by every caller it answers."""
        if self.uid is not None and self._uid_sent >= since:
            return self.uid
        if self.denied:
            return None
        if self._task is None or self._task.done() or self._task_sent < since:
            self._task_sent = time.monotonic()
            self._task = asyncio.create_task(self._get(self._task_sent), name="kproxy-watchcache-cluster")
            self._task.add_done_callback(_consume)
        return await asyncio.shield(self._task)

    async def _get(self, sent: float) -> str | None:
        self.reads += 1
        status, doc = await self._api.json("GET", PATH, timeout=self._timeout)
        uid = uid_of(status, doc)
        if uid is not None:
            if self.uid is not None and uid != self.uid:
                log.warning(
                    "watchcache: the apiserver is now the cluster whose kube-system namespace has UID %s"
                    " (it was %s): states listed from now on are recorded for it",
                    uid,
                    self.uid,
                )
            if sent >= self._uid_sent:
                self.uid, self._uid_sent = uid, sent
            return uid
        self.denied = f"HTTP {status}"
        log.warning(
            "watchcache: persist: kproxy's own credentials cannot read the cluster's identity (GET %s: HTTP %d):"
            " it needs `get` on `namespaces`, resourceName `kube-system`; persisted state is discarded and"
            " nothing is persisted until kproxy restarts with that permission",
            PATH,
            status,
        )
        return None

    def discarded(self, recorded: str | None, found: str | None) -> None:
        """Say (once per pair) that a state recorded for ``recorded`` was discarded."""
        if found is None or (recorded, found) in self._warned:
            return  # a denial was said when it was read
        self._warned.add((recorded, found))
        log.warning(
            "watchcache: persisted state recorded for the cluster whose kube-system namespace has UID %s;"
            " the apiserver's has UID %s: every resource's persisted state is discarded and listed again",
            recorded or "(none recorded)",
            found,
        )


#: Why a persisted state is listed again instead of resumed (``VerifiedListerWatcher``).
_NOT_RESUMED = {
    "discarded": "it is not this cluster's, or the cluster is unknown",
    "ahead": "it is ahead of the apiserver",
}


class StateDiscarded(Exception):
    """The state a read was about to be answered from was another cluster's, found out by the
    read's own request to the apiserver: dropped, and the read goes to the apiserver. Not an
    OSError: the apiserver was reached, and nothing is served as through an outage."""


class VerifiedListerWatcher:
    """``lw``, whose watches first have the cache's persisted state verified (``verify``: why it
    is not resumed, ``discarded`` or ``ahead``, and the watch then answers NotResumed so that the
    reflector lists; None: resumed), and
    whose reads' requests (a consistent read's latest resource version, a progress probe, a
    continue token's compaction probe) compare it first too (``before_contact``: raises
    StateDiscarded when it was dropped): such a request may be kproxy's first contact with the
    apiserver, and the cache must not take the apiserver's answer as its own freshness before
    the state is known to be this cluster's."""

    def __init__(
        self,
        lw: ListerWatcher,
        verify: Callable[[], Awaitable[str | None]],
        before_contact: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.lw = lw
        self._verify = verify
        self._before_contact = before_contact

    async def _contact(self) -> None:
        if self._before_contact is not None:
            await self._before_contact()

    async def list(self, *, limit: int, continue_token: str) -> ListPage:
        return await self.lw.list(limit=limit, continue_token=continue_token)

    async def watch(self, *, resource_version: str, send_initial_events: bool) -> AsyncIterator[UpstreamEvent]:
        # Raises what reaching the apiserver raised: the reflector retries as after a failed watch.
        why = await self._verify()
        if why is not None:
            raise NotResumed(f"the persisted state is not resumed ({_NOT_RESUMED[why]}); listing", why)
        async for ev in self.lw.watch(resource_version=resource_version, send_initial_events=send_initial_events):
            yield ev

    async def current_rv(self) -> int:
        await self._contact()
        return await self.lw.current_rv()

    async def progress_rv(self) -> int:
        await self._contact()
        return await self.lw.progress_rv()

    async def servable_at(self, rv: int) -> bool:
        await self._contact()
        return await self.lw.servable_at(rv)


def _consume(task: asyncio.Task[str | None]) -> None:
    if not task.cancelled():
        task.exception()
