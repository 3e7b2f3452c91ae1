"""With ``resources: ["*"]`` the watch cache keeps every cache through a restarting apiserver's
partial discovery, and drops a custom resource's cache when its definition is really deleted.

A restarting kube-apiserver answers ``/apis`` before it has loaded its APIServices: for ~0.1 s it
lists ``apiregistration.k8s.io`` alone, about a second before ``/readyz`` turns ok. The test holds
the apiserver in that state for as long as it needs, deterministically: it starts the apiserver
again and freezes etcd (SIGSTOP) at its first answer to ``/apis``; the apiserver cannot finish
loading, so discovery stays partial and ``/readyz`` failing until etcd is let go. kproxy refreshes
discovery every 0.2 s meanwhile. Clients nobody on the project wrote watch cached non-core
resources through kproxy all along (a client-go informer and the official Python client, on a
custom resource and on deployments): neither may list again, see a 410 or an error, or have its
watch closed; kproxy must drop no cache and log no traceback.

The second test deletes a definition for real: its cache is dropped at once (the definition's
DELETED event), after its objects' deletions reached the watchers, whose watches then end.

Each test runs its own control plane (it kills the apiserver and freezes etcd).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from kproxy.localcluster import envtest
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.crds import crd, install
from kproxy.testing.eventually import eventually
from kproxy.testing.informer import Informer
from kproxy.testing.proxyproc import RunningProxy, start_proxy

GROUP = "blip.example.com"
EVERYTHING = {"filters": [{"name": "watchcache", "resources": ["*"], "rediscovery_interval": 0.2}]}


@pytest.fixture(scope="module")
def own_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneInfo]:
    """A control plane of this module's own: its apiserver is killed and its etcd frozen."""
    directory = tmp_path_factory.mktemp("blip-envtest")
    try:
        yield envtest.up(directory)
    finally:
        envtest.down(directory)


@pytest.fixture
def kproxy(own_cp: ControlPlaneInfo, tmp_path: Path) -> Iterator[RunningProxy]:
    rp = start_proxy(tmp_path / "kproxy", own_cp.admin_kubeconfig, extra=EVERYTHING)
    yield rp
    rp.stop(signal.SIGKILL)


@pytest.fixture
def ns(own_cp: ControlPlaneInfo) -> str:
    name = f"blip-{secrets.token_hex(3)}"
    body = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}).encode()
    status, resp = own_cp.request("POST", "/api/v1/namespaces", body=body)
    assert status == 201, resp
    return name


def post(cp: ControlPlaneInfo, path: str, obj: dict[str, Any]) -> None:
    status, body = cp.request("POST", path, body=json.dumps(obj).encode())
    assert status == 201, body


def widget(plural_kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": plural_kind, "metadata": {"name": name}, "spec": {"n": 0}}


def deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]},
            },
        },
    }


def cached_watches(rp: RunningProxy, resource: str) -> float:
    """Open watches kproxy serves from its cache of ``resource`` (``widgets.blip.example.com``)."""
    for line in rp.metrics().splitlines():
        if line.startswith(f'kproxy_watchcache_watches{{resource="{resource}"}} '):
            return float(line.split()[-1])
    return 0.0


def log_has(rp: RunningProxy, *needles: str) -> bool:
    text = rp.log_text()
    return any(n in text for n in needles)


# --------------------------------------------------------------------------- the Python client


class PyWatcher:
    """The official Python client as a controller uses it: list, watch from the list's resource
    version, resume from the last one seen when the stream ends, list again only on a 410."""

    def __init__(self, list_fn: Callable[..., Any], *args: str) -> None:
        self.list_fn, self.args = list_fn, args
        self.lists = self.watches = 0
        self.errors: list[str] = []  # 410s, failed watch requests
        self.ends: list[str] = []  # streams that ended or broke
        self.types: list[str] = []
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _list(self) -> str:
        self.lists += 1
        listing = json.loads(self.list_fn(*self.args, _preload_content=False).data)
        rv: str = listing["metadata"]["resourceVersion"]
        return rv

    def _run(self) -> None:
        rv = self._list()
        self.synced.set()
        while not self._stop.is_set():
            self._watch = w = watch.Watch()
            self.watches += 1
            try:
                for event in w.stream(
                    self.list_fn,
                    *self.args,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=900,  # no silent retry after a 410: every 410 is seen here
                    deserialize=False,
                ):
                    rv = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self.types.append(event["type"])
            except ApiException as e:
                if self._stop.is_set():
                    return
                self.errors.append(f"{e.status}: {e.reason}")
                if e.status == 410:
                    rv = self._list()
                else:
                    self._stop.wait(1)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                if self._stop.is_set():
                    return
                self.ends.append(repr(e))
                self._stop.wait(0.5)
            else:
                if not self._stop.is_set():
                    self.ends.append("stream ended")

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(5)


