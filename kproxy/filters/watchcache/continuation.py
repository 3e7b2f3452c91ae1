"""Continuing a paginated list from the cache: the snapshot a token names, or the apiserver's 410
once etcd has compacted its revision.

The apiserver answers a continue whose revision is compacted with ``410 Expired`` and a token that
continues after the same key at the latest resource version (``etcd3/store.go``,
``handleCompactedErrorForPaging``); the cache answers the same, byte for byte, as soon as the
upstream would (``kproxy.cacher.compaction``), and serves the new token as the apiserver's cacher
does: a consistent read from the key (``plan.py``).
"""

from __future__ import annotations

import logging

from kproxy.cacher import ContinueToken, Snapshot
from kproxy.cacher.continue_token import encode_inconsistent
from kproxy.core.status import StatusError, resource_expired

from .resource_cache import ResourceCache

log = logging.getLogger("kproxy.watchcache")

# staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go
INCONSISTENT_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a "
    "new list without the continue parameter, or use the continue token in this response to retrieve "
    "the remainder of the results. Continuing with the provided token results in an inconsistent list "
    "- objects that were created, modified, or deleted between the time the first chunk was returned "
    "and now may show up in the list."
)


def inconsistent_continue(cont: ContinueToken) -> StatusError:
    """The apiserver's 410 for a continue token whose revision etcd compacted."""
    return resource_expired(INCONSISTENT_CONTINUE, encode_inconsistent(cont.start))


async def continue_snapshot(rc: ResourceCache, cont: ContinueToken) -> Snapshot | None:
    """The snapshot ``cont`` continues, or None when the upstream should answer (the cache's
    history no longer reaches it, or the upstream cannot say whether it compacted it). Raises
    the apiserver's 410 when etcd compacted the token's revision."""
    cache = rc.cache
    if not cache.reaches(cont.rv):
        return None  # the apiserver continues the same token from etcd (or says 410)
    try:
        expired = await rc.reflector.compaction.expired(cont.rv)
    except Exception as err:
        log.debug("watchcache: %s: compaction probe at %d failed: %s", rc.spec.label, cont.rv, err)
        return None
    if expired:
        raise inconsistent_continue(cont)
    return cache.snapshot(cont.rv)
