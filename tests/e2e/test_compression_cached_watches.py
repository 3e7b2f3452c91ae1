"""Compressed watches served from the watch cache (``compression`` with ``watch: true`` in front of
``watchcache``), read as a client reads them, against the real apiserver through ``kproxy run``.

What a client must see, whatever way the server lays out its zstd frames or gzip members (one
per stream or several, RFC 8878 / RFC 1952 both allow it): the same events an uncompressed watch
opened at the same moment gets, each decodable as soon as it arrives; a stream that ends on a
frame boundary with a clean chunked end; protobuf bytes equal to the uncompressed ones; and real
clients (kubectl, the official Python client) that see every write.
"""

from __future__ import annotations

import functools
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from test_compression import PROTOBUF_WATCH, metric
from test_watchcache_watch_lifecycle import _cache_watches, _ready
from watchstream import RawWatch

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy, start_proxy

CHAIN = {
    "filters": [
        {"name": "compression", "watch": True},
        # Bookmarks on every tick (about a second): a watcher's own bookmark lands between
        # shared events all through a test.
        {"name": "watchcache", "resources": ["configmaps"], "bookmark_interval": 0.5},
    ]
}
CODINGS = ["zstd", "gzip"]
OTHER = {"zstd": "gzip", "gzip": "zstd"}

Event = tuple[str, str, str | None]  # (type, name, resourceVersion; None for a deletion's)


@pytest.fixture(scope="module")
def cached(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """One kproxy for the module (each test uses its own namespace), its configmaps cache listed."""
    rp = start_proxy(tmp_path_factory.mktemp("kp-cached-compress"), control_plane.admin_kubeconfig, extra=CHAIN)
    try:
        _ready(rp)
        yield rp
    finally:
        rp.stop()


class Writer:
    """ConfigMap writes straight to the apiserver, each remembered as the event it must cause."""

    def __init__(self, cp: ControlPlaneInfo, namespace: str) -> None:
        self.cp = cp
        self.base = f"/api/v1/namespaces/{namespace}/configmaps"
        self.log: list[Event] = []
        self.live: dict[str, str] = {}  # name -> resourceVersion

    def create(self, name: str, value: str = "0") -> str:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value * 40}}
        status, resp = self.cp.request("POST", self.base, body=json.dumps(body).encode())
        assert status == 201, resp
        return self._done("ADDED", name, json.loads(resp)["metadata"]["resourceVersion"])

    def update(self, name: str, value: str) -> str:
        patch = json.dumps({"data": {"v": value * 40}}).encode()
        status, resp = self.cp.request(
            "PATCH", f"{self.base}/{name}", body=patch, content_type="application/merge-patch+json"
        )
        assert status == 200, resp
        return self._done("MODIFIED", name, json.loads(resp)["metadata"]["resourceVersion"])

    def delete(self, name: str) -> None:
        status, resp = self.cp.request("DELETE", f"{self.base}/{name}")
        assert status == 200, resp
        self.live.pop(name)
        self.log.append(("DELETED", name, None))

    def step(self, i: int) -> None:
        """Write ``i`` of a mixed sequence over twelve names: creates, updates, deletes."""
        name = f"c{i % 12:02d}"
        if name not in self.live:
            self.create(name, str(i))
        elif i % 5 == 2:
            self.delete(name)
        else:
            self.update(name, str(i))

    def _done(self, kind: str, name: str, rv: str) -> str:
        self.live[name] = rv
        self.log.append((kind, name, rv))
        return rv

    def last_rv(self) -> str:
        return next(rv for _, _, rv in reversed(self.log) if rv is not None)


def summary(events: list[dict[str, Any]]) -> list[Event]:
    return [
        (
            e["type"],
            e["object"]["metadata"]["name"],
            None if e["type"] == "DELETED" else e["object"]["metadata"]["resourceVersion"],
        )
        for e in events
    ]


