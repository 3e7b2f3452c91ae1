"""Would the apiserver let this caller make this write at all?

The apiserver authorizes a request before it decodes the body, so a caller without permission
gets a 403, never a strict-decoding 400. Before kproxy answers a Strict failure itself it asks
the same question with a SubjectAccessReview for the caller (the identity the apiserver gave
the caller's token, or kproxy's own identity in ``credentials: proxy``). Answers are cached for
``ttl`` seconds per (user, groups, verb, resource, namespace, name); when the review cannot be
made, kproxy does not answer itself.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from kproxy.chain import Identity
from kproxy.requestinfo import RequestInfo

#: review(body) -> (status, decoded answer): a POST to subjectaccessreviews with kproxy's credentials.
Review = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]


class AccessCache:
    """SubjectAccessReview answers, bounded in size and age."""

    def __init__(self, review: Review, *, ttl: float = 10.0, max_entries: int = 4096) -> None:
        self._review = review
        self.ttl = ttl
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[Any, ...], tuple[bool, float]] = OrderedDict()
        self.reviews = 0

    async def allowed(self, identity: Identity, info: RequestInfo) -> bool:
        key = (
            identity.user,
            identity.groups,
            identity.uid,
            tuple(sorted((k, tuple(v)) for k, v in identity.extra.items())),
            info.verb,
            info.api_group,
            info.api_version,
            info.resource,
            info.subresource,
            info.namespace,
            info.name,
        )
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        attrs = {
            "verb": info.verb,
            "group": info.api_group,
            "version": info.api_version,
            "resource": info.resource,
            "subresource": info.subresource,
            "namespace": info.namespace,
            "name": info.name,
        }
        spec: dict[str, Any] = {
            "resourceAttributes": {k: v for k, v in attrs.items() if v},
            "user": identity.user,
            "groups": list(identity.groups),
        }
        if identity.uid:
            spec["uid"] = identity.uid
        if identity.extra:
            spec["extra"] = {k: list(v) for k, v in identity.extra.items()}
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        self.reviews += 1
        try:
            status, answer = await self._review(body)
        except Exception:
            return False
        if status not in (200, 201) or not isinstance(answer, dict):
            return False
        result = bool((answer.get("status") or {}).get("allowed"))
        self._cache[key] = (result, now + self.ttl)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return result
