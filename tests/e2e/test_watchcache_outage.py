"""Real controllers through kproxy's watch cache keep a correct copy across upstream outages, with no
410 storm.

A client-go shared informer (tests/e2e/informer, built from its Go module) and the official Python
client's watch (resumed from the last resource version, relisting only on a 410, as a controller
does) watch pods through kproxy while a writer mutates them and (a) the apiserver is killed and
started again, (b) kproxy is cut off from the apiserver (a relay the test controls) while pods are
created, changed and deleted, etcd is compacted and the apiserver restarted, so that once reconnected
kproxy's own upstream watch gets 410 Expired and kproxy relists. Each client's final state equals
the apiserver's; neither ever saw a 410, an ERROR event or a watch error, and neither listed again
after its first list: kproxy kept their watches open (or let them resume) and sent them the
difference as ordinary events.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families
from test_watchcache_recovery import _compact

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.informer import Informer
from kproxy.testing.proxyproc import RunningProxy

CACHE_PODS = {"filters": [{"name": "watchcache", "resources": ["pods"]}]}


def metric(rp: RunningProxy, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(rp.metrics()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def served_watches(rp: RunningProxy) -> float:
    return metric(rp, "kproxy_watchcache_reads_total", resource="pods", verb="watch", served="cache")


# --------------------------------------------------------------------------- the writer


def _pod(name: str, version: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"v": version}},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]},
        }
    ).encode()


class Writer:
    """Creates, relabels and deletes pods straight on the apiserver."""

    def __init__(self, cp: ControlPlaneInfo, namespace: str) -> None:
        self.cp, self.base = cp, f"/api/v1/namespaces/{namespace}/pods"
        self.version = 0

    def create(self, name: str) -> None:
        status, body = self.cp.request("POST", self.base, body=_pod(name, "0"))
        assert status == 201, body

    def modify(self, name: str) -> None:
        self.version += 1
        patch = json.dumps({"metadata": {"labels": {"v": str(self.version)}}}).encode()
        status, body = self.cp.request(
            "PATCH", f"{self.base}/{name}", body=patch, content_type="application/merge-patch+json"
        )
        assert status == 200, body

    def delete(self, name: str) -> None:
        # No kubelet: an unscheduled pod is removed at once (no graceful phase).
        status, body = self.cp.request("DELETE", f"{self.base}/{name}")
        assert status == 200, body

    def state(self) -> dict[str, str]:
        """The apiserver's own (consistent) list: namespace/name -> resourceVersion."""
        status, body = self.cp.request("GET", self.base)
        assert status == 200, body
        return {
            f"{i['metadata']['namespace']}/{i['metadata']['name']}": i["metadata"]["resourceVersion"]
            for i in json.loads(body)["items"]
        }


# --------------------------------------------------------------------------- kproxy's cuttable upstream