class Pair:
    """A compressed watch and an uncompressed one opened right after it with the same
    parameters, with no write in between, and the events both must get."""

    def __init__(
        self, rp: RunningProxy, w: Writer, ns: str, coding: str, rv: str | None, bookmarks: bool, extra: str = ""
    ) -> None:
        query = "watch=1" + ("" if rv is None else f"&resourceVersion={rv}") + "&allowWatchBookmarks=true" * bookmarks
        query += extra
        path = f"/api/v1/namespaces/{ns}/configmaps?{query}"
        self.bookmarks = bookmarks
        self.zipped = RawWatch(rp, path, coding)
        self.plain = RawWatch(rp, path, None)
        if rv in (None, "0"):  # the state now, as ADDED events, then what follows
            self.initial = sorted(("ADDED", name, r) for name, r in w.live.items())
            self.start = len(w.log)
        else:  # what followed the write that made ``rv``
            self.initial = []
            self.start = next(i for i, (_, _, r) in enumerate(w.log) if r == rv) + 1

    def expected(self, w: Writer) -> list[Event]:
        return self.initial + w.log[self.start :]

    def check(self, w: Writer) -> None:
        want = self.expected(w)
        for side in (self.zipped, self.plain):
            side.until(lambda side=side: len(side.objects()) >= len(want), f"{len(want)} events")
            got = summary(side.objects())
            n = len(self.initial)
            assert sorted(got[:n]) == self.initial, side.path
            assert got[n:] == want[n:], side.path
            assert side.pending == b"", side.pending
            rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in side.events[n:]]
            assert rvs == sorted(rvs), f"resource versions went back: {rvs}"
            for b in side.bookmarks():
                assert self.bookmarks, b
                assert b["object"]["kind"] == "ConfigMap" and b["object"]["apiVersion"] == "v1", b
                assert int(b["object"]["metadata"]["resourceVersion"]) > 0, b
                assert "name" not in b["object"]["metadata"], b
        # The same events, object for object; bookmarks come on each watch's own ticks.
        assert self.zipped.objects() == self.plain.objects()

    def bookmarked(self, rv: str) -> None:
        """Read the compressed watch until a bookmark at ``rv`` or later has been decoded."""
        self.zipped.until(
            lambda: any(int(b["object"]["metadata"]["resourceVersion"]) >= int(rv) for b in self.zipped.bookmarks()),
            f"a bookmark at {rv} or later",
        )


@pytest.mark.parametrize("coding", CODINGS)
def test_many_compressed_watchers_decode_to_the_uncompressed_events(
    cached: RunningProxy, control_plane: ControlPlaneInfo, namespace: str, coding: str
) -> None:
    """Twelve compressed watchers (and their uncompressed twins) opened before and during sixty
    writes, with resourceVersion unset, 0 or a recent one, bookmarks on or off. In the lock-step
    rounds each write must be decoded by every compressed watcher before the next one is made."""
    w = Writer(control_plane, namespace)
    served0 = _cache_watches(cached)
    pairs: list[Pair] = []
    # write index -> the watchers opened just before it (rv "N": the last write's version)
    # (one pair in the other coding: both codings' watchers in one selection at once)
    openings: dict[int, list[tuple[Any, ...]]] = {
        0: [(None, False), ("0", True), (None, True), ("0", False)],
        20: [(None, True), ("0", False, OTHER[coding]), ("N", False), ("N", True)],
        40: [(None, False), ("0", True), ("N", True), ("N", False)],
    }
    lockstep = {0, 1, 2, 20, 21, 22, 40, 41, 42, 59}
    for i in range(60):
        if i == 37:
            rv37 = w.last_rv()
        for rv, bookmarks, *other in openings.get(i, []):
            if rv == "N":  # a recent version: the last write's, or one a few writes back
                rv = rv37 if i == 40 and bookmarks else w.last_rv()
            pairs.append(Pair(cached, w, namespace, other[0] if other else coding, rv, bookmarks))
        w.step(i)
        if i in lockstep or i + 1 in openings:
            # Every compressed watcher decodes this write before the next one is made (and
            # the cache has it before watchers open at "any" version, as the twins must agree).
            for p in pairs:
                n = len(p.expected(w))
                p.zipped.until(lambda p=p, n=n: len(p.zipped.objects()) >= n, f"write {i}")
        if i in (10, 30, 50):
            # Writes go on after the watchers' own bookmarks (about a second apart): the
            # stream keeps decoding across whatever a watcher's own write does to it.
            for p in pairs:
                if p.bookmarks:
                    p.bookmarked(w.last_rv())
    for p in pairs:
        p.check(w)
    assert len({p.start for p in pairs}) >= 4
    assert len(w.log) == 60 and sum(t == "DELETED" for t, _, _ in w.log) >= 5
    # Each watcher that asked for bookmarks gets one that covers the last write, decodable.
    for p in pairs:
        if p.bookmarks:
            p.bookmarked(w.last_rv())
            p.check(w)
        else:
            assert not p.zipped.bookmarks()
    assert _cache_watches(cached) - served0 == 2 * len(pairs) == 24  # every one served by the cache
    for p in pairs:
        p.zipped.close()
        p.plain.close()


