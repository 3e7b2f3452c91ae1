"""Which cluster a persisted watch cache belongs to (kproxy.filters.watchcache.cluster and the
``cluster`` recorded by kproxy.cacher.persist): the apiserver's answer read as kube-system's UID,
the comparison, one request shared by every reader, and the snapshot's record of it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from kproxy.cacher import CachedObject, Kind, WatchCache, object_key
from kproxy.cacher.persist import ResourceStore, read_state
from kproxy.filters.watchcache.clusterid import ClusterIdentity, ClusterUnknown, same_cluster, uid_of

UID = "6c0b7b6e-0000-4000-8000-000000000001"
GIZMO = Kind("wc.kproxy.test/v1", "Gizmo", "GizmoList", protobuf=False)
IDENTITY = {"upstream": "https://kubernetes.default.svc ca-sha256:00", "resource": "gizmos"}
IDENT = "wc.kproxy.test+v1+gizmos"


def namespace(name: str = "kube-system", uid: Any = UID, kind: str = "Namespace") -> dict[str, Any]:
    return {"kind": kind, "apiVersion": "v1", "metadata": {"name": name, "uid": uid}}


def test_uid_of_the_apiserver_answer() -> None:
    assert uid_of(200, namespace()) == UID
    assert uid_of(403, {"kind": "Status", "code": 403}) is None  # may not read it: proves nothing
    assert uid_of(404, {"kind": "Status", "code": 404}) is None
    for status, doc in [
        (200, namespace(name="default")),
        (200, namespace(uid="")),
        (200, namespace(uid=7)),
        (200, namespace(kind="Status")),
        (200, "not json"),
        (401, {"kind": "Status"}),
        (500, {"kind": "Status"}),
        (429, None),
    ]:
        with pytest.raises(ClusterUnknown):
            uid_of(status, doc)


def test_only_a_recorded_uid_equal_to_the_found_one_is_the_same_cluster() -> None:
    assert same_cluster(UID, UID)
    assert not same_cluster(UID, UID.replace("1", "2"))
    assert not same_cluster(None, UID)  # recorded before the UID was: unverified
    assert not same_cluster(UID, None)  # kproxy may not read it
    assert not same_cluster(None, None)


class FakeApi:
    def __init__(self, *answers: tuple[int, Any] | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def json(self, method: str, path: str, *, timeout: float | None = None) -> tuple[int, Any]:
        assert (method, path) == ("GET", "/api/v1/namespaces/kube-system")
        self.calls += 1
        await self.gate.wait()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_one_request_shared_by_every_reader_and_kept() -> None:
    api = FakeApi((200, namespace()))
    api.gate.clear()
    ident = ClusterIdentity(api)  # type: ignore[arg-type]
    readers = [asyncio.ensure_future(ident.read()) for _ in range(20)]
    await asyncio.sleep(0)
    api.gate.set()
    assert await asyncio.gather(*readers) == [UID] * 20
    assert await ident.read() == UID
    assert api.calls == 1 and ident.settled()


async def test_a_failed_read_is_tried_again_a_refusal_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeApi(ConnectionRefusedError("refused"), (403, {"kind": "Status"}))
    ident = ClusterIdentity(api)  # type: ignore[arg-type]
    with pytest.raises(ConnectionRefusedError):
        await ident.read()
    assert not ident.settled()
    assert await ident.read() is None
    assert await ident.read() is None
    assert api.calls == 2 and ident.settled() and ident.denied == "HTTP 403"
    (line,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "`get` on `namespaces`, resourceName `kube-system`" in line.getMessage()


async def test_read_again_for_a_later_time(caplog: pytest.LogCaptureFixture) -> None:
    """A caller that needs the UID as of a later time (a snapshot of a cache listed again) gets a
    new read, shared by the callers asking for that time or earlier; the cluster behind the URL
    having changed is said once."""
    other = "99999999-8888-4777-8666-555555555555"
    api = FakeApi((200, namespace()), (200, namespace(uid=other)))
    ident = ClusterIdentity(api)  # type: ignore[arg-type]
    assert await ident.read() == UID
    later = time.monotonic()
    api.gate.clear()
    readers = [asyncio.ensure_future(ident.read(later)) for _ in range(5)]
    await asyncio.sleep(0)
    api.gate.set()
    assert await asyncio.gather(*readers) == [other] * 5
    assert await ident.read() == other and await ident.read(later) == other
    assert api.calls == 2
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"has UID {other} (it was {UID})" in line


def test_mismatch_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    ident = ClusterIdentity(FakeApi())  # type: ignore[arg-type]
    for _ in range(3):
        ident.discarded("recorded-uid", UID)
    ident.discarded(None, UID)
    ident.discarded("recorded-uid", None)  # a refusal: said when it was read
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(lines) == 2
    assert "has UID recorded-uid" in lines[0] and f"the apiserver's has UID {UID}" in lines[0]
    assert "(none recorded)" in lines[1]


# -- what the snapshot records -------------------------------------------------------------------


def gizmo(name: str, rv: int) -> CachedObject:
    raw = orjson.dumps({"kind": "Gizmo", "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}})
    return CachedObject(object_key("ns", name), "ns", name, rv, {}, {}, json=raw)


class Source:
    def __init__(self, *answers: str | Exception | None) -> None:
        self.answers = list(answers)
        self.asked: list[float] = []  # each read's ``since``

    def settled(self) -> bool:
        return False

    async def read(self, since: float = 0.0) -> str | None:
        self.asked.append(since)
        answer = self.answers[0] if len(self.answers) == 1 else self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def written(tmp: Path, source: Source, *, ticks: int = 0) -> ResourceStore:
    cache = WatchCache(GIZMO)
    store = ResourceStore(tmp, IDENT, IDENTITY, None, cluster=source, progress_interval=0.01)
    store.attach(cache, None)
    cache.replace([gizmo("a", 5), gizmo("b", 6)], 6)
    for _ in range(3):
        await asyncio.sleep(0)
    if store._compacting is not None:
        await store._compacting
    for _ in range(ticks):
        await asyncio.sleep(0.02)
        if store._compacting is not None:
            await store._compacting
    return store


async def test_snapshot_records_the_cluster(tmp_path: Path) -> None:
    store = await written(tmp_path, Source(UID))
    await store.close()
    loaded = read_state(tmp_path, IDENT, IDENTITY, None)
    assert loaded is not None and loaded.cluster == UID and len(loaded.objects) == 2


async def test_without_a_cluster_source_nothing_is_recorded(tmp_path: Path) -> None:
    cache = WatchCache(GIZMO)
    store = ResourceStore(tmp_path, IDENT, IDENTITY, None)
    store.attach(cache, None)
    cache.replace([gizmo("a", 5)], 5)
    await asyncio.sleep(0)
    if store._compacting is not None:
        await store._compacting
    await store.close()
    loaded = read_state(tmp_path, IDENT, IDENTITY, None)
    assert loaded is not None and loaded.cluster is None  # the state of a kproxy that recorded none


async def test_a_refused_cluster_persists_nothing(tmp_path: Path) -> None:
    store = await written(tmp_path, Source(None))
    await store.close()
    assert not list(tmp_path.glob(f"{IDENT}*"))
    assert store.failed


async def test_snapshot_waits_for_the_cluster_to_be_known(tmp_path: Path) -> None:
    store = await written(tmp_path, Source(ConnectionRefusedError("down"), UID), ticks=5)
    await store.close()
    loaded = read_state(tmp_path, IDENT, IDENTITY, None)
    assert loaded is not None and loaded.cluster == UID and len(loaded.objects) == 2


async def test_a_list_taken_again_records_the_uid_read_after_it(tmp_path: Path) -> None:
    """The cache is listed again (its watch could not be resumed: the cluster behind the URL may
    have changed): the snapshot of that list records the UID as read after the list, not the one
    read at start."""
    source = Source(UID)
    store = await written(tmp_path, source)
    assert source.asked == [0.0]
    source.answers = ["uid-of-the-cluster-now"]
    cache = store._cache
    assert cache is not None
    before = time.monotonic()
    cache.replace([gizmo("c", 20)], 20)  # a relist
    for _ in range(3):
        await asyncio.sleep(0)
    if store._compacting is not None:
        await store._compacting
    await store.close()
    assert source.asked[-1] >= before
    loaded = read_state(tmp_path, IDENT, IDENTITY, None)
    assert loaded is not None and loaded.cluster == "uid-of-the-cluster-now"
    assert len(loaded.objects) == 1


def restore(
    ns: str, name: str, rv: int, labels: dict[str, str], fields: dict[str, str], proto: bytes | None, js: bytes | None
) -> CachedObject:
    assert proto is None and js is not None
    return CachedObject(object_key(ns, name), ns, name, rv, labels, fields, json=js)


async def test_an_unconfirmed_state_is_never_rewritten_as_the_found_cluster(tmp_path: Path) -> None:
    """A state loaded from disk whose cluster is not yet compared keeps what it recorded: no
    snapshot of it (a compaction, the one written on shutdown) records the UID found since."""
    await (await written(tmp_path, Source("uid-of-another-cluster"))).close()
    before = (tmp_path / f"{IDENT}.snapshot").read_bytes()
    cache = WatchCache(GIZMO)
    again = ResourceStore(tmp_path, IDENT, IDENTITY, None, cluster=Source(UID), progress_interval=0.01)
    loaded = again.load(restore, cache)
    assert loaded is not None and loaded.cluster == "uid-of-another-cluster"
    again.unconfirmed = True
    again.attach(cache, loaded)
    again.compact()
    assert again._compacting is None
    await again.close()
    assert (tmp_path / f"{IDENT}.snapshot").read_bytes() == before
