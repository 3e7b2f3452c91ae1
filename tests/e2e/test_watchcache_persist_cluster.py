"""A persisted watch cache belongs to one cluster: the UID of its ``kube-system`` namespace.

The state's URL and CA do not tell apart two clusters behind one URL and one CA (in-cluster every
kproxy sees ``https://kubernetes.default.svc``). Each snapshot records kube-system's UID, and a
restarted kproxy compares it with the apiserver's (read with its own credentials) before it
resumes the watch or serves anything of the state. The other cluster's state is made here by
rewriting a real one with kproxy's own writer (``kproxy.cacher.persist``): the same objects plus
one that exists only on disk, recorded for another UID (or the right one, read by a kproxy that
may not get kube-system). The apiserver accepts the persisted resource version (it is its own),
so only the comparison keeps the planted object out."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_helm import Helm, ensure_helm, kinds, rules_of
from test_helm_persist import PERSISTED
from test_watchcache_persist import _config, _fill, _first_run, _metric, _state, _upstream_requests
from watchcache_diff import reads_total

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.localcluster.kubeconfigs import write_kubeconfig
from kproxy.testing.eventually import eventually
from kproxy.testing.plantedstate import IDENT, PLANTED, get_as, plant, state_on_disk
from kproxy.testing.proxyproc import RunningProxy


def _kube_system_uid(cp: ControlPlaneInfo) -> str:
    uid: str = cp.json("GET", "/api/v1/namespaces/kube-system")["metadata"]["uid"]
    return uid


def _never_planted(rp: RunningProxy, cp: ControlPlaneInfo, base: str, token: str | None = None) -> Callable[[], bool]:
    """Each call: a ``resourceVersion=0`` list through kproxy, asserted without ``PLANTED``;
    True once it equals the apiserver's."""

    def check() -> bool:
        status, via = get_as(rp, f"{base}?resourceVersion=0", token)
        assert status == 200, via
        assert PLANTED not in _state(via), "an object of the planted state was served"
        return _state(via) == _state(cp.request("GET", base)[1])

    return check