@pytest.mark.parametrize("coding", CODINGS)
def test_watch_timeout_ends_on_a_complete_frame_and_a_clean_chunked_end(
    cached: RunningProxy, control_plane: ControlPlaneInfo, namespace: str, coding: str
) -> None:
    w = Writer(control_plane, namespace)
    w.create("before")
    started = time.monotonic()
    pair = Pair(cached, w, namespace, coding, None, True, "&timeoutSeconds=5")
    for i in range(3):
        w.step(i)
        pair.zipped.until(lambda i=i: len(pair.zipped.objects()) >= i + 2, f"write {i}")
    for side in (pair.zipped, pair.plain):
        side.until(lambda side=side: side.ended, "the end of the stream")
        assert side.inflater.complete, f"{coding}: the stream ended inside a frame"
        assert side.pending == b"" and side.after_end == b""
    assert 4 < time.monotonic() - started < 20
    pair.check(w)
    # It asked for bookmarks and got some (up to 2 s before its deadline): the end follows
    # writes of the watcher's own, not only shared ones.
    assert pair.zipped.bookmarks(), pair.zipped.events
    pair.zipped.close()
    pair.plain.close()


@pytest.mark.parametrize("coding", CODINGS)
def test_protobuf_watch_decodes_to_the_uncompressed_bytes(
    cached: RunningProxy, control_plane: ControlPlaneInfo, namespace: str, coding: str
) -> None:
    w = Writer(control_plane, namespace)
    rv = w.create("p0")
    path = f"/api/v1/namespaces/{namespace}/configmaps?watch=1&resourceVersion={rv}"
    zipped = RawWatch(cached, path, coding, PROTOBUF_WATCH)
    plain = RawWatch(cached, path, None, PROTOBUF_WATCH)
    as_json = RawWatch(cached, path, coding)  # same selection and coding, the other format
    assert zipped.content_type.startswith("application/vnd.kubernetes.protobuf;stream=watch")
    writes: list[Callable[[], object]] = [
        lambda: w.create("p1"),
        lambda: w.update("p0", "x"),
        lambda: w.update("p1", "y"),
        lambda: w.delete("p0"),
    ]
    for i, write in enumerate(writes):
        write()
        zipped.until(lambda i=i: len(zipped.frames) > i, f"write {i}")
    plain.until(lambda: len(plain.frames) >= len(writes), "every write")
    assert len(zipped.frames) == len(writes)
    assert zipped.decoded == plain.decoded
    for frame, (_, name, _) in zip(zipped.frames, w.log[1:], strict=True):
        assert name.encode() in frame
    as_json.until(lambda: len(as_json.events) >= len(writes), "every write as JSON")
    assert summary(as_json.events) == w.log[1:]
    for watch_ in (zipped, plain, as_json):
        watch_.close()


