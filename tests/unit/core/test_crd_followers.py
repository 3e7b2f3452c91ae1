"""The followers of the one CRD watch hear of every change from its events: a change, a relist's
differences, and a relist that went back in time (every definition then counts as changed)."""

from __future__ import annotations

import json
from typing import Any

from kproxy.cacher import MODIFIED, CacheEvent
from kproxy.codec import shared_codec
from kproxy.core.crdfeed import CrdFeed
from kproxy.core.discovery import Discovery, groups_of
from kproxy.filters.validation.openapi import SchemaCache


class _NoApi:
    """The feed is fed by hand here: nothing may be asked of the apiserver."""

    rtt = None

    def request(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no request expected")

    async def json(self, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        raise AssertionError("no request expected")


def crd(feed: CrdFeed, group: str, rv: int) -> Any:
    doc = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"things.{group}", "resourceVersion": str(rv), "uid": f"u-{group}"},
        "spec": {"group": group, "names": {"plural": "things", "kind": "Thing"}, "scope": "Namespaced"},
    }
    return feed.factory.from_json(json.dumps(doc).encode())


async def fetch(path: str, etag: str | None) -> tuple[int, bytes, str | None]:
    raise AssertionError("no schema read expected")


def test_every_change_reaches_the_followers_and_unsettles_its_group() -> None:
    discovery = Discovery(_NoApi())
    heard: list[set[str]] = []
    discovery.subscribe_crds(lambda events: heard.append(groups_of(events)))
    feed = CrdFeed(_NoApi(), shared_codec(), discovery._crds_changed)
    discovery._feed = feed  # fed by hand below, never started
    schemas = SchemaCache(fetch, settle_seconds=60)
    schemas.follow_crds(discovery)

    feed.cache.replace([crd(feed, "a.example", 10)], 10)  # the first list: nothing changed
    assert heard == [] and schemas.settled("a.example")
    assert not schemas.watching_crds  # no watch feeds the CRDs: custom resources left to the apiserver

    feed.cache.apply(MODIFIED, crd(feed, "a.example", 11))
    assert heard == [{"a.example"}] and not schemas.settled("a.example")

    # A relist (after a 410): its differences are events like any other.
    feed.cache.replace([crd(feed, "a.example", 11), crd(feed, "b.example", 12)], 12)
    assert heard[-1] == {"b.example"} and not schemas.settled("b.example")

    # A relist back in time (etcd restored): no history, every definition counts as changed.
    schemas._unsettled.clear()
    feed.cache.replace([crd(feed, "a.example", 5), crd(feed, "c.example", 6)], 6)
    assert heard[-1] == {"a.example", "c.example"}
    assert not schemas.settled("a.example") and not schemas.settled("c.example")

    schemas.unfollow_crds(discovery)
    feed.cache.apply(MODIFIED, crd(feed, "b.example", 20))
    assert schemas.settled("b.example")  # no longer following


def test_a_listener_that_fails_does_not_keep_the_others_from_hearing() -> None:
    discovery = Discovery(_NoApi())
    heard: list[CacheEvent] = []

    def broken(events: list[CacheEvent]) -> None:
        raise RuntimeError("a follower's bug")

    discovery.subscribe_crds(broken)
    discovery.subscribe_crds(heard.extend)
    feed = CrdFeed(_NoApi(), shared_codec(), discovery._crds_changed)
    feed.cache.replace([], 1)
    feed.cache.apply(MODIFIED, crd(feed, "a.example", 2))
    assert [e.obj.name for e in heard] == ["things.a.example"]
