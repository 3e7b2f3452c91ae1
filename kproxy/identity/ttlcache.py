"""The one small cache of decisions that expire: an LRU bounded in entries, each entry with its
own expiry time. The token reviews of ``authn`` and the access reviews of ``access`` use it.

No clock of its own: callers pass ``now`` and the expiry, so tests drive time.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """At most ``max_entries`` values, the least recently used dropped first; a value is returned
    until its expiry (``expires <= now`` is a miss, and the entry is dropped)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, now: float) -> tuple[bool, V | None]:
        """``(True, value)`` for a live entry (now the most recently used), else ``(False, None)``."""
        hit = self._data.get(key)
        if hit is None:
            return False, None
        expires, value = hit
        if expires <= now:
            del self._data[key]
            return False, None
        self._data.move_to_end(key)
        return True, value

    def put(self, key: K, value: V, expires: float) -> None:
        """Remember ``value`` until ``expires`` (the most recently used; the oldest go past the bound)."""
        self._data[key] = (expires, value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
