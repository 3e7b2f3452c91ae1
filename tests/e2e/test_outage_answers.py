"""During an upstream outage, clients of kproxy behave as clients of the apiserver itself: they
retry, back off, keep their resource versions and lose no events (kproxy.core.outage).

One outage on a control plane of the module's own (the apiserver is killed, so the shared one is
never used), watched by real clients at once, through a real ``kproxy run`` and, for the
comparison, straight at the apiserver:

* client-go's shared informer (tests/e2e/informer) on pods, which kproxy does not cache: through
  kproxy it relists exactly as often as the same informer pointed at the apiserver (once, at the
  start), since a 429 makes the reflector retry its watch from the resource version it has;
* client-go's event recorder: an event recorded during the outage is retried, not dropped, and
  is at the apiserver afterwards;
* kubectl: a read and a write are retried on ``Retry-After`` (a write that never reached the
  apiserver is a 429 with ``Retry-After: 5``, its own answer while it shuts down); the write lands
  once the apiserver is back, where directly it fails at once as a refused connection;
* the official Python client: urllib3 retries a read on ``Retry-After``; a write is an
  ``ApiException`` 429 that says when to try again, and nothing is persisted.
* A write that broke off after it was sent gets no answer at all, as from an apiserver that died
  mid-request (its outcome is unknown).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from kproxy.localcluster import envtest
from kproxy.testing.eventually import eventually
from kproxy.testing.informer import Informer
from kproxy.testing.proxyproc import RunningProxy, start_proxy

#: A cache in the chain, but not of pods: the informer's watch is the upstream's, passed through.
CHAIN = {"filters": [{"name": "watchcache", "resources": ["configmaps"]}]}

#: The recorder's sleep between tries of one event (client-go: 10 s, 12 tries): short enough for
#: a quick test, long enough (12 x 5 s) to outlast the outage and the apiserver's restart.
EVENT_RETRY_SLEEP = 5.0


def requests_counted(rp: RunningProxy, **labels: str) -> float:
    """kproxy's ``kproxy_requests_total`` samples whose labels include ``labels``, summed."""
    total = 0.0
    for family in text_string_to_metric_families(rp.metrics()):
        for sample in family.samples:
            if sample.name == "kproxy_requests_total" and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def failed_watches(rp: RunningProxy) -> float:
    return sum(requests_counted(rp, verb="watch", resource="pods", code=code) for code in ("429", "503", "500", "0"))


