"""The bodies of a cached read's answer: whole lists' encoded items kept per resource (and the
last body made around them), and the reply that carries a body the cache made."""

from __future__ import annotations

from typing import Any

from multidict import CIMultiDict

from kproxy.core.chain import BytesBody, Reply
from kproxy.filters.watchcache.encode import CONTENT_TYPES, assemble

__all__ = ["MAX_WHOLE_LISTS", "WholeList", "cached_reply"]

MAX_WHOLE_LISTS = 64  # whole lists kept per resource (per media type, namespace, selectors)


class WholeList:
    """One whole list's encoded items, and the last body made around them (one per rv)."""

    __slots__ = ("_last", "items")

    def __init__(self, items: bytes) -> None:
        self.items = items
        self._last: tuple[int, str, bool, bytes] | None = None

    def body(self, kind: Any, rv: int, media_type: str, pretty: bool) -> bytes:
        last = self._last
        if last is not None and last[:3] == (rv, media_type, pretty):
            return last[3]
        data = assemble(kind, self.items, rv, "", None, media_type, pretty)
        self._last = (rv, media_type, pretty, data)
        return data


def cached_reply(body: bytes, media_type: str) -> Reply:
    """A read answered from the cache: 200 in its media type, with the apiserver's ``Cache-Control``."""
    headers = CIMultiDict({"Content-Type": CONTENT_TYPES[media_type], "Cache-Control": "no-cache, private"})
    return Reply(200, headers, BytesBody(body, media_type))