class Forwarder:
    """A TCP relay between kproxy and the apiserver that the test can cut: kproxy's upstream goes
    down while the apiserver stays up for the test's own writes (changes kproxy can only learn of
    by listing again once the relay is back)."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.cut_off = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="forwarder", daemon=True).start()

    def kubeconfig(self, admin: Path, out: Path) -> Path:
        """``admin`` with its server moved to the relay (the apiserver's certificate is for 127.0.0.1)."""
        cfg = yaml.safe_load(admin.read_text())
        for cluster in cfg["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        out.write_text(yaml.safe_dump(cfg))
        return out

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            if self.cut_off.is_set():
                conn.close()
                continue
            try:
                up = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:  # the apiserver is down: so is the relay
                conn.close()
                continue
            up.settimeout(None)
            with self._lock:
                self._open |= {conn, up}
            for src, dst in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._open -= {src, dst}

    def cut(self) -> None:
        """Break every relayed connection and refuse new ones."""
        self.cut_off.set()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        self.cut_off.clear()

    def close(self) -> None:
        self.cut()
        self.server.close()


# --------------------------------------------------------------------------- the Python controller


class PyWatcher:
    """The official Python client as a controller uses it: list, then watch from the list's
    resource version, resume from the last one seen when the stream ends, relist only on a 410."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
        self.namespace = namespace
        self.state: dict[str, str] = {}
        self.lists = 0
        self.watches = 0
        self.errors: list[str] = []  # ERROR events / 410s / failed watch requests
        self.disconnects: list[str] = []  # streams that broke (kproxy should keep them open)
        self.types: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self.synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name="py-watcher", daemon=True)
        self._thread.start()

    def _list(self) -> str:
        pods = self.api.list_namespaced_pod(self.namespace, _preload_content=False)
        listing = json.loads(pods.data)
        with self._lock:
            self.lists += 1
            self.state = {
                f"{i['metadata']['namespace']}/{i['metadata']['name']}": i["metadata"]["resourceVersion"]
                for i in listing["items"]
            }
        rv: str = listing["metadata"]["resourceVersion"]
        return rv

    def _run(self) -> None:
        rv = self._list()
        self.synced.set()
        while not self._stop.is_set():
            self._watch = w = watch.Watch()
            with self._lock:
                self.watches += 1
            try:
                # timeout_seconds turns off the client's silent retry after a 410: every 410 is seen here.
                for event in w.stream(
                    self.api.list_namespaced_pod,
                    self.namespace,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=900,
                    deserialize=False,
                ):
                    kind, obj = event["type"], event["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if kind == "BOOKMARK":
                        continue
                    key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
                    with self._lock:
                        self.types.append(kind)
                        if kind == "DELETED":
                            self.state.pop(key, None)
                        else:
                            self.state[key] = rv
            except ApiException as e:
                if self._stop.is_set():
                    return
                with self._lock:
                    self.errors.append(f"{e.status}: {e.reason}")
                if e.status == 410:
                    rv = self._list()
                else:
                    self._stop.wait(1)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                if self._stop.is_set():
                    return
                with self._lock:
                    self.disconnects.append(repr(e))
                self._stop.wait(0.5)
            else:
                if not self._stop.is_set():
                    with self._lock:
                        self.disconnects.append("stream ended")

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return dict(self.state)

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(10)


# --------------------------------------------------------------------------- the test


@pytest.fixture
def relay(control_plane: ControlPlaneInfo) -> Iterator[Forwarder]:
    fwd = Forwarder(control_plane.apiserver_port)
    yield fwd
    fwd.close()


@pytest.fixture
def informer_factory() -> Iterator[Callable[..., Informer]]:
    started: list[Informer] = []

    def make(kubeconfig: Path, namespace: str = "", env: dict[str, str] | None = None) -> Informer:
        inf = Informer(kubeconfig, namespace=namespace, env=env)
        started.append(inf)
        return inf

    yield make
    for inf in started:
        inf.stop()


def _no_errors(inf: Informer, py: PyWatcher) -> None:
    bad = [line for line in inf.lines if line["kind"] in ("watch-error", "watch-error-event", "watch-open-error")]
    assert not bad, f"the informer saw watch errors: {bad}"
    assert not py.errors, f"the Python watch saw errors: {py.errors}"


def _converged(inf: Informer, py: PyWatcher, writer: Writer, what: str, timeout: float = 90) -> None:
    last: dict[str, Any] = {}

    def same() -> bool:
        last["direct"] = direct = writer.state()
        last["informer"] = inf.store()
        last["python"] = py.snapshot()
        return bool(last["informer"] == direct and last["python"] == direct)

    try:
        eventually(same, timeout, what, interval=0.3)
    except AssertionError as e:
        raise AssertionError(f"{e}: {last}\ninformer stderr: {inf.stderr[-2000:]!r}") from None


#: The compression filter in front: client-go asks for gzip, and its cached watches are one gzip
#: stream shared by the watchers in step (members ended and restarted as they diverge).
COMPRESSED_CACHE_PODS = {"filters": [{"name": "compression", "watch": True}, *CACHE_PODS["filters"]]}


@pytest.mark.parametrize(
    ("watch_list", "credentials", "compressed"),
    [(True, "proxy", False), (False, "proxy", False), (True, "forward", False), (True, "proxy", True)],
    ids=["watchlist", "list-then-watch", "watchlist-forward", "watchlist-compressed"],
)
def test_clients_keep_a_correct_copy_through_outage_and_compaction(
    proxy_factory: Callable[..., RunningProxy],
    control_plane: ControlPlaneInfo,
    namespace: str,
    informer_factory: Callable[..., Informer],
    watch_list: bool,
    credentials: str,
    compressed: bool,
    relay: Forwarder,
    tmp_path: Path,
) -> None:
    cp = control_plane
    writer = Writer(cp, namespace)
    for i in range(6):
        writer.create(f"p{i}")
    upstream = relay.kubeconfig(cp.admin_kubeconfig, tmp_path / "relay.kubeconfig")
    # forward: the clients' own bearer token reaches the apiserver, and kproxy authorizes each cached
    # watch for the caller when it starts (over TLS: clients send tokens only over TLS).
    forward = {"credentials": "forward", "tls": True, "token": cp.admin_token} if credentials == "forward" else {}
    chain = COMPRESSED_CACHE_PODS if compressed else CACHE_PODS
    rp = proxy_factory(extra=chain, upstream_kubeconfig=upstream, **forward)
    cached_lists = client.CoreV1Api(config.new_client_from_config(str(rp.kubeconfig)))

    def cache_ready() -> bool:
        try:
            cached_lists.list_namespaced_pod(namespace, resource_version="0")
        except ApiException:
            return False
        return metric(rp, "kproxy_watchcache_reads_total", resource="pods", verb="list", served="cache") > 0

    eventually(cache_ready, 60, "the pods cache to be ready", interval=0.2)

    # client-go defaults to WatchListClient (a watch with sendInitialEvents instead of a LIST); the
    # other mode is what older controllers and a disabled feature gate do.
    env = {"KUBE_FEATURE_WatchListClient": str(watch_list).lower()}
    inf = informer_factory(rp.kubeconfig, namespace, env)
    inf.wait(lambda: bool(inf.of("synced")), 60, "first sync")
    py = PyWatcher(rp.kubeconfig, namespace)
    try:
        assert py.synced.wait(30), "the Python client's first list"
        eventually(lambda: served_watches(rp) >= 2, 30, "kproxy to serve both watches from its cache")
        eventually(lambda: metric(rp, "kproxy_watchcache_watches", resource="pods") >= 2, 30, "two open watches")
        writer.modify("p0")
        writer.create("p6")
        writer.delete("p1")
        _converged(inf, py, writer, "both clients to follow the first writes")

        # (a) The apiserver is killed: writes just before, and just after it is back.
        writer.modify("p2")
        writer.delete("p3")
        cp.stop_apiserver(kill=True)
        cp.start_apiserver()
        writer.create("p7")
        writer.modify("p4")
        writer.delete("p5")
        _converged(inf, py, writer, "both clients to converge after the apiserver restart")
        _no_errors(inf, py)

        # (b) kproxy is cut off from the apiserver; meanwhile pods are created, changed and deleted,
        # etcd is compacted past everything kproxy's upstream watch has seen and the apiserver is
        # started again with an empty watch cache. When kproxy is reconnected its resume gets 410
        # Expired; it lists again and sends the clients the difference (ADDED, MODIFIED, DELETED).
        relists = metric(rp, "kproxy_watchcache_relists_total", resource="pods", reason="expired")
        events_in = metric(rp, "kproxy_watchcache_events_total", resource="pods")
        before = writer.state()
        relay.cut()
        writer.create("p8")  # ADDED
        writer.delete("p0")  # DELETED
        writer.modify("p2")  # MODIFIED
        cp.stop_apiserver(kill=True)
        try:
            _compact(cp)
        finally:
            cp.start_apiserver()
        writer.create("p9")
        writer.modify("p6")
        writer.delete("p4")
        # kproxy cannot know any of it yet, so neither can its clients.
        assert inf.store() == before and py.snapshot() == before
        relay.restore()
        eventually(
            lambda: metric(rp, "kproxy_watchcache_relists_total", resource="pods", reason="expired") > relists,
            90,
            "kproxy's upstream watch to get 410 and relist",
        )
        _converged(inf, py, writer, "both clients to converge after the compaction")
        # The six changes reached kproxy as the relist's difference, not as watch events.
        assert metric(rp, "kproxy_watchcache_events_total", resource="pods") - events_in >= 6
        # Live events still flow after the relist.
        writer.modify("p7")
        writer.create("p10")
        _converged(inf, py, writer, "both clients to follow writes after the relist")
    finally:
        py.stop()

    _no_errors(inf, py)
    lists = inf.of("list")
    assert len(lists) == 1, f"the informer listed again (410 storm): {lists}"
    assert py.lists == 1, f"the Python client listed again: {py.errors}"
    assert {"ADDED", "MODIFIED", "DELETED"} <= set(py.types)
    # Better than resuming: kproxy kept each client's one watch open through both outages (the
    # informer's asks for 5-10 minutes, the Python one for 15; the test takes well under a minute).
    assert len(inf.of("watch")) == 1, inf.of("watch")
    assert py.watches == 1 and not py.disconnects, py.disconnects
    # Every watch either client opened was served by kproxy's cache, none passed through.
    watches = len(inf.of("watch")) + py.watches
    assert served_watches(rp) >= watches, (served_watches(rp), inf.of("watch"), py.watches, py.disconnects)
    assert metric(rp, "kproxy_watchcache_reads_total", resource="pods", verb="watch", served="upstream") == 0
    if compressed:  # client-go's watch came gzipped (the Python client's asks for no coding)
        assert metric(rp, "kproxy_compression_responses_total", encoding="gzip") >= 1