def raw_get(rp: RunningProxy, path: str, token: str = "") -> tuple[int, dict[str, str], bytes]:
    """One GET to kproxy (HTTPS with its CA when it serves TLS, with ``token`` as bearer if given)."""
    scheme, _, hostport = rp.url.partition("://")
    host, port = hostport.split(":")
    conn: http.client.HTTPConnection
    if scheme == "https":
        ctx = ssl.create_default_context(cafile=str(rp.ca_file))
        conn = http.client.HTTPSConnection(host, int(port), timeout=30, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def raw_write(rp: RunningProxy, path: str, token: str) -> bytes:
    """A POST to kproxy over TLS as ``token``; what came back before the connection closed."""
    host, port = rp.url.removeprefix("https://").split(":")
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    body = json.dumps(_configmap("impersonated")).encode()
    with (
        socket.create_connection((host, int(port)), timeout=30) as plain,
        ctx.wrap_socket(plain, server_hostname=host) as sock,
    ):
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        try:
            return sock.recv(4096)
        except (ssl.SSLEOFError, ConnectionResetError):
            return b""


@dataclass
class Outage:
    """What the clients did and saw during the one outage of the module."""

    cp: envtest.ControlPlaneInfo
    namespace: str
    via: Informer
    direct: Informer
    created_after: str = ""
    raw_read: tuple[int, dict[str, str], bytes] = (0, {}, b"")
    kubectl_get: subprocess.CompletedProcess[str] | None = None
    kubectl_create: subprocess.CompletedProcess[str] | None = None
    kubectl_create_direct: subprocess.CompletedProcess[str] | None = None
    py_read: BaseException | None = None
    py_read_429s: float = 0
    py_write: BaseException | None = None
    py_write_direct: BaseException | None = None
    impersonated_read: tuple[int, dict[str, str], bytes] = (0, {}, b"")
    impersonated_write: bytes = b"-"


def _kubectl(cp: envtest.ControlPlaneInfo, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl with a discovery cache of the control plane's own (filled before the outage)."""
    return subprocess.run(
        [str(cp.kubectl), "--kubeconfig", str(kubeconfig), "--cache-dir", str(cp.dir / "kubectl-cache"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _raised(call: Any) -> BaseException | None:
    try:
        call()
    except Exception as err:  # the outcome is the point: ApiException or a urllib3 error
        return err
    return None


def _configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outage]:
    tmp = tmp_path_factory.mktemp("outage")
    cp = envtest.up(tmp / "cp", bins=envtest.ensure_binaries())
    rp: RunningProxy | None = None
    proxies: list[RunningProxy] = []
    informers: list[Informer] = []
    try:
        namespace = "outage-answers"
        status, body = cp.request(
            "POST", "/api/v1/namespaces", body=json.dumps({"metadata": {"name": namespace}}).encode()
        )
        assert status == 201, body
        rp = start_proxy(tmp / "kproxy", cp.admin_kubeconfig, extra=CHAIN)
        # impersonate mode: a caller's token is reviewed by the apiserver before anything else.
        imp = start_proxy(tmp / "impersonate", cp.admin_kubeconfig, credentials="impersonate", tls=True)
        proxies.append(imp)
        via = Informer(rp.kubeconfig, namespace=namespace, event_retry_sleep=EVENT_RETRY_SLEEP)
        direct = Informer(cp.admin_kubeconfig, namespace=namespace)
        informers += [via, direct]
        for inf in informers:
            inf.wait(lambda inf=inf: bool(inf.of("synced")), 60, "first sync")
        o = Outage(cp, namespace, via, direct)
        py_via = client.CoreV1Api(config.new_client_from_config(str(rp.kubeconfig)))
        py_direct = client.CoreV1Api(config.new_client_from_config(str(cp.admin_kubeconfig)))
        for kubeconfig in (rp.kubeconfig, cp.admin_kubeconfig):  # discovery cached: one request each
            assert _kubectl(cp, kubeconfig, "get", "pods", "-n", namespace).returncode == 0

        cp.stop_apiserver(kill=True)
        try:
            # Both informers' watches ended; each has tried again and been turned away.
            eventually(lambda: failed_watches(rp) >= 1, 30, "the informer's watch to be answered through kproxy")
            direct.wait(lambda: bool(direct.of("watch-open-error")), 30, "the direct informer's watch to fail")
            via.record_event("DuringOutage")
            o.raw_read = raw_get(rp, f"/api/v1/namespaces/{namespace}/pods")
            # A token kproxy has not reviewed yet (the apiserver cannot be asked to).
            o.impersonated_read = raw_get(imp, f"/api/v1/namespaces/{namespace}/pods", token=cp.admin_token)
            o.impersonated_write = raw_write(imp, f"/api/v1/namespaces/{namespace}/configmaps", cp.admin_token)

            # Clients that take a while (kubectl and urllib3 wait on Retry-After) run side by side.
            def kubectl_get() -> None:
                o.kubectl_get = _kubectl(cp, rp.kubeconfig, "get", "pods", "-n", namespace, "-v=4")

            def py_read() -> None:
                before = requests_counted(rp, verb="list", resource="secrets", code="429")
                o.py_read = _raised(lambda: py_via.list_namespaced_secret(namespace))
                o.py_read_429s = requests_counted(rp, verb="list", resource="secrets", code="429") - before

            def kubectl_create() -> None:
                o.kubectl_create = _kubectl(
                    cp, rp.kubeconfig, "create", "configmap", "via-kubectl", "-n", namespace, "-v=4"
                )

            readers = [threading.Thread(target=f) for f in (kubectl_get, py_read)]
            writer = threading.Thread(target=kubectl_create)
            for t in [*readers, writer]:
                t.start()
            o.kubectl_create_direct = _kubectl(
                cp, cp.admin_kubeconfig, "create", "configmap", "direct-kubectl", "-n", namespace
            )
            o.py_write = _raised(lambda: py_via.create_namespaced_config_map(namespace, _configmap("via-python")))
            o.py_write_direct = _raised(
                lambda: py_direct.create_namespaced_config_map(namespace, _configmap("direct-python"))
            )
            # The recorder's event and kubectl's create met the outage at kproxy (and are being retried).
            eventually(lambda: requests_counted(rp, verb="create", resource="events", code="429") >= 1, 30, "event 429")
            eventually(
                lambda: requests_counted(rp, verb="create", resource="configmaps", code="429") >= 2, 30, "create 429"
            )
            for t in readers:
                t.join(120)
        finally:
            cp.start_apiserver()
        writer.join(120)

        # A pod created once the apiserver is back reaches both informers.
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "after"},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]},
        }
        status, body = cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=json.dumps(pod).encode())
        assert status == 201, body
        o.created_after = f"{namespace}/after"
        for inf in informers:
            inf.wait(lambda inf=inf: any(e.get("name") == "after" for e in inf.of("event")), 90, "the pod made after")

        def settled() -> bool:
            writes = via.of("event-write")
            return any("error" not in w for w in writes) or any(w.get("dropped") for w in writes)

        with contextlib.suppress(AssertionError):  # a drop or a timeout is for the test to report
            via.wait(settled, 3 * EVENT_RETRY_SLEEP, "the recorder to write (or drop) the event")
        yield o
    finally:
        for inf in informers:
            inf.stop()
        for p in [rp, *proxies]:
            if p is not None:
                p.stop()
        envtest.down(tmp / "cp")


