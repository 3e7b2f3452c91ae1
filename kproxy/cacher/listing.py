"""Choosing a list's items from a snapshot: namespace, selectors, and one page of them.

Follows the apiserver's cacher and ``storage.PrepareContinueToken``: items in key order starting
after the continue key; a page ends after ``limit`` matching items; when more match, a continue
token is issued at the snapshot's resource version; ``remainingItemCount`` is given only when
no selector was used, and counts every item after the page.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from .continue_token import encode_continue
from .objects import CachedObject
from .watch_cache import Snapshot

Predicate = Callable[[CachedObject], bool]


@dataclass(slots=True)
class Page:
    items: list[CachedObject]
    rv: int
    continue_token: str = ""
    remaining: int | None = None


def select(
    snap: Snapshot,
    *,
    namespace: str = "",
    predicate: Predicate | None = None,
    limit: int = 0,
    start: str = "",
) -> Page:
    """One page of ``snap``. ``start`` is the continue token's key relative to the list's
    prefix (``namespace/`` for a namespaced list); ``limit`` 0 means everything."""
    lo, hi = snap.namespace_range(namespace)
    prefix = namespace + "/" if namespace else ""
    if start:
        # Relative to the list's etcd prefix, which has no trailing slash: "/name\0" or "/ns/name\0".
        lo = max(lo, bisect.bisect_left(snap.keys, prefix + start.removeprefix("/"), lo, hi))
    objects = snap.objects
    if limit <= 0:
        if predicate is None:
            return Page(list(objects[lo:hi]), snap.rv)
        return Page([o for o in objects[lo:hi] if predicate(o)], snap.rv)
    items: list[CachedObject] = []
    i = lo
    if predicate is None:
        end = min(hi, lo + limit)
        items = list(objects[lo:end])
        i = end
    else:
        while i < hi and len(items) < limit:
            o = objects[i]
            i += 1
            if predicate(o):
                items.append(o)
    if i >= hi or not items:
        # The cacher issues a token whenever it stopped before the end, matching or not.
        return Page(items, snap.rv)
    last = items[-1].key
    rel = "/" + (last[len(prefix) :] if prefix else last)
    remaining = hi - i if predicate is None else None
    return Page(items, snap.rv, encode_continue(snap.rv, rel), remaining)
