"""The watch cache persisted on disk (``watchcache.persist``), against the real apiserver.

A kproxy restarted on its persisted state serves its first ``resourceVersion=0`` list from the
cache before asking the apiserver for any list, and resumes its upstream watch from the
persisted resource version: the apiserver sends it the events made meanwhile (its
``apiserver_init_events_total`` moves by those, not by the whole resource) and kproxy counts no
relist. When the apiserver no longer has that resource version (etcd compacted, the apiserver
restarted) the watch's 410 makes kproxy list again and converge. A damaged file is never loaded.
Secrets are persisted only when named, and then encrypted. Files are 0600, the directory 0700."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from watchcache_diff import reads_total

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing import crds
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

COUNT = 60


def _cm(name: str, value: str) -> bytes:
    return json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}}
    ).encode()


def _state(body: bytes) -> dict[str, str]:
    return {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in json.loads(body)["items"]}


def _metric(text: str, pattern: str) -> float:
    m = re.search(pattern + r" ([0-9.e+]+)", text)
    return float(m.group(1)) if m else 0.0


def _init_events(cp: ControlPlaneInfo) -> float:
    """How many initial events the apiserver's watch cache has sent watchers of configmaps (a
    streaming list sends one per object; a resumed watch one per event it missed)."""
    status, body = cp.request("GET", "/metrics", accept="text/plain")
    assert status == 200
    return _metric(body.decode(), r'apiserver_init_events_total\{group="",resource="configmaps"\}')


def _config(state: Path, cached: list[str] | None = None, **persist: Any) -> dict[str, Any]:
    return {
        "log": {"level": "debug"},  # the upstream list and watch requests of the cache are logged
        "filters": [
            {
                "name": "watchcache",
                "resources": cached or ["configmaps"],
                "persist": {"dir": str(state), **persist},
            }
        ],
    }


def _upstream_requests(rp: RunningProxy, resource: str) -> list[str]:
    """The cache's own list and watch requests for ``resource``, as kproxy logged them; not its
    freshness probes (a list or watch matching no object, for the upstream's resource version)."""
    out = []
    for line in rp.log_text().splitlines():
        if "upstream list " in line or "upstream watch " in line:
            msg = json.loads(line).get("msg", "")
            if re.search(rf"/{resource}\?", msg) and "kproxy-matches-nothing" not in msg:
                out.append(msg)
    return out


def _fill(cp: ControlPlaneInfo, base: str, n: int = COUNT) -> None:
    for i in range(n):
        assert cp.request("POST", base, body=_cm(f"cm{i}", "a"))[0] == 201


def _converged(rp: RunningProxy, cp: ControlPlaneInfo, base: str) -> Callable[[], bool]:
    def check() -> bool:
        status, via = rp.get(f"{base}?resourceVersion=0")
        return status == 200 and _state(via) == _state(cp.request("GET", base)[1])

    return check


def _first_run(proxy_factory: Callable[..., RunningProxy], cp: ControlPlaneInfo, base: str, cfg: dict[str, Any]) -> str:
    """kproxy caches the namespace's configmaps, then stops (SIGTERM); the cache's resource version."""
    rp = proxy_factory(extra=cfg)
    # Answered by the cache itself: one that is not ready yet sends reads to the apiserver, whose
    # answer would match before anything was cached (or persisted).
    cached = _converged(rp, cp, base)
    resource = cfg["filters"][0]["resources"][0]  # its metrics label: configmaps, PLURAL.GROUP

    def from_cache() -> bool:
        before = reads_total(rp.metrics(), resource=resource, verb="list", served="cache")
        return cached() and reads_total(rp.metrics(), resource=resource, verb="list", served="cache") > before

    eventually(from_cache, 30, "the cache to hold the configmaps")
    rv = str(json.loads(rp.get(f"{base}?resourceVersion=0")[1])["metadata"]["resourceVersion"])
    assert rp.stop() == 0
    return rv


def test_restart_serves_from_disk_and_resumes_the_watch(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path
) -> None:
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    _fill(cp, base)
    state = tmp_path / "state"
    cfg = _config(state)
    persisted_rv = _first_run(proxy_factory, cp, base, cfg)
    before = _state(cp.request("GET", base)[1])
    # What is on disk is private to kproxy's user.
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    files = sorted(p.name for p in state.iterdir())
    assert "core+v1+configmaps.snapshot" in files, files
    for p in state.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600 and p.stat().st_uid == os.geteuid(), p

    # Changes while kproxy is down: one modified, one deleted, one created.
    assert cp.request("PUT", f"{base}/cm1", body=_cm("cm1", "b"))[0] == 200
    assert cp.request("DELETE", f"{base}/cm2")[0] == 200
    assert cp.request("POST", base, body=_cm("cm-new", "c"))[0] == 201
    init_before = _init_events(cp)
    assert init_before >= COUNT  # the first run's streaming list: one initial event per configmap

    rp = proxy_factory(extra=cfg)
    # A consistent read, the first request, is never answered from the persisted state alone.
    consistent_status, consistent = rp.get(base)
    assert consistent_status == 200 and _state(consistent) == _state(cp.request("GET", base)[1])
    # A watcher from the persisted resource version, on the restarted kproxy, gets what changed.
    watch_status, watch_body = rp.get(
        f"{base}?watch=1&resourceVersion={persisted_rv}&timeoutSeconds=1&allowWatchBookmarks=false", timeout=20
    )
    status, first = rp.get(f"{base}?resourceVersion=0")
    assert status == 200
    metrics = rp.metrics()
    assert _metric(metrics, r'kproxy_watchcache_persist_loads_total\{outcome="loaded",resource="configmaps"\}') == 1
    served = r'kproxy_watchcache_reads_total\{reason="any",resource="configmaps",served="cache",verb="list"\}'
    assert _metric(metrics, served) == 1
    # Served from disk, before kproxy asked the apiserver for any list: its state is either the
    # persisted one or already caught up by the resumed watch, never anything else.
    assert _state(first) in (before, _state(cp.request("GET", base)[1]))
    eventually(_converged(rp, cp, base), 30, "the changes made while kproxy was down to reach the cache")

    requests = _upstream_requests(rp, "configmaps")
    assert requests, rp.log_text()[-3000:]
    assert not [r for r in requests if r.startswith("upstream list ") or "sendInitialEvents" in r], requests
    resumed_from = int(re.search(r"resourceVersion=(\d+)", requests[0]).group(1))  # type: ignore[union-attr]
    assert resumed_from >= int(persisted_rv), requests[0]  # where the stopped kproxy was (or a later bookmark)
    metrics = rp.metrics()
    assert _metric(metrics, r'kproxy_watchcache_relists_total\{reason="[a-z]+",resource="configmaps"\}') == 0
    # At the apiserver: the resumed watch was sent the three events made meanwhile, not every
    # configmap as initial events (a list would have been at least COUNT of them).
    assert _init_events(cp) - init_before < COUNT // 2

    assert watch_status == 200
    events = [json.loads(line) for line in watch_body.splitlines() if line.strip()]
    seen = {(e["type"], e["object"]["metadata"]["name"]) for e in events}
    assert {("MODIFIED", "cm1"), ("DELETED", "cm2"), ("ADDED", "cm-new")} <= seen, seen


def test_compacted_while_down_relists_and_converges(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path
) -> None:
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    _fill(cp, base, 10)
    cfg = _config(tmp_path / "state")
    _first_run(proxy_factory, cp, base, cfg)
    assert cp.request("PUT", f"{base}/cm1", body=_cm("cm1", "b"))[0] == 200
    assert cp.request("DELETE", f"{base}/cm2")[0] == 200
    # The apiserver restarts with etcd compacted: the persisted resource version is gone.
    cp.stop_apiserver(kill=True)
    try:
        cp.compact_etcd(cp.etcd_revision())
    finally:
        cp.start_apiserver()
    rp = proxy_factory(extra=cfg)
    eventually(_converged(rp, cp, base), 60, "the cache to list again and converge")
    metrics = rp.metrics()
    assert _metric(metrics, r'kproxy_watchcache_persist_loads_total\{outcome="loaded",resource="configmaps"\}') == 1
    assert _metric(metrics, r'kproxy_watchcache_relists_total\{reason="expired",resource="configmaps"\}') == 1
    # Consistent reads are served once fresh: a write made now is in the next one.
    assert cp.request("POST", base, body=_cm("cm-late", "c"))[0] == 201
    status, body = rp.get(base)
    assert status == 200 and "cm-late" in _state(body)


@pytest.mark.parametrize("damage", ["torn snapshot", "flipped byte in the event log"])
def test_damaged_state_is_not_loaded(
    proxy_factory: Callable[..., RunningProxy],
    control_plane: ControlPlaneInfo,
    namespace: str,
    tmp_path: Path,
    damage: str,
) -> None:
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    _fill(cp, base, 10)
    state = tmp_path / "state"
    cfg = _config(state)
    rp = proxy_factory(extra=cfg)
    eventually(_converged(rp, cp, base), 30, "the cache to hold the configmaps")
    assert cp.request("PUT", f"{base}/cm1", body=_cm("cm1", "b"))[0] == 200  # an event in the log
    eventually(_converged(rp, cp, base), 30, "the cache to see the change")
    assert rp.stop() == 0
    if damage == "torn snapshot":
        snap = state / "core+v1+configmaps.snapshot"
        snap.write_bytes(snap.read_bytes()[: snap.stat().st_size * 2 // 3])
    else:
        log = next(state.glob("core+v1+configmaps+*.events"))
        data = bytearray(log.read_bytes())
        data[-10] ^= 0x20
        log.write_bytes(bytes(data))
    rp = proxy_factory(extra=cfg)
    eventually(_converged(rp, cp, base), 30, "the cache to list from scratch")
    metrics = rp.metrics()
    assert _metric(metrics, r'kproxy_watchcache_persist_loads_total\{outcome="discarded",resource="configmaps"\}') == 1
    assert "persisted state not loaded" in rp.log_text()
    requests = _upstream_requests(rp, "configmaps")
    assert "sendInitialEvents" in requests[0] or requests[0].startswith("upstream list "), requests


def test_secrets_persisted_only_when_named_and_then_encrypted(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path
) -> None:
    cp = control_plane
    secrets = f"/api/v1/namespaces/{namespace}/secrets"
    value = "kproxy-persist-plaintext-" + os.urandom(6).hex()
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"}, "stringData": {"password": value}}
    assert cp.request("POST", secrets, body=json.dumps(body).encode())[0] == 201
    b64 = base64.b64encode(value.encode())

    def on_disk(state: Path) -> bytes:
        return b"".join(p.read_bytes() for p in state.iterdir() if p.is_file())

    # Cached, but persist.resources is "*": secrets are not written.
    plain = tmp_path / "plain"
    rp = proxy_factory(extra=_config(plain, ["configmaps", "secrets"]))
    eventually(_converged(rp, cp, secrets), 30, "the cache to hold the secret")
    assert rp.stop() == 0
    assert not list(plain.glob("core+v1+secrets*")), sorted(p.name for p in plain.iterdir())
    assert value.encode() not in on_disk(plain) and b64 not in on_disk(plain)

    # Named, with a key: written encrypted, loaded back on restart.
    key = tmp_path / "key"
    key.write_text(base64.b64encode(os.urandom(32)).decode())
    key.chmod(0o600)
    sealed = tmp_path / "sealed"
    cfg = _config(sealed, ["configmaps", "secrets"], resources=["*", "secrets"], encryption_key_file=str(key))
    rp = proxy_factory(extra=cfg)
    eventually(_converged(rp, cp, secrets), 30, "the cache to hold the secret")
    assert rp.stop() == 0
    files = list(sealed.glob("core+v1+secrets*"))
    assert files and all(p.read_bytes().startswith(b"KPXWC1E\n") for p in files)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    assert value.encode() not in on_disk(sealed) and b64 not in on_disk(sealed) and b"password" not in on_disk(sealed)
    rp = proxy_factory(extra=cfg)
    status, got = rp.get(f"{secrets}?resourceVersion=0")
    assert status == 200 and "s1" in _state(got)
    assert _metric(rp.metrics(), r'kproxy_watchcache_persist_loads_total\{outcome="loaded",resource="secrets"\}') == 1
    assert rp.stop() == 0

    # Another key: what the old one sealed is removed unread, and the secrets listed again.
    key.write_text(base64.b64encode(os.urandom(32)).decode())
    old = (sealed / "core+v1+secrets.snapshot").read_bytes()
    rp = proxy_factory(extra=cfg)
    eventually(_converged(rp, cp, secrets), 30, "the cache to list the secrets again")
    assert "persisted state core+v1+secrets not readable" in rp.log_text()
    assert _metric(rp.metrics(), r'kproxy_watchcache_persist_loads_total\{outcome="none",resource="secrets"\}') == 1
    eventually(lambda: (sealed / "core+v1+secrets.snapshot").exists(), 30, "the new key's snapshot")
    assert (sealed / "core+v1+secrets.snapshot").read_bytes() != old
    assert rp.stop() == 0

    # Secrets no longer cached: their persisted state goes too.
    rp = proxy_factory(extra=_config(sealed, ["configmaps"], resources=["*", "secrets"], encryption_key_file=str(key)))
    assert not list(sealed.glob("core+v1+secrets*"))
    rp.stop(signal.SIGKILL)


def test_unsafe_directory_is_refused_at_start(proxy_factory: Callable[..., RunningProxy], tmp_path: Path) -> None:
    state = tmp_path / "open"
    state.mkdir()
    state.chmod(0o777)
    with pytest.raises(
        AssertionError, match="kproxy: config error: watchcache: persist: .* writable by group or others"
    ):
        proxy_factory(extra=_config(state))


def test_first_list_served_from_disk_before_the_apiserver_answers(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path
) -> None:
    """The persisted caches start before discovery: with the apiserver down, kproxy still answers a
    ``resourceVersion=0`` list from disk; once it is back, the watch resumes and converges."""
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    _fill(cp, base, 10)
    cfg = _config(tmp_path / "state")
    _first_run(proxy_factory, cp, base, cfg)
    before = _state(cp.request("GET", base)[1])
    cp.stop_apiserver()
    try:
        rp = proxy_factory(extra=cfg, ready=False)
        assert not cp.readyz()
        status, body = rp.get(f"{base}?resourceVersion=0")
        assert status == 200 and _state(body) == before
        served = r'kproxy_watchcache_reads_total\{reason="any",resource="configmaps",served="cache",verb="list"\}'
        assert _metric(rp.metrics(), served) == 1
    finally:
        cp.start_apiserver()
    assert cp.request("DELETE", f"{base}/cm3")[0] == 200
    # The restarted apiserver's own watch cache starts at its first list: the resumed watch is
    # answered 410 and kproxy lists again, as it does after any apiserver restart.
    eventually(_converged(rp, cp, base), 60, "the cache to catch up and see the deletion")


CRD = crds.crd("persist.kproxy.test", "widgets", "Widget", spec_fields={"color": "string"}, selectable=[".spec.color"])


def test_custom_resources_persist_as_their_json_and_go_with_their_definition(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path
) -> None:
    cp = control_plane
    crds.install(cp, CRD)
    state = tmp_path / "state"
    ident = "persist.kproxy.test+v1+widgets"
    try:
        base = f"/apis/persist.kproxy.test/v1/namespaces/{namespace}/widgets"

        def create(name: str, color: str) -> bool:
            body = {"apiVersion": "persist.kproxy.test/v1", "kind": "Widget", "metadata": {"name": name}}
            body["spec"] = {"color": color}
            return cp.request("POST", base, body=json.dumps(body).encode())[0] in (201, 409)

        eventually(lambda: create("w1", "red"), 30, "the CRD to be served")
        assert create("w2", "blue")
        cfg = _config(state, ["widgets.persist.kproxy.test"])
        cfg["filters"][0]["rediscovery_interval"] = 1
        _first_run(proxy_factory, cp, base, cfg)
        assert (state / f"{ident}.snapshot").exists()
        rp = proxy_factory(extra=cfg)
        # Served from disk: the apiserver's own JSON, byte for byte, and its selectable field.
        query = "?resourceVersion=0&fieldSelector=spec.color%3Dblue"
        status, via = rp.get(base + query)
        direct = cp.request("GET", base + query)
        assert status == 200 and (status, json.loads(via)["items"]) == (direct[0], json.loads(direct[1])["items"])
        metrics = rp.metrics()
        loads = r'kproxy_watchcache_persist_loads_total\{outcome="loaded",resource="widgets.persist.kproxy.test"\}'
        assert _metric(metrics, loads) == 1
        resource = 'resource="widgets.persist.kproxy.test"'
        served = rf'kproxy_watchcache_reads_total\{{reason="any",{resource},served="cache",verb="list"\}}'
        assert _metric(metrics, served) == 1
    finally:
        crds.uninstall(cp, "widgets.persist.kproxy.test")
    # The definition deleted: the cache is dropped and so are its files.
    eventually(lambda: not list(state.glob(f"{ident}*")), 60, "the deleted resource's files to be removed")