# --------------------------------------------------------------------------- the restart


#: What kube-apiserver logs as it installs its last API group (the aggregator's), after it has
#: connected to etcd and before it serves: from then on it needs etcd to load its APIServices.
LAST_INSTALL = b"Skipping API apiregistration.k8s.io/v1beta1"


def restart_into_partial_discovery(cp: ControlPlaneInfo) -> threading.Thread:
    """Kill the apiserver, start it again and freeze etcd just before it serves: it then answers
    ``/apis`` without its APIServices (every group but ``apiregistration.k8s.io`` missing) and
    ``/readyz`` with a failure until :func:`thaw`. Returns the thread that waits for the
    apiserver to be ready again."""
    cp.stop_apiserver(kill=True)
    offset = cp.apiserver_log.stat().st_size
    starter = threading.Thread(target=cp.start_apiserver, name="apiserver-start", daemon=True)
    starter.start()
    deadline = time.monotonic() + 60
    with cp.apiserver_log.open("rb") as log:
        log.seek(offset)
        seen = b""
        while LAST_INSTALL not in seen:
            assert time.monotonic() < deadline, "the restarted apiserver never installed its APIs"
            seen = seen[-len(LAST_INSTALL) :] + log.read()
            time.sleep(0.002)
    assert cp.etcd_pid is not None
    os.kill(cp.etcd_pid, signal.SIGSTOP)
    eventually(lambda: _groups(cp) == ["apiregistration.k8s.io"], 30, "the apiserver to serve its partial discovery")
    return starter


def _groups(cp: ControlPlaneInfo) -> list[str] | None:
    try:
        status, body = cp.request("GET", "/apis", timeout=5)
    except OSError:
        return None
    return [g["name"] for g in json.loads(body)["groups"]] if status == 200 else None


def thaw(cp: ControlPlaneInfo, starter: threading.Thread) -> None:
    assert cp.etcd_pid is not None
    os.kill(cp.etcd_pid, signal.SIGCONT)
    starter.join(120)
    assert cp.readyz(), "the apiserver did not become ready again"


# --------------------------------------------------------------------------- the tests


def test_partial_discovery_while_restarting_drops_no_cache(
    own_cp: ControlPlaneInfo, kproxy: RunningProxy, ns: str
) -> None:
    cp, rp = own_cp, kproxy
    install(cp, crd(GROUP, "widgets", "Widget"))
    widgets, deployments = f"/apis/{GROUP}/v1/namespaces/{ns}/widgets", f"/apis/apps/v1/namespaces/{ns}/deployments"
    for i in range(3):
        post(cp, widgets, widget("Widget", f"w{i}"))
        post(cp, deployments, deployment(f"d{i}"))
    rp.wait_cached(widgets, f"widgets.{GROUP}")
    rp.wait_cached(deployments, "deployments.apps")
    api = config.new_client_from_config(str(rp.kubeconfig))
    py_widgets = PyWatcher(client.CustomObjectsApi(api).list_namespaced_custom_object, GROUP, "v1", ns, "widgets")
    py_deployments = PyWatcher(client.AppsV1Api(api).list_namespaced_deployment, ns)
    inf = Informer(rp.kubeconfig, namespace=ns, resource=f"{GROUP}/v1/widgets")
    watchers = (py_widgets, py_deployments)
    try:
        assert py_widgets.synced.wait(30) and py_deployments.synced.wait(30)
        inf.wait(lambda: bool(inf.of("synced")), 60, "first sync")
        eventually(lambda: cached_watches(rp, f"widgets.{GROUP}") >= 2, 30, "kproxy to serve the widget watches")
        eventually(lambda: cached_watches(rp, "deployments.apps") >= 1, 30, "kproxy to serve the deployment watch")

        starter = restart_into_partial_discovery(cp)
        try:
            # kproxy reads discovery while it lacks every non-core group and /readyz fails.
            eventually(
                lambda: log_has(rp, "while the apiserver is not ready", "dropping its cache"),
                15,
                "kproxy to read the partial discovery",
                interval=0.1,
            )
        finally:
            thaw(cp, starter)
        eventually(lambda: log_has(rp, "again; their caches were kept", "dropping its cache"), 20, "a full discovery")
        dropped = [line for line in rp.log_text().splitlines() if "dropping its cache" in line]
        assert not dropped, f"kproxy dropped {len(dropped)} caches on a partial discovery: {dropped[:3]}"

        # The same watches carry what happens next.
        status, body = cp.request(
            "PATCH", f"{widgets}/w0", body=b'{"spec":{"n":1}}', content_type="application/merge-patch+json"
        )
        assert status == 200, body
        post(cp, deployments, deployment("d9"))
        eventually(lambda: "MODIFIED" in py_widgets.types and "ADDED" in py_deployments.types, 30, "the events")
        inf.wait(lambda: any(e["type"] == "MODIFIED" for e in inf.of("event")), 30, "the informer's event")
    finally:
        for w in watchers:
            w.stop()
        inf.stop()

    log = rp.log_text()
    assert "dropping its cache" not in log, [line for line in log.splitlines() if "dropping" in line]
    assert "Traceback" not in log
    for w in watchers:
        assert w.lists == 1 and w.watches == 1 and not w.errors and not w.ends, (w.lists, w.errors, w.ends)
    bad = [line for line in inf.lines if line["kind"] in ("watch-error", "watch-error-event", "watch-open-error")]
    assert not bad, bad
    assert len(inf.of("list")) == 1, inf.of("list")
    assert len(inf.of("watch")) == 1, inf.of("watch")