def test_informer_through_kproxy_relists_as_often_as_direct(outage: Outage) -> None:
    """client-go's reflector retries a 429'd watch from its resource version, as it does a refused
    connection (a 503 made it list again from scratch, over and over, for as long as the outage
    lasted). With WatchList each new watch is reported as a "list" at the version the informer
    has; how many there are depends on how often each side retried during the outage (client-go
    retries a 429 inside the request, a refused connection in the reflector), so through kproxy
    there are at most as many as directly, and none from scratch after the first."""
    via, direct = outage.via.of("list"), outage.direct.of("list")
    lines = "\n".join(json.dumps(x) for x in [*outage.via.lines, {"direct": True}, *outage.direct.lines])
    assert len(via) <= len(direct), lines
    assert via[0]["resourceVersion"] == "" and all(x["resourceVersion"] for x in via[1:]), lines
    assert len(outage.via.of("watch-open-error")) >= 1, lines  # it did try its watch during the outage
    errors = outage.via.of("watch-open-error") + outage.via.of("watch-error")
    assert all("the upstream kube-apiserver is unavailable" in e["error"] for e in errors), errors


def test_events_recorded_during_the_outage_reach_the_apiserver(outage: Outage) -> None:
    """client-go's event recorder drops an event on any Status, and retries a connection error."""
    writes = outage.via.of("event-write")
    assert writes and not any(w.get("dropped") for w in writes), writes
    status, body = outage.cp.request("GET", f"/api/v1/namespaces/{outage.namespace}/events")
    assert status == 200, body
    reasons = [e["reason"] for e in json.loads(body)["items"]]
    assert "DuringOutage" in reasons, (reasons, writes)


def test_a_read_is_a_429_status_with_retry_after(outage: Outage) -> None:
    code, headers, body = outage.raw_read
    assert code == 429, body
    assert headers.get("Retry-After") == "1"
    st = json.loads(body)
    assert st["kind"] == "Status" and st["reason"] == "TooManyRequests" and st["code"] == 429
    assert st["details"] == {"retryAfterSeconds": 1}
    assert st["message"].startswith("the upstream kube-apiserver is unavailable: ")


def test_impersonate_mode_answers_an_unreviewable_caller_as_an_outage(outage: Outage) -> None:
    """In impersonate mode the caller's token cannot be reviewed during the outage: the same
    answers (a 500 made the reflector relist and the event recorder drop its events)."""
    code, headers, body = outage.impersonated_read
    assert code == 429 and headers.get("Retry-After") == "1", body
    assert json.loads(body)["reason"] == "TooManyRequests"
    # A write whose caller could not be reviewed never reached the apiserver: 429, come back in 5 s.
    assert outage.impersonated_write.startswith(b"HTTP/1.1 429 "), outage.impersonated_write[:200]
    assert b"\r\nRetry-After: 5\r\n" in outage.impersonated_write


