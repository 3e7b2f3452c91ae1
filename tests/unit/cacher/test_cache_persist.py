"""The watch cache on disk (kproxy.cacher.persist): what is written is what loads back, a torn,
truncated or altered file never loads, secrets are encrypted, files and directory are private."""

from __future__ import annotations

import asyncio
import base64
import os
import stat
from pathlib import Path
from typing import Any

import orjson
import pytest

from kproxy.cacher import ADDED, DELETED, MODIFIED, CachedObject, Kind, WatchCache, object_key
from kproxy.cacher.persist import ResourceStore, Sealer, UnsafeStorage, prepare_dir, read_key_file, read_state

GIZMO = Kind("wc.kproxy.test/v1", "Gizmo", "GizmoList", protobuf=False)
IDENTITY = {"upstream": "https://127.0.0.1:6443", "resource": "gizmos"}
IDENT = "wc.kproxy.test+v1+gizmos"


def obj(name: str, rv: int, value: str = "v") -> CachedObject:
    raw = orjson.dumps(
        {"kind": "Gizmo", "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}, "v": value}
    )
    return decode(raw)


def decode(raw: bytes) -> CachedObject:
    meta = orjson.loads(raw)["metadata"]
    ns, name = meta["namespace"], meta["name"]
    return CachedObject(object_key(ns, name), ns, name, int(meta["resourceVersion"]), {"v": "1"}, {}, json=raw)


def restore(
    ns: str, name: str, rv: int, labels: dict[str, str], fields: dict[str, str], proto: bytes | None, js: bytes | None
) -> CachedObject:
    assert proto is None and js is not None
    return CachedObject(object_key(ns, name), ns, name, rv, labels, fields, json=js)


def state(cache: WatchCache) -> dict[str, bytes]:
    return {k: o.item_json for k, o in cache.store.items()}


def store(tmp: Path, sealer: Sealer | None = None, **kw: int) -> ResourceStore:
    return ResourceStore(tmp, IDENT, IDENTITY, sealer, **kw)


async def settle(s: ResourceStore) -> None:
    for _ in range(3):
        await asyncio.sleep(0)
    if s._compacting is not None:
        await s._compacting
    s.flush()


async def filled(tmp: Path, sealer: Sealer | None = None, **kw: int) -> tuple[WatchCache, ResourceStore]:
    """A cache listed at 10 (a, b, c), then b modified at 11, c deleted at 12, d added at 13."""
    cache = WatchCache(GIZMO)
    s = store(tmp, sealer, **kw)
    s.attach(cache, None)
    cache.replace([obj("a", 5), obj("b", 6), obj("c", 7)], 10)
    await settle(s)
    cache.apply(MODIFIED, obj("b", 11, "changed"))
    cache.apply(DELETED, obj("c", 12))
    cache.apply(ADDED, obj("d", 13))
    await settle(s)
    return cache, s


def load(tmp: Path, sealer: Sealer | None = None) -> tuple[WatchCache, ResourceStore]:
    cache = WatchCache(GIZMO)
    s = store(tmp, sealer)
    s.load(restore, cache)
    return cache, s


async def test_state_loads_back_as_it_was(tmp_path: Path) -> None:
    cache, s = await filled(tmp_path)
    cache.progress(20)  # a bookmark: the cache is at 20 with nothing new
    await s.close()
    again, s2 = load(tmp_path)
    assert s2.load_outcome == "loaded"
    assert again.ready and state(again) == state(cache)
    assert again.applied_rv == 20 and again.rv == 20
    for path in tmp_path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


async def test_compaction_rewrites_the_snapshot_and_drops_the_old_log(tmp_path: Path) -> None:
    cache, s = await filled(tmp_path, compact_min_bytes=4096)
    for i in range(200):
        cache.apply(MODIFIED, obj("a", 100 + i, "x" * 100))
        if i % 10 == 0:
            await settle(s)
    await settle(s)
    assert s.compactions >= 2
    logs = sorted(p.name for p in tmp_path.glob("*.events"))
    assert len(logs) == 1, logs
    await s.close()
    again, _ = load(tmp_path)
    assert state(again) == state(cache) and again.applied_rv == 299


async def test_a_relist_writes_a_new_snapshot_not_its_differences(tmp_path: Path) -> None:
    cache, s = await filled(tmp_path)
    cache.replace([obj("a", 5), obj("z", 30)], 31)  # after a 410: b and d gone, z new
    await settle(s)
    await s.close()
    head = read_state(tmp_path, IDENT, IDENTITY, None)
    assert head is not None and head.rv == 31 and head.events == []
    again, _ = load(tmp_path)
    assert sorted(again.store) == ["ns/a", "ns/z"] and again.applied_rv == 31


@pytest.mark.parametrize(
    "damage",
    [
        "torn snapshot",
        "snapshot without trailer",
        "truncated event log",
        "flipped byte in snapshot",
        "flipped byte in log",
    ],
)
async def test_damaged_state_is_never_loaded(tmp_path: Path, damage: str) -> None:
    _, s = await filled(tmp_path)
    await s.close()
    snap = tmp_path / f"{IDENT}.snapshot"
    log = next(tmp_path.glob("*.events"))
    target = snap if "snapshot" in damage else log
    data = bytearray(target.read_bytes())
    if damage == "torn snapshot":
        del data[len(data) // 2 :]
    elif damage == "snapshot without trailer":
        del data[-(8 + 1 + 8) :]  # exactly the trailer record: every record left is whole
    elif damage == "truncated event log":
        del data[-5:]
    else:
        data[len(data) - 20] ^= 0x01
    target.write_bytes(bytes(data))
    cache, s2 = load(tmp_path)
    assert s2.load_outcome == "discarded"
    assert not cache.ready and len(cache) == 0
    assert list(tmp_path.iterdir()) == []  # removed: the resource is listed from scratch


async def test_loose_file_permissions_are_not_loaded(tmp_path: Path) -> None:
    _, s = await filled(tmp_path)
    await s.close()
    os.chmod(tmp_path / f"{IDENT}.snapshot", 0o644)
    cache, s2 = load(tmp_path)
    assert s2.load_outcome == "discarded" and not cache.ready


async def test_state_of_another_upstream_is_not_loaded(tmp_path: Path) -> None:
    _, s = await filled(tmp_path)
    await s.close()
    cache = WatchCache(GIZMO)
    other = ResourceStore(tmp_path, IDENT, {**IDENTITY, "upstream": "https://elsewhere:6443"}, None)
    assert other.load(restore, cache) is None and other.load_outcome == "discarded"


async def test_encrypted_state_holds_no_plaintext_and_needs_its_key(tmp_path: Path) -> None:
    key = Sealer(os.urandom(32))
    cache, s = await filled(tmp_path, key)
    cache.apply(ADDED, obj("secret", 40, "top-secret-value"))
    await settle(s)
    await s.close()
    for path in tmp_path.iterdir():
        data = path.read_bytes()
        assert b"top-secret-value" not in data and b'"v"' not in data, path
    again, _ = load(tmp_path, key)
    assert state(again) == state(cache)
    # Another key, or none (a plain reader), loads nothing.
    _, s3 = load(tmp_path, Sealer(os.urandom(32)))
    assert s3.load_outcome == "discarded"


async def test_plain_state_is_not_loaded_where_encryption_is_expected(tmp_path: Path) -> None:
    _, s = await filled(tmp_path)
    await s.close()
    _, s2 = load(tmp_path, Sealer(os.urandom(32)))
    assert s2.load_outcome == "discarded"


def test_directory_checks(tmp_path: Path) -> None:
    d = tmp_path / "state"
    assert stat.S_IMODE(prepare_dir(str(d)).stat().st_mode) == 0o700
    os.chmod(d, 0o755)
    prepare_dir(str(d))
    assert stat.S_IMODE(d.stat().st_mode) == 0o700  # readable by others: made private
    os.chmod(d, 0o770)
    with pytest.raises(UnsafeStorage, match="writable by group or others"):
        prepare_dir(str(d))
    os.chmod(d, 0o700)
    if os.geteuid() == 0:  # only root can give a directory away
        os.chown(d, 12345, 12345)
        with pytest.raises(UnsafeStorage, match="owned by uid 12345"):
            prepare_dir(str(d))
        os.chown(d, 0, 0)
    link = tmp_path / "link"
    link.symlink_to(d)
    with pytest.raises(UnsafeStorage, match="not a directory"):
        prepare_dir(str(link))


def test_key_file(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    os.chmod(key, 0o600)
    assert isinstance(read_key_file(str(key)), Sealer)
    key.write_text(base64.b64encode(os.urandom(20)).decode())
    with pytest.raises(UnsafeStorage, match="20 bytes"):
        read_key_file(str(key))
    os.chmod(key, 0o666)
    with pytest.raises(UnsafeStorage, match="writable"):
        read_key_file(str(key))


async def test_a_newer_store_of_the_resource_takes_over_the_files(tmp_path: Path) -> None:
    """A config reload starts a new filter (and store) before the old one stops: the old one
    writes nothing more once the new one owns the resource."""
    owners: dict[str, object] = {}
    cache = WatchCache(GIZMO)
    old = ResourceStore(tmp_path, IDENT, IDENTITY, None, owners=owners)
    old.attach(cache, None)
    cache.replace([obj("a", 5)], 10)
    await settle(old)
    again = WatchCache(GIZMO)
    new = ResourceStore(tmp_path, IDENT, IDENTITY, None, owners=owners)
    loaded = new.load(restore, again)
    new.attach(again, loaded)
    cache.apply(ADDED, obj("stale", 11))  # the old cache goes on a moment: not written
    await settle(old)
    await old.close()
    again.apply(ADDED, obj("b", 12))
    await settle(new)
    await new.close()
    final, _ = load(tmp_path)
    assert sorted(final.store) == ["ns/a", "ns/b"]


class _UpstreamAt40:
    """An upstream at resource version 40, which never reached a persisted 500: a watch resumed
    from it answers "Too large resource version"; its streaming list sends ``b`` (30), waits for
    ``go_on``, then ends at 40 (``listed``). ``calls`` records the watches asked for."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.first_item = asyncio.Event()
        self.go_on = asyncio.Event()
        self.go_on.set()
        self.listed = asyncio.Event()

    async def list(self, *, limit: int, continue_token: str) -> Any:
        raise AssertionError("streaming lists are used")

    async def _watch(self, rv: str, initial: bool) -> Any:
        from kproxy.cacher import TooLarge, UpstreamEvent

        self.calls.append("list" if initial else f"watch {rv}")
        if not initial:
            raise TooLarge("Too large resource version: 500, current: 40")
        yield UpstreamEvent(ADDED, 30, obj("b", 30))
        self.first_item.set()
        await self.go_on.wait()
        yield UpstreamEvent("BOOKMARK", 40, None, True)
        self.listed.set()
        await asyncio.Event().wait()

    def watch(self, *, resource_version: str, send_initial_events: bool) -> Any:
        return self._watch(resource_version, send_initial_events)

    async def current_rv(self) -> int:
        return 40

    async def progress_rv(self) -> int:
        return 40

    async def servable_at(self, rv: int) -> bool:
        return True


async def test_a_cache_loaded_from_disk_lists_when_the_upstream_never_reached_its_version() -> None:
    """The persisted resource version is ahead of the upstream (another etcd, or one restored
    from a backup): its "Too large resource version" makes the reflector list, not retry forever."""
    from kproxy.cacher import Reflector

    cache = WatchCache(GIZMO)
    cache.replace([obj("a", 500)], 500)  # as loaded from disk
    upstream = _UpstreamAt40()
    reflector = Reflector("gizmos", upstream, cache, backoff=(0.01, 0.01))
    reflector.start()
    try:
        await asyncio.wait_for(upstream.listed.wait(), 5)
    finally:
        await reflector.stop()
    assert upstream.calls == ["watch 500", "list"]
    assert sorted(cache.store) == ["ns/b"] and cache.applied_rv == 40


async def test_a_state_from_disk_stays_unconfirmed_while_it_is_listed_again() -> None:
    """The state loaded from disk is not resumed (the upstream never reached its resource
    version): while the relist's stream delivers its initial events, the cache still holds the
    state from disk, so the reflector still says ``resumed`` (no consistent read may be answered
    from it) until the list has replaced it."""
    from kproxy.cacher import Reflector

    cache = WatchCache(GIZMO)
    cache.replace([obj("a", 500)], 500)  # as loaded from disk
    upstream = _UpstreamAt40()
    upstream.go_on.clear()
    reflector = Reflector("gizmos", upstream, cache, backoff=(0.01, 0.01))
    reflector.start()
    try:
        await asyncio.wait_for(upstream.first_item.wait(), 5)
        assert reflector.resumed and sorted(cache.store) == ["ns/a"]
        upstream.go_on.set()
        await asyncio.wait_for(upstream.listed.wait(), 5)
        assert not reflector.resumed and sorted(cache.store) == ["ns/b"]
    finally:
        await reflector.stop()


async def test_events_appended_after_a_load_load_again(tmp_path: Path) -> None:
    """A restarted kproxy appends to the log it loaded (the encrypted records' positions go on)."""
    key = Sealer(os.urandom(32))
    _, s = await filled(tmp_path, key)
    await s.close()
    for n in range(2):
        cache, s = load(tmp_path, key)
        s.attach(cache, read_state(tmp_path, IDENT, IDENTITY, key))
        cache.apply(ADDED, obj(f"later{n}", 50 + n))
        await settle(s)
        await s.close()
    final, s = load(tmp_path, key)
    assert s.load_outcome == "loaded" and {"ns/later0", "ns/later1"} <= set(final.store)


async def test_a_dropped_resource_leaves_nothing_to_load(tmp_path: Path) -> None:
    _, s = await filled(tmp_path)
    await s.close()
    s.forget()
    assert list(tmp_path.iterdir()) == []


async def test_a_resource_no_longer_served_is_removed_from_disk_until_listed_again(tmp_path: Path) -> None:
    cache, s = await filled(tmp_path)
    cache.unready()  # the reflector's 404: the upstream no longer serves the resource
    assert list(tmp_path.iterdir()) == []
    cache.apply(ADDED, obj("ignored", 60))
    await settle(s)
    assert list(tmp_path.iterdir()) == []
    cache.replace([obj("back", 70)], 70)  # served again: listed
    await settle(s)
    await s.close()
    again, _ = load(tmp_path)
    assert sorted(again.store) == ["ns/back"]


async def test_a_watch_resumed_from_disk_is_live_only_from_its_first_bookmark() -> None:
    """Until the resumed watch's first bookmark, the events missed while down may still be on
    their way: no progress probe may move the cache past them (consistent reads go upstream)."""
    from kproxy.cacher import ListPage, Reflector, UpstreamEvent

    cache = WatchCache(GIZMO)
    cache.replace([obj("a", 500)], 500)  # as loaded from disk
    feed: asyncio.Queue[UpstreamEvent] = asyncio.Queue()
    took = asyncio.Event()

    class LW:
        async def list(self, *, limit: int, continue_token: str) -> ListPage:
            raise AssertionError("no list")

        async def _watch(self) -> Any:
            while True:
                ev = await feed.get()
                yield ev
                took.set()

        def watch(self, *, resource_version: str, send_initial_events: bool) -> Any:
            assert (resource_version, send_initial_events) == ("500", False)
            return self._watch()

        async def current_rv(self) -> int:
            return 900

        async def progress_rv(self) -> int:
            return 900

        async def servable_at(self, rv: int) -> bool:
            return True

    async def deliver(ev: UpstreamEvent) -> None:
        took.clear()
        feed.put_nowait(ev)
        await asyncio.wait_for(took.wait(), 5)

    reflector = Reflector("gizmos", LW(), cache)
    reflector.start()
    try:
        await deliver(UpstreamEvent(MODIFIED, 600, obj("a", 600, "changed")))
        assert not reflector.live
        with pytest.raises(ConnectionError):
            await reflector.request_progress()
        assert cache.rv == 600  # the probe's 900 was not believed
        await deliver(UpstreamEvent("BOOKMARK", 700, None))
        assert reflector.live and cache.rv == 700
        await reflector.request_progress()
        assert cache.rv == 900
    finally:
        await reflector.stop()


# -- built-in kinds: the stored view and the JSON readers had made ------------------------------

CONFIGMAP = Kind("v1", "ConfigMap", "ConfigMapList", protobuf=True)
CM_IDENT = "core+v1+configmaps"


def _factory() -> Any:
    from kproxy.cacher.fields import builtin_fields
    from kproxy.cacher.ingest import ObjectFactory
    from kproxy.codec import ProtobufCodec

    return ObjectFactory(CONFIGMAP, builtin_fields("", "configmaps"), ProtobufCodec())


def _configmap(factory: Any, name: str, rv: int, labels: dict[str, str]) -> CachedObject:
    from kproxy.codec import decode_envelope

    meta = {"name": name, "namespace": "ns", "resourceVersion": str(rv), "labels": labels}
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": name}}
    raw = decode_envelope(factory.codec.from_json(orjson.dumps(obj))).raw
    made: CachedObject = factory.from_proto(raw)
    return made


async def test_a_loaded_object_is_the_one_that_arrived_without_parsing_it_again(tmp_path: Path) -> None:
    """Labels, fields, resource version and the protobuf bytes load back as the factory parsed
    them; the JSON a reader had made loads with them (and only that: the others make theirs when
    asked, as before); nothing is parsed from the protobuf on load."""
    factory = _factory()
    cache = WatchCache(CONFIGMAP)
    s = ResourceStore(tmp_path, CM_IDENT, IDENTITY, None)
    s.attach(cache, None)
    objs = [_configmap(factory, f"c{i}", 10 + i, {"app": "a", "i": str(i % 2)}) for i in range(4)]
    assert objs[1].item_json  # a JSON reader had this one made
    cache.replace(objs, 20)
    await settle(s)
    cache.apply(MODIFIED, _configmap(factory, "c2", 21, {"app": "b"}))
    await settle(s)
    await s.close()

    parsed: list[bytes] = []
    factory2 = _factory()
    factory2.from_proto = lambda raw: parsed.append(raw)  # must not be called
    again = WatchCache(CONFIGMAP)
    s2 = ResourceStore(tmp_path, CM_IDENT, IDENTITY, None)
    assert s2.load(factory2.restore, again) is not None and not parsed
    for key, want in cache.store.items():
        got = again.store[key]
        assert (got.namespace, got.name, got.rv, got.proto) == (want.namespace, want.name, want.rv, want.proto)
        assert got.labels == want.labels and got.fields == want.fields and got.fields
        assert got.has_json == (key == "ns/c1")
        assert got.item_json == want.item_json  # made now for the others, by the same codec
    assert again.store["ns/c2"].labels == {"app": "b"}


async def test_state_stored_with_other_selectable_fields_is_listed_again(tmp_path: Path) -> None:
    """Another kproxy version may read other fields out of the objects: its state is not used."""
    factory = _factory()
    cache = WatchCache(CONFIGMAP)
    s = ResourceStore(tmp_path, CM_IDENT, IDENTITY, None)
    s.attach(cache, None)
    cache.replace([_configmap(factory, "c0", 10, {})], 20)
    await settle(s)
    await s.close()
    import copy

    from kproxy.cacher.ingest import ObjectFactory

    fields = copy.copy(factory.fields)  # builtin_fields' object is shared: changed on a copy
    fields.names = frozenset({*fields.names, "data.k"})
    other = ObjectFactory(CONFIGMAP, fields, factory.codec)
    again = WatchCache(CONFIGMAP)
    s2 = ResourceStore(tmp_path, CM_IDENT, IDENTITY, None)
    assert s2.load(other.restore, again) is None and s2.load_outcome == "discarded"
    assert not again.ready and list(tmp_path.iterdir()) == []


async def test_the_json_readers_made_is_kept_on_close(tmp_path: Path) -> None:
    """A store closed after readers had most objects' JSON made writes a snapshot holding it."""
    factory = _factory()
    cache = WatchCache(CONFIGMAP)
    s = ResourceStore(tmp_path, CM_IDENT, IDENTITY, None)
    s.attach(cache, None)
    cache.replace([_configmap(factory, f"c{i}", 10 + i, {}) for i in range(200)], 300)
    await settle(s)
    for o in cache.store.values():
        assert o.item_json
    await s.close()
    again = WatchCache(CONFIGMAP)
    assert ResourceStore(tmp_path, CM_IDENT, IDENTITY, None).load(_factory().restore, again) is not None
    assert all(o.has_json for o in again.store.values()) and len(again) == 200


async def test_a_format_1_state_is_listed_again(tmp_path: Path) -> None:
    _, s = await filled(tmp_path)
    await s.close()
    snap = tmp_path / f"{IDENT}.snapshot"
    data = snap.read_bytes()
    start = len(b"KPXWC1P\n")
    n = int.from_bytes(data[start : start + 4], "big")
    head = orjson.loads(data[start + 9 : start + 8 + n])
    head["format"] = 1
    payload = b"H" + orjson.dumps(head)
    import zlib

    framed = len(payload).to_bytes(4, "big") + zlib.crc32(payload).to_bytes(4, "big") + payload
    snap.write_bytes(data[:start] + framed + data[start + 8 + n :])
    os.chmod(snap, 0o600)
    cache, s2 = load(tmp_path)
    assert s2.load_outcome == "discarded" and not cache.ready
