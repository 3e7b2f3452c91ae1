"""The one expiring LRU (token reviews and access reviews)."""

from __future__ import annotations

from kproxy.identity.ttlcache import TTLCache


def test_a_value_lives_until_its_expiry() -> None:
    c: TTLCache[str, int | None] = TTLCache(4)
    c.put("a", 1, expires=10.0)
    c.put("none", None, expires=10.0)
    assert c.get("a", 9.9) == (True, 1)
    assert c.get("none", 9.9) == (True, None)  # a remembered None is a hit
    assert c.get("missing", 0.0) == (False, None)
    assert c.get("a", 10.0) == (False, None)  # expired at its time, and dropped
    assert len(c) == 1


def test_the_least_recently_used_goes_first() -> None:
    c: TTLCache[str, int] = TTLCache(2)
    c.put("a", 1, 100.0)
    c.put("b", 2, 100.0)
    assert c.get("a", 0.0) == (True, 1)  # a is now the most recent
    c.put("c", 3, 100.0)
    assert c.get("b", 0.0) == (False, None)
    assert c.get("a", 0.0) == (True, 1) and c.get("c", 0.0) == (True, 3)
    c.put("a", 4, 100.0)  # a replaced value is the most recent too
    c.put("d", 5, 100.0)
    assert len(c) == 2 and c.get("c", 0.0) == (False, None) and c.get("a", 0.0) == (True, 4)
    assert c.max_entries == 2