def test_deleted_definition_drops_its_cache_and_ends_its_watches(
    own_cp: ControlPlaneInfo, kproxy: RunningProxy, ns: str
) -> None:
    cp, rp = own_cp, kproxy
    name = f"gadgets.{GROUP}"
    install(cp, crd(GROUP, "gadgets", "Gadget"))
    gadgets = f"/apis/{GROUP}/v1/namespaces/{ns}/gadgets"
    for i in range(2):
        post(cp, gadgets, widget("Gadget", f"g{i}"))
    rp.wait_cached(gadgets, name)
    api = config.new_client_from_config(str(rp.kubeconfig))
    py = PyWatcher(client.CustomObjectsApi(api).list_namespaced_custom_object, GROUP, "v1", ns, "gadgets")
    inf = Informer(rp.kubeconfig, namespace=ns, resource=f"{GROUP}/v1/gadgets")
    try:
        assert py.synced.wait(30)
        inf.wait(lambda: bool(inf.of("synced")), 60, "first sync")
        eventually(lambda: cached_watches(rp, name) >= 2, 30, "kproxy to serve both watches from its cache")

        status, body = cp.request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        assert status == 200, body
        # The apiserver deletes the objects first; their DELETED events reach both clients, then
        # kproxy drops the cache (the definition's own DELETED event) and ends the watches.
        eventually(lambda: py.types.count("DELETED") == 2 and bool(py.ends), 30, "the Python watch to end")
        inf.wait(lambda: len([e for e in inf.of("event") if e["type"] == "DELETED"]) == 2, 30, "the deletions")
        inf.wait(lambda: len(inf.of("watch")) >= 2, 30, "the informer's watch to end")
        assert log_has(rp, f"{name} has had its CustomResourceDefinition deleted; dropping its cache")
        assert cached_watches(rp, name) == 0
    finally:
        py.stop()
        inf.stop()
    assert py.ends == ["stream ended"], py.ends
    assert "Traceback" not in rp.log_text()
    assert [e["type"] for e in inf.of("event")] == ["ADDED", "ADDED", "DELETED", "DELETED"]


def test_progress_probe_left_behind_by_a_read_fails_quietly(
    own_cp: ControlPlaneInfo, kproxy: RunningProxy, ns: str
) -> None:
    """A read that waits for the cache to reach a resource version asks the apiserver to confirm
    the cache's progress; the read stops waiting after 3 s (the apiserver frozen), and its probe
    fails later (the apiserver killed). That failure is the probe's own: no traceback."""
    cp, rp = own_cp, kproxy
    configmaps = f"/api/v1/namespaces/{ns}/configmaps"
    rp.wait_cached(configmaps, "configmaps")
    assert cp.apiserver_pid is not None
    os.kill(cp.apiserver_pid, signal.SIGSTOP)
    try:
        status, body = rp.get(f"{configmaps}?resourceVersion=999999999&resourceVersionMatch=NotOlderThan", timeout=20)
        assert status == 504, body  # Too large resource version: the cache could not confirm it in time
    finally:
        cp.stop_apiserver(kill=True)  # the probe's request breaks here
        cp.start_apiserver()
    eventually(lambda: rp.get(f"{configmaps}?resourceVersion=0")[0] == 200, 30, "kproxy to answer again")
    assert "Traceback" not in rp.log_text()