def test_kubectl_retries_reads_and_writes_that_never_reached_the_apiserver(outage: Outage) -> None:
    get = outage.kubectl_get
    assert get is not None
    # client-go's rest client honoured Retry-After: 10 retries (its maxRetries), then the Status.
    assert get.stderr.count("Got a Retry-After response") == 10, get.stderr[-3000:]
    assert get.returncode == 1 and "(TooManyRequests)" in get.stderr, get.stderr[-1000:]
    create, direct = outage.kubectl_create, outage.kubectl_create_direct
    assert create is not None and direct is not None
    # Directly: a refused connection, nothing persisted. Through kproxy: retried until the apiserver
    # was back, then persisted once.
    assert direct.returncode == 1 and "refused" in direct.stderr, direct.stderr
    assert "Got a Retry-After response" in create.stderr, create.stderr[-2000:]
    assert create.returncode == 0, create.stderr[-2000:]
    status, _ = outage.cp.request("GET", f"/api/v1/namespaces/{outage.namespace}/configmaps/via-kubectl")
    assert status == 200
    status, _ = outage.cp.request("GET", f"/api/v1/namespaces/{outage.namespace}/configmaps/direct-kubectl")
    assert status == 404


def test_python_client_retries_a_read_and_a_write_is_told_when_to_come_back(outage: Outage) -> None:
    read = outage.py_read
    assert isinstance(read, ApiException) and read.status == 429, read
    assert read.headers is not None and read.headers.get("Retry-After") == "1"
    # urllib3 (the client's default Retry(3)) asked three more times on Retry-After.
    assert outage.py_read_429s == 4, outage.py_read_429s
    # A write: urllib3 does not repeat a POST, so the caller gets the 429 and when to try again.
    write, direct = outage.py_write, outage.py_write_direct
    assert isinstance(direct, urllib3.exceptions.HTTPError), direct
    assert isinstance(write, ApiException) and write.status == 429, write
    assert write.headers is not None and write.headers.get("Retry-After") == "5"
    status, _ = outage.cp.request("GET", f"/api/v1/namespaces/{outage.namespace}/configmaps/via-python")
    assert status == 404


def test_clients_resume_after_the_outage(outage: Outage) -> None:
    """Both informers followed the pod created after the outage, through kproxy with no relist."""
    for inf in (outage.via, outage.direct):
        assert outage.created_after in inf.store()


def test_a_write_to_an_unreachable_upstream_is_a_429_and_one_cut_off_gets_no_answer(
    proxy_factory: Callable[..., RunningProxy], control_plane: envtest.ControlPlaneInfo, tmp_path: Path
) -> None:
    """An upstream that refuses connections: a write never left kproxy, so it is a 429 with
    ``Retry-After: 5``. An upstream that takes the request and closes without answering: the
    write's outcome is unknown, so the client's connection is closed with nothing written, as an
    apiserver dying mid-request leaves it. No traceback either way; both are counted."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens here now
    # An "upstream" that reads a request head and hangs up (plain TCP: kproxy's TLS handshake fails
    # on it, so it is given an http:// server and reached without TLS).
    cutter = socket.socket()
    cutter.bind(("127.0.0.1", 0))
    cutter.listen(8)
    stop = threading.Event()

    def cut() -> None:
        cutter.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = cutter.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    conn.recv(65536)

    threading.Thread(target=cut, daemon=True).start()
    body = json.dumps(_configmap("never")).encode()
    try:
        for server, expect in (
            (f"https://127.0.0.1:{port}", "429"),
            (f"http://127.0.0.1:{cutter.getsockname()[1]}", ""),
        ):
            kc = yaml.safe_load(control_plane.admin_kubeconfig.read_text())
            kc["clusters"][0]["cluster"]["server"] = server
            path = tmp_path / f"up-{expect or 'cut'}.kubeconfig"
            path.write_text(yaml.safe_dump(kc))
            rp = proxy_factory(upstream_kubeconfig=path, ready=False)
            host, listen = rp.url.removeprefix("http://").split(":")
            for method in ("POST", "PUT", "DELETE"):
                with socket.create_connection((host, int(listen)), timeout=30) as sock:
                    sock.sendall(
                        f"{method} /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                        + body
                    )
                    answer = sock.recv(4096)
                if expect:
                    assert answer.startswith(b"HTTP/1.1 429 "), (method, answer[:300])
                    assert b"\r\nRetry-After: 5\r\n" in answer, answer[:300]
                else:
                    assert answer == b"", (method, answer[:300])  # closed, nothing written
            assert requests_counted(rp, code=expect or "0") == 3
            assert "Traceback" not in rp.log_text() and "closing transport" not in rp.log_text()
    finally:
        stop.set()
        cutter.close()