class HeldRelay:
    """A TCP relay to the apiserver whose new connections wait while ``held`` is set (``waiting``:
    one does), so that a read reaches kproxy before kproxy has reached the apiserver."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.held = threading.Event()
        self.waiting = threading.Event()
        self._released = threading.Event()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, name="held-relay", daemon=True).start()

    def kubeconfig(self, admin: Path, out: Path) -> Path:
        cfg = yaml.safe_load(admin.read_text())
        for cluster in cfg["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        out.write_text(yaml.safe_dump(cfg))
        return out

    def hold(self) -> None:
        self._released.clear()
        self.held.set()

    def release(self) -> None:
        self.held.clear()
        self._released.set()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        if self.held.is_set():
            self.waiting.set()
            self._released.wait()
        up = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        up.settimeout(None)
        self._open += [conn, up]
        threading.Thread(target=self._pump, args=(conn, up), daemon=True).start()
        self._pump(up, conn)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.release()
        self.server.close()
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def held_relay(control_plane: ControlPlaneInfo) -> Iterator[HeldRelay]:
    relay = HeldRelay(control_plane.apiserver_port)
    yield relay
    relay.close()


@pytest.mark.parametrize("credentials", ["proxy", "forward"])
def test_state_of_another_cluster_is_never_served_nor_resumed(
    credentials: str,
    proxy_factory: Callable[..., RunningProxy],
    control_plane: ControlPlaneInfo,
    namespace: str,
    tmp_path: Path,
    held_relay: HeldRelay,
) -> None:
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    _fill(cp, base, 5)
    state = tmp_path / "state"
    cfg = _config(state)
    upstream = held_relay.kubeconfig(cp.admin_kubeconfig, tmp_path / "relay.kubeconfig")
    rp = proxy_factory(extra=cfg, upstream_kubeconfig=upstream)
    _first_run(lambda **kw: rp, cp, base, cfg)
    uid = _kube_system_uid(cp)
    assert state_on_disk(state) == (uid, False)  # a state written by kproxy records the cluster
    other = "11111111-2222-4333-8444-555555555555"
    plant(state, namespace, other)

    # Restarted with its upstream held: the first read arrives before kproxy could ask the
    # apiserver anything, and waits for the comparison (a kproxy without it serves from disk).
    held_relay.hold()
    # In forward mode too, the comparison uses the cache's own client (kproxy's credentials).
    token = cp.admin_token if credentials == "forward" else None
    mode: dict[str, Any] = {"credentials": "forward", "tls": True, "token": token} if token else {}
    rp = proxy_factory(extra=cfg, upstream_kubeconfig=upstream, ready=False, **mode)
    assert held_relay.waiting.wait(30)
    check = _never_planted(rp, cp, base, token)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(check)
        eventually(
            lambda: first.done() or "kproxy_requests_in_flight 1.0" in rp.metrics(), 30, "the read to reach kproxy"
        )
        held_relay.release()
        first.result()
    eventually(check, 30, "the cache to hold the apiserver's configmaps")
    assert cp.request("POST", base, body=json.dumps({"metadata": {"name": "after"}}).encode())[0] == 201
    eventually(check, 30, "the cache to follow the apiserver")
    log = rp.log_text()
    warnings = [line for line in log.splitlines() if f"has UID {other}" in line]
    assert len(warnings) == 1, log
    assert f"the apiserver's has UID {uid}" in warnings[0] and '"level":"warning"' in warnings[0], warnings
    # Listed afresh, not resumed from the planted resource version.
    requests = _upstream_requests(rp, "configmaps")
    assert requests and "sendInitialEvents" in requests[0], requests
    # Counted as a list made again for that reason, and logged as such.
    metrics = rp.metrics()
    discarded = r'kproxy_watchcache_relists_total\{reason="discarded",resource="configmaps"\}'
    assert _metric(metrics, discarded) == 1, metrics
    assert "the persisted state is not resumed" in log and "expired upstream" not in log
    # The planted files were replaced: a snapshot of this cluster, without the planted object.
    eventually(lambda: state_on_disk(state) == (uid, False), 30, "the planted state to be replaced on disk")
    assert rp.stop() == 0


def test_state_of_this_cluster_is_resumed_without_a_list(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path
) -> None:
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    _fill(cp, base, 5)
    state = tmp_path / "state"
    cfg = _config(state)
    _first_run(proxy_factory, cp, base, cfg)
    uid = _kube_system_uid(cp)
    plant(state, namespace, uid)  # recorded for this cluster: kproxy's own state, one object more
    rp = proxy_factory(extra=cfg)
    status, first = rp.get(f"{base}?resourceVersion=0")
    assert status == 200 and PLANTED in _state(first)  # the state on disk is served (and was resumed)
    assert cp.request("DELETE", f"{base}/cm1")[0] == 200
    eventually(lambda: "cm1" not in _state(rp.get(f"{base}?resourceVersion=0")[1]), 30, "the deletion to arrive")
    requests = _upstream_requests(rp, "configmaps")
    assert requests, rp.log_text()[-3000:]
    assert not [r for r in requests if r.startswith("upstream list ") or "sendInitialEvents" in r], requests
    assert _metric(rp.metrics(), r'kproxy_watchcache_relists_total\{reason="[a-z]+",resource="configmaps"\}') == 0
    assert "persisted state recorded for the cluster" not in rp.log_text()


@pytest.fixture
def reader_without_kube_system(control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig of a ServiceAccount that may read configmaps (and the CRDs kproxy follows)
    everywhere but may not get the kube-system namespace."""
    cp = control_plane
    name = f"kproxy-no-kube-system-{secrets.token_hex(3)}"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    read = ["get", "list", "watch"]
    role: dict[str, Any] = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole"}
    role["metadata"] = {"name": name}
    role["rules"] = [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": read},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": read},
    ]
    binding: dict[str, Any] = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding"}
    binding["metadata"] = {"name": name}
    binding["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
    binding["subjects"] = [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]
    try:
        cp.json("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "reader"}})
        cp.json("POST", f"{rbac}/clusterroles", role)
        cp.json("POST", f"{rbac}/clusterrolebindings", binding)
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        }
        token = cp.json("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/reader/token", request)
        kubeconfig = write_kubeconfig(
            tmp_path / "reader.kubeconfig",
            server=cp.server,
            ca_file=cp.ca_file,
            user="reader",
            token=token["status"]["token"],
        )
        code, _ = cp.request("GET", "/api/v1/namespaces/kube-system", token=token["status"]["token"])
        assert code == 403  # at the apiserver: this identity may not read it
        yield kubeconfig
    finally:
        cp.request("DELETE", f"{rbac}/clusterrolebindings/{name}")
        cp.request("DELETE", f"{rbac}/clusterroles/{name}")
        cp.request("DELETE", f"/api/v1/namespaces/{namespace}/serviceaccounts/reader")


def test_state_not_resumed_when_kube_system_cannot_be_read(
    proxy_factory: Callable[..., RunningProxy],
    control_plane: ControlPlaneInfo,
    namespace: str,
    tmp_path: Path,
    reader_without_kube_system: Path,
) -> None:
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    _fill(cp, base, 5)
    state = tmp_path / "state"
    cfg = _config(state)
    _first_run(proxy_factory, cp, base, cfg)
    plant(state, namespace, _kube_system_uid(cp))  # the right UID: only its check is missing
    rp = proxy_factory(extra=cfg, upstream_kubeconfig=reader_without_kube_system)
    eventually(_never_planted(rp, cp, base), 30, "the cache to hold the apiserver's configmaps")
    log = rp.log_text()
    assert "`get` on `namespaces`, resourceName `kube-system`" in log and "HTTP 403" in log, log[-3000:]
    requests = _upstream_requests(rp, "configmaps")
    assert requests and "sendInitialEvents" in requests[0], requests
    # The cache works (the reads above may all have gone upstream while it filled).
    never_planted = _never_planted(rp, cp, base)

    def from_the_cache() -> bool:
        never_planted()
        return reads_total(rp.metrics(), resource="configmaps", verb="list", served="cache") >= 1

    eventually(from_the_cache, 30, "a list answered by the cache")
    # Nothing is persisted that a later start could not verify.
    eventually(lambda: not list(state.glob(f"{IDENT}*")), 30, "the state's files to be removed")
    assert rp.stop() == 0
    assert not list(state.glob(f"{IDENT}*")), sorted(p.name for p in state.iterdir())


def test_chart_grants_get_on_kube_system_only_with_persist(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    """The chart's ClusterRole lets kproxy read kube-system (by name, nothing else of namespaces)
    when a watchcache filter persists; applied for real and asked of the apiserver's authorizer."""
    chart = Helm(ensure_helm(), tmp_path)
    rule = {"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]}
    without = {**PERSISTED, "persistence": {"enabled": False}}
    without["config"] = {"filters": [{"name": "watchcache", "resources": ["pods"]}]}
    assert rule not in rules_of(chart.template(without))
    docs = [
        d
        for d in chart.template(PERSISTED, namespace=namespace)
        if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    assert rule in rules_of(docs)
    kubectl(["apply", "-f", "-"], input="\n---\n".join(yaml.safe_dump(d) for d in docs))
    try:
        sa = f"system:serviceaccount:{namespace}:{kinds(docs)['ServiceAccount']['metadata']['name']}"

        def can_i(*what: str) -> bool:
            return kubectl(["auth", "can-i", *what, f"--as={sa}"], check=False).stdout.strip() == "yes"

        assert can_i("get", "namespaces/kube-system")
        assert not can_i("get", "namespaces/default") and not can_i("list", "namespaces")
    finally:
        for d in docs:
            if d["kind"] != "ServiceAccount":
                kubectl(["delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"])
