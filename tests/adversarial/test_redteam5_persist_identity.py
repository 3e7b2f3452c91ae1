"""The persisted watch cache's cluster identity, attacked from outside.

A persisted state is resumed or served while the apiserver answers only once the UID of the
``kube-system`` namespace it recorded equals the apiserver's; while the apiserver cannot be
reached at start it is served on its URL and CA alone (``resourceVersion=0`` reads) and compared
at the first contact. The attacks here go after that first contact: the reads whose own request
to the apiserver *is* the first contact (a consistent list's or watch's freshness probe, a
continue token's compaction probe), a state of this very cluster whose resource version is ahead
of the apiserver's (etcd restored from a backup), and the watches served in the window.

Each test reaches the session's apiserver through a toxiproxy address (its listener closed to
make the apiserver unreachable), and plants "another cluster's" state with kproxy's own writer
(``kproxy.cacher.persist``): the real objects plus one that exists only on disk, recorded for
another UID. The verdict is what kproxy returned, against the apiserver's own answer: the object
that exists only on disk never reaches a caller once kproxy has talked to the apiserver.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import signal
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.plantedstate import PLANTED, get_as, plant, state_on_disk
from kproxy.testing.proxyproc import RunningProxy, start_proxy
from kproxy.testing.toxiproxy import Toxiproxy, rewrite_kubeconfig

pytestmark = pytest.mark.timeout(180)

OTHER = "11111111-2222-4333-8444-555555555555"


def _names(body: bytes) -> set[str]:
    return {i["metadata"]["name"] for i in json.loads(body).get("items") or []}


def _watch_events(rp: RunningProxy, path: str, token: str | None, timeout: float = 15) -> list[dict[str, Any]]:
    """A watch through kproxy, read to its end: its events (JSON lines)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    ctx = ssl.create_default_context(cafile=str(rp.ca_file)) if rp.ca_file and token else None
    req = urllib.request.Request(rp.url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            return [json.loads(line) for line in r.read().splitlines() if line.strip()]
    except urllib.error.HTTPError:
        return []


def _event_names(events: list[dict[str, Any]]) -> set[str]:
    return {(e.get("object") or {}).get("metadata", {}).get("name", "") for e in events} - {""}


def _retry_backoff(rp: RunningProxy) -> float:
    """The longest backoff the configmaps' reflector has logged (seconds; 0 before any)."""
    found = [float(m) for m in re.findall(r"configmaps: upstream [^\n]*?retrying in ([0-9.]+)s", rp.log_text())]
    return max(found, default=0.0)


def _reflector_attempts(rp: RunningProxy) -> int:
    """The configmaps' reflector's attempts kproxy logged: failures, relists, watches sent."""
    pattern = r"configmaps: (upstream|resource version)|upstream (watch|list) /api/v1/configmaps\?(?!.*matches-nothing)"
    return len(re.findall(pattern, rp.log_text()))


class Door:
    """The apiserver behind a toxiproxy address: closed (connections refused) or open."""

    def __init__(self, toxi: Toxiproxy, cp: ControlPlaneInfo, tmp: Path) -> None:
        self.toxi = toxi
        self.name = "door"
        listen = toxi.proxy(self.name, f"127.0.0.1:{cp.apiserver_port}")
        self.kubeconfig = rewrite_kubeconfig(cp.admin_kubeconfig, tmp / f"{self.name}.kubeconfig", f"https://{listen}")

    def close(self) -> None:
        self.toxi._call("POST", f"/proxies/{self.name}", {"enabled": False})

    def open(self) -> None:
        self.toxi._call("POST", f"/proxies/{self.name}", {"enabled": True})


@pytest.fixture
def door(control_plane: ControlPlaneInfo, tmp_path: Path) -> Iterator[Door]:
    toxi = Toxiproxy(tmp_path / "toxiproxy.log")
    try:
        yield Door(toxi, control_plane, tmp_path)
    finally:
        toxi.stop()


def _config(state: Path) -> dict[str, Any]:
    return {
        "log": {"level": "debug"},
        "filters": [{"name": "watchcache", "resources": ["configmaps"], "persist": {"dir": str(state)}}],
    }


def _persisted_run(cp: ControlPlaneInfo, door: Door, tmp: Path, base: str, cfg: dict[str, Any]) -> str:
    """Three configmaps, cached and persisted by a kproxy through ``door``, which then stops; the
    continue token of a one-item consistent list it answered."""
    for i in range(3):
        body = json.dumps({"metadata": {"name": f"cm{i}"}, "data": {"v": str(i)}}).encode()
        assert cp.request("POST", base, body=body)[0] == 201
    rp = start_proxy(tmp / "first", door.kubeconfig, extra=cfg)
    try:
        rp.wait_cached(base, "configmaps", timeout=60)
        status, body = rp.get(f"{base}?limit=1")
        assert status == 200, body
        token: str = json.loads(body)["metadata"]["continue"]
    finally:
        assert rp.stop() == 0
    return token


def _token_rv(token: str) -> int:
    doc = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    return int(doc["rv"])


def _current_rv(cp: ControlPlaneInfo, base: str) -> int:
    return int(json.loads(cp.request("GET", base)[1])["metadata"]["resourceVersion"])


def _start_unreachable(
    tmp: Path, door: Door, cfg: dict[str, Any], credentials: str, cp: ControlPlaneInfo
) -> tuple[RunningProxy, str | None]:
    """kproxy started on the planted state with its apiserver unreachable; its reflector's backoff
    grown to more than a second (so that the next read, not its watch, meets the apiserver first)."""
    door.close()
    token = cp.admin_token if credentials == "forward" else None
    mode: dict[str, Any] = {"credentials": "forward", "tls": True, "token": token} if token else {}
    rp = start_proxy(tmp / "second", door.kubeconfig, extra=cfg, ready=False, **mode)
    eventually(lambda: _retry_backoff(rp) >= 1.6, 30, "the reflector to back off a second or more")
    return rp, token


def _no_leak(rp: RunningProxy) -> None:
    """Neither kproxy's logs nor its metrics name the planted object."""
    assert PLANTED not in rp.log_text()
    assert PLANTED not in rp.metrics()


@pytest.mark.parametrize(
    ("credentials", "read"), [("proxy", "list"), ("proxy", "watch"), ("forward", "list")], ids=lambda v: str(v)
)
def test_a_consistent_read_that_reaches_the_apiserver_never_serves_another_clusters_state(
    credentials: str, read: str, control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path, door: Door
) -> None:
    """Another cluster's state whose resource version is ahead of this apiserver's, loaded while the
    apiserver is unreachable. Once it is back, a consistent list or watch (no resourceVersion:
    what kubectl sends) asks it for its latest resource version first: that request is the first
    contact, and the state must be compared before the cache claims to be as fresh as that answer."""
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    state = tmp_path / "state"
    cfg = _config(state)
    _persisted_run(cp, door, tmp_path, base, cfg)
    ahead = _current_rv(cp, base) + 1_000_000
    plant(state, namespace, OTHER, rv=ahead)
    rp, token = _start_unreachable(tmp_path, door, cfg, credentials, cp)
    try:
        status, body = get_as(rp, f"{base}?resourceVersion=0", token)
        if credentials == "proxy":
            # The documented window: on URL and CA alone while nothing answers (the state is loaded).
            assert status == 200 and PLANTED in _names(body), (status, body[:300])
        else:
            assert status != 200 or PLANTED not in _names(body), body[:300]  # no review, no data
        door.open()
        if read == "list":
            status, body = get_as(rp, base, token)
            assert status == 200, body[:300]
            got = _names(body)
        else:
            got = _event_names(_watch_events(rp, f"{base}?watch=1&timeoutSeconds=1", token))
        assert PLANTED not in got, "another cluster's object served after kproxy reached the apiserver"
        assert got == _names(cp.request("GET", base)[1])

        def converged() -> bool:
            status, body = get_as(rp, f"{base}?resourceVersion=0", token)
            assert PLANTED not in _names(body) or status != 200
            return status == 200 and _names(body) == _names(cp.request("GET", base)[1])

        eventually(converged, 30, "the cache to hold the apiserver's configmaps")
        _no_leak(rp)
    finally:
        rp.stop(signal.SIGKILL)


def test_a_continue_token_from_before_the_restart_never_continues_into_another_clusters_state(
    control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path, door: Door
) -> None:
    """A paginated list begun before kproxy restarted, continued after: the token's revision is the
    loaded state's, and asking the apiserver whether it compacted that revision is the first
    contact. The next page must be this cluster's, never the planted state's."""
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    state = tmp_path / "state"
    cfg = _config(state)
    token = _persisted_run(cp, door, tmp_path, base, cfg)
    plant(state, namespace, OTHER, rv=_token_rv(token))  # the cache reaches the token's revision
    rp, _ = _start_unreachable(tmp_path, door, cfg, "proxy", cp)
    try:
        door.open()
        status, body = rp.get(f"{base}?limit=10&continue={token}")
        assert status == 200, body[:300]
        page = _names(body)
        assert PLANTED not in page, "the next page came from another cluster's state"
        assert page == _names(cp.request("GET", f"{base}?limit=10&continue={token}")[1])
        _no_leak(rp)
    finally:
        rp.stop(signal.SIGKILL)


def test_a_state_of_this_cluster_ahead_of_the_apiserver_is_never_a_consistent_read(
    control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path, door: Door
) -> None:
    """This cluster's UID, a resource version ahead of its apiserver's (etcd restored from a backup
    keeps kube-system's UID and goes back in revisions): the UID check passes. A consistent read,
    which the apiserver answers from its latest revision, must not be the state from disk (its
    resource version is not older than the apiserver's, but no watch of this apiserver confirmed
    it), and the cache must converge to the apiserver's objects."""
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    state = tmp_path / "state"
    cfg = _config(state)
    _persisted_run(cp, door, tmp_path, base, cfg)
    uid = cp.json("GET", "/api/v1/namespaces/kube-system")["metadata"]["uid"]
    plant(state, namespace, uid, rv=_current_rv(cp, base) + 1_000_000)
    rp = start_proxy(tmp_path / "second", door.kubeconfig, extra=cfg, ready=False)
    try:
        status, body = rp.get(base)
        assert status == 200, body[:300]
        assert PLANTED not in _names(body), "a consistent read served a state the apiserver never had"
        got = _event_names(_watch_events(rp, f"{base}?watch=1&timeoutSeconds=1", None))
        assert PLANTED not in got, "a consistent watch started from a state the apiserver never had"

        def converged() -> bool:
            status, body = rp.get(f"{base}?resourceVersion=0")
            return status == 200 and _names(body) == _names(cp.request("GET", base)[1])

        # Listed again, not resumed: the apiserver holds a watch from a revision it has not reached
        # open without an event, and the objects only the state holds would never be deleted.
        eventually(converged, 30, "the cache to list the apiserver's configmaps")
        assert "ahead of the apiserver's" in rp.log_text()
        ahead = r'^kproxy_watchcache_relists_total\{reason="ahead",resource="configmaps"\} (\S+)$'
        relists = re.search(ahead, rp.metrics(), re.M)
        assert relists is not None and float(relists.group(1)) == 1, rp.metrics()
    finally:
        rp.stop(signal.SIGKILL)


def test_the_window_closes_when_the_apiserver_is_back_not_when_the_watch_retries(
    control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path, door: Door
) -> None:
    """``credentials: proxy``, started while the apiserver is unreachable: ``resourceVersion=0``
    reads are served from the loaded state on URL and CA alone (documented). When the apiserver is
    back, the reflector's next attempt may be up to 45 s away (its backoff); meanwhile kproxy
    passes other requests to the apiserver, with its own credentials, and gets answers. Another
    cluster's state must stop being served within a second or so of the apiserver's return, well
    before the reflector's next attempt."""
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    state = tmp_path / "state"
    cfg = _config(state)
    _persisted_run(cp, door, tmp_path, base, cfg)
    plant(state, namespace, OTHER)
    door.close()
    rp = start_proxy(tmp_path / "second", door.kubeconfig, extra=cfg, ready=False)
    try:
        status, body = rp.get(f"{base}?resourceVersion=0")
        assert status == 200 and PLANTED in _names(body), (status, body[:300])  # the documented window
        eventually(lambda: _retry_backoff(rp) >= 3.2, 30, "the reflector to back off three seconds or more")
        retries = _reflector_attempts(rp)
        door.open()
        # Another request passes through kproxy to the apiserver meanwhile: it is reachable.
        assert rp.get(f"/api/v1/namespaces/{namespace}")[0] == 200

        def gone() -> bool:
            status, body = rp.get(f"{base}?resourceVersion=0")
            return status == 200 and PLANTED not in _names(body)

        eventually(gone, 1.5, "the planted state to stop being served once the apiserver answers", interval=0.05)
        assert _reflector_attempts(rp) == retries, "the reflector tried again meanwhile: nothing shown"
        _no_leak(rp)
    finally:
        rp.stop(signal.SIGKILL)


def _reloads(rp: RunningProxy) -> float:
    m = re.search(r'^kproxy_config_reloads_total\{result="success"\} (\S+)$', rp.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


def test_a_config_reload_while_the_state_is_unchecked_neither_serves_nor_rewrites_it(
    control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path, door: Door
) -> None:
    """A reload (a new chain, new caches loading the same files, the old caches' stores closing)
    while another cluster's state is loaded and not yet compared: once the apiserver is back no
    read serves it, and what ends up on disk is this cluster's, without the planted object (no
    store wrote the loaded state as the cluster it found)."""
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    state = tmp_path / "state"
    cfg = _config(state)
    _persisted_run(cp, door, tmp_path, base, cfg)
    plant(state, namespace, OTHER)
    door.close()
    rp = start_proxy(tmp_path / "second", door.kubeconfig, extra=cfg, ready=False)
    try:
        status, body = rp.get(f"{base}?resourceVersion=0")
        assert status == 200 and PLANTED in _names(body), (status, body[:300])  # the documented window
        changed = json.loads(json.dumps(cfg["filters"]))
        changed[0]["bookmark_interval"] = 30
        rp.write_config({"filters": changed})
        eventually(lambda: _reloads(rp) >= 1, 20, "the reload")
        assert state_on_disk(state) == (OTHER, True)  # nothing rewritten while unchecked
        door.open()
        status, body = rp.get(base)
        assert status == 200 and PLANTED not in _names(body), body[:300]

        def converged() -> bool:
            status, body = rp.get(f"{base}?resourceVersion=0")
            assert status != 200 or PLANTED not in _names(body), "served after the apiserver answered"
            return status == 200 and _names(body) == _names(cp.request("GET", base)[1])

        eventually(converged, 30, "the cache to hold the apiserver's configmaps")
        uid = cp.json("GET", "/api/v1/namespaces/kube-system")["metadata"]["uid"]
        eventually(lambda: state_on_disk(state) == (uid, False), 30, "this cluster's state on disk")
        _no_leak(rp)
    finally:
        rp.stop(signal.SIGKILL)


def test_a_watch_served_from_another_clusters_state_is_told_to_relist(
    control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path, door: Door
) -> None:
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    state = tmp_path / "state"
    cfg = _config(state)
    _persisted_run(cp, door, tmp_path, base, cfg)
    plant(state, namespace, OTHER)  # at the state's own resource version: this apiserver has it
    rp, _ = _start_unreachable(tmp_path, door, cfg, "proxy", cp)
    events: list[dict[str, Any]] = []
    ended = threading.Event()

    def watch() -> None:
        conn = http.client.HTTPConnection(rp.url.removeprefix("http://"), timeout=60)
        conn.request("GET", f"{base}?watch=1&resourceVersion=0&allowWatchBookmarks=true&timeoutSeconds=60")
        resp = conn.getresponse()
        try:
            while line := resp.readline():
                if line.strip():
                    events.append(json.loads(line))
        except OSError:
            pass
        finally:
            ended.set()
            conn.close()

    threading.Thread(target=watch, daemon=True).start()
    try:
        eventually(lambda: PLANTED in _event_names(events), 15, "the watch to start (the documented window)")
        door.open()
        rp.get(base)  # the first contact (else the reflector's next attempt)
        assert ended.wait(60), "the watch served from the discarded state did not end"
        last = events[-1]
        assert last.get("type") == "ERROR" and last["object"].get("code") == 410, last
    finally:
        rp.stop(signal.SIGKILL)
