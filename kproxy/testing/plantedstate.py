"""Another cluster's persisted watch-cache state, planted with kproxy's own writer.

The tests of a persisted state's cluster check (``kproxy/filters/watchcache/clusterid.py``) take
the state a running kproxy wrote for the session cluster and write it again as if another
cluster had: its objects plus one that exists only on disk (``PLANTED``), recorded for another
kube-system UID, and at another resource version when asked. Nothing is hand-crafted: the bytes
are the writer's (``kproxy.cacher.persist``)."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

from kproxy.cacher import Kind, WatchCache
from kproxy.cacher.fields import builtin_fields
from kproxy.cacher.ingest import ObjectFactory
from kproxy.cacher.persist import ResourceStore, persisted, read_state
from kproxy.codec import ProtobufCodec, decode_envelope
from kproxy.testing.proxyproc import RunningProxy

__all__ = ["IDENT", "PLANTED", "Recorded", "get_as", "plant", "state_on_disk"]

#: The configmaps' state's file id.
IDENT = "core+v1+configmaps"
#: The name of the object only the planted state holds.
PLANTED = "planted-only-on-disk"


class Recorded:
    """The cluster the writer records (kproxy's ``ClusterSource``): a fixed UID."""

    def __init__(self, uid: str) -> None:
        self.uid = uid

    def settled(self) -> bool:
        return True

    async def read(self, since: float = 0.0) -> str | None:
        return self.uid


def plant(state: Path, namespace: str, cluster: str, rv: int | None = None) -> int:
    """Rewrite the configmaps' state in ``state`` with kproxy's writer: its objects plus
    ``PLANTED`` (in ``namespace``), recorded for ``cluster``, at ``rv`` (default: the state's
    own). Returns the state's resource version."""
    ((_, head),) = [(i, h) for i, h in persisted(state, None) if i == IDENT]
    assert head is not None
    spec = head["spec"]
    kind = Kind(spec["api_version"], spec["kind"], spec["list_kind"], protobuf=spec["protobuf"])
    codec = ProtobufCodec()
    factory = ObjectFactory(kind, builtin_fields("", "configmaps"), codec)
    at: list[int] = []

    async def rewrite() -> None:
        loaded_cache = WatchCache(kind)
        loaded = ResourceStore(state, IDENT, head["identity"], None, spec=spec).load(factory.restore, loaded_cache)
        assert loaded is not None
        at.append(rv if rv is not None else loaded_cache.applied_rv)
        meta = {"name": PLANTED, "namespace": namespace, "resourceVersion": str(at[0])}
        meta |= {"uid": "00000000-0000-4000-8000-000000000005", "creationTimestamp": "2026-11-29T00:00:00Z"}
        doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"from": "elsewhere"}}
        planted = factory.from_proto(decode_envelope(codec.from_json(json.dumps(doc).encode())).raw)
        cache = WatchCache(kind)
        store = ResourceStore(state, IDENT, head["identity"], None, spec=spec, cluster=Recorded(cluster))
        store.attach(cache, None)
        cache.replace([*loaded_cache.store.values(), planted], at[0])
        await asyncio.sleep(0)
        if store._compacting is not None:
            await store._compacting
        await store.close()

    asyncio.run(rewrite())
    written = read_state(state, IDENT, head["identity"], None)
    assert written is not None and written.cluster == cluster and written.rv == at[0]
    assert any(PLANTED.encode() in o for o in written.objects)
    return at[0]


def state_on_disk(state: Path) -> tuple[str | None, bool] | None:
    """(recorded cluster, whether ``PLANTED`` is in it) of the configmaps' snapshot; None without one."""
    found = [h for i, h in persisted(state, None) if i == IDENT]
    if not found or found[0] is None:
        return None
    loaded = read_state(state, IDENT, found[0]["identity"], None)
    if loaded is None:
        return None
    return loaded.cluster, any(PLANTED.encode() in o for o in loaded.objects)


def get_as(rp: RunningProxy, path: str, token: str | None) -> tuple[int, bytes]:
    """GET through kproxy, as the bearer ``token`` when given."""
    if token is None:
        return rp.get(path)
    ctx = ssl.create_default_context(cafile=str(rp.ca_file)) if rp.ca_file else None
    req = urllib.request.Request(rp.url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