def _kubectl_watch(kubectl: Kubectl, rp: RunningProxy, namespace: str) -> tuple[subprocess.Popen[str], list[Any]]:
    """``kubectl get configmaps --watch -o json`` through ``rp``: the objects it prints, parsed."""
    argv = [str(kubectl.binary), f"--kubeconfig={rp.kubeconfig}", f"--cache-dir={kubectl.cache_dir}"]
    argv += ["get", "configmaps", "-n", namespace, "--watch", "-o", "json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    printed: list[Any] = []

    def read() -> None:
        assert proc.stdout is not None
        text, decoder = "", json.JSONDecoder()
        for line in proc.stdout:
            text += line
            while text.strip():
                try:
                    obj, end = decoder.raw_decode(text.lstrip())
                except json.JSONDecodeError:
                    break
                printed.append(obj)
                text = text.lstrip()[end:]

    threading.Thread(target=read, daemon=True).start()
    return proc, printed


def test_kubectl_and_python_client_watch_the_cached_compressed_chain(
    cached: RunningProxy, control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str
) -> None:
    """kubectl (a list, then a watch from the list's resourceVersion, not a watch-list) asks for
    gzip (Go's transport adds it and decodes) and prints every write. The official client's
    ``Watch`` sends no ``Accept-Encoding`` at all (urllib3 adds none and the watch reads the raw
    stream), so it gets the plain stream: asserted on the response headers and kproxy's count."""
    w = Writer(control_plane, namespace)
    w.create("k-before")
    served0 = _cache_watches(cached)
    gzip0 = metric(cached, "kproxy_compression_responses_total", encoding="gzip")
    proc, printed = _kubectl_watch(kubectl, cached, namespace)
    seen = lambda: {(o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in printed}  # noqa: E731
    try:
        eventually(lambda: ("k-before", w.live["k-before"]) in seen(), 30, "kubectl to print the first object")
        eventually(lambda: _cache_watches(cached) > served0, 20, "kubectl's watch to be served by the cache")
        for i in range(4):
            rv = w.create(f"k{i}") if i < 2 else w.update(f"k{i - 2}", str(i))
            eventually(lambda i=i, rv=rv: (f"k{i % 2}", rv) in seen(), 30, f"kubectl to print write {i}")
        assert metric(cached, "kproxy_compression_responses_total", encoding="gzip") > gzip0
    finally:
        proc.kill()
        proc.wait()

    cfg = client.Configuration()
    cfg.host = cached.url
    heads: list[Any] = []
    got: list[tuple[str, str, str]] = []
    with client.ApiClient(cfg) as api:
        core = client.CoreV1Api(api)

        @functools.wraps(core.list_namespaced_config_map)  # Watch reads the return type off the docstring
        def listing(*args: Any, **kwargs: Any) -> Any:
            resp = core.list_namespaced_config_map(*args, **kwargs)
            heads.append(resp.headers)
            return resp

        stream = watch.Watch()

        def run() -> None:
            for ev in stream.stream(listing, namespace, resource_version=w.last_rv(), timeout_seconds=60):
                got.append((ev["type"], ev["object"].metadata.name, ev["object"].metadata.resource_version))
                if len(got) == 4:
                    stream.stop()  # from inside the loop, as documented: no read is under way

        served1 = _cache_watches(cached)
        plain0 = metric(cached, "kproxy_compression_skipped_total", reason="not_accepted")
        t = threading.Thread(target=run, daemon=True)
        t.start()
        eventually(lambda: _cache_watches(cached) > served1, 20, "the client's watch to be served by the cache")
        w.log.clear()
        for i in range(3):
            w.create(f"py{i}")
        w.update("py0", "z")
        t.join(30)
        assert not t.is_alive(), got
    assert got == w.log
    assert len(heads) == 1 and heads[0].get("Content-Encoding") is None
    assert metric(cached, "kproxy_compression_skipped_total", reason="not_accepted") == plain0 + 1
