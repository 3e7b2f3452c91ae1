"""The compression filter in front of the real kube-apiserver, with real clients: kubectl, the
official Python client, curl, and raw HTTP clients that ask for exact codings."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from backports import zstd
from kubernetes import client, watch

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy, start_proxy

CONFIGMAPS = 120  # ~2.3 KB each: a ~280 KB list, streamed by the apiserver and by kproxy
DISCOVERY = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def cproxy(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """kproxy with the compression filter, watch compression on, defaults otherwise.

    Served over TLS, as kubectl is used in practice: client-go honours ``--disable-compression``
    only on a transport of its own, and over plain HTTP without TLS settings it uses Go's default
    transport, which always asks for gzip. (The token only keeps kubectl from prompting; proxy
    mode replaces it with kproxy's own credentials.)"""
    rp = _start(tmp_path_factory.mktemp("kp-compress"), control_plane, {"name": "compression", "watch": True})
    yield rp
    rp.stop()


@pytest.fixture(scope="module")
def listns(control_plane: ControlPlaneInfo, kubectl: Kubectl) -> Iterator[str]:
    """A namespace holding CONFIGMAPS ConfigMaps (created once for the module, deleted after)."""
    name = f"compress-list-{int(time.time() * 1000) % 10**8}"
    kubectl(["create", "namespace", name])
    items = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm-{i:04d}", "labels": {"app": "compress", "index": str(i)}},
            "data": {"config.yaml": "".join(f"key{j}: value-{i}-{j}\n" for j in range(100))},
        }
        for i in range(CONFIGMAPS)
    ]
    kubectl(["create", "-n", name, "-f", "-"], input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    yield name
    kubectl(["delete", "namespace", name, "--wait=false"], check=False)


def _start(tmp: Path, control_plane: ControlPlaneInfo, settings: dict[str, Any]) -> RunningProxy:
    return start_proxy(
        tmp, control_plane.admin_kubeconfig, extra={"filters": [settings]}, tls=True, token="ignored-in-proxy-mode"
    )


def _connection(rp: RunningProxy) -> http.client.HTTPConnection:
    u = urlsplit(rp.url)
    assert rp.ca_file is not None
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    return http.client.HTTPSConnection(u.hostname or "127.0.0.1", u.port, timeout=30, context=ctx)


class Resp:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def all(self, name: str) -> list[str]:
        return self.headers.get_all(name) or []


def raw(rp: RunningProxy, path: str, headers: list[tuple[str, str]] | None = None, method: str = "GET") -> Resp:
    """One request with exactly these headers (several lines of one header allowed); the body as
    it came on the wire (http.client removes the chunked framing, never a content coding)."""
    conn = _connection(rp)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        given = headers or []
        default = [] if any(k.lower() == "accept" for k, _ in given) else [("Accept", "application/json")]
        for k, v in [*default, *given]:
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        return Resp(r.status, r.headers, r.read())
    finally:
        conn.close()


def decode(body: bytes, coding: str | None) -> bytes:
    if coding is None:
        return body
    if coding == "gzip":
        return zlib.decompress(body, 31)
    if coding == "zstd":
        return zstd.decompress(body)
    raise AssertionError(f"unexpected coding {coding}")


def items_of(body: bytes) -> list[dict[str, Any]]:
    return list(json.loads(body)["items"])


def metric(rp: RunningProxy, name: str, **labels: str) -> float:
    """A counter's value from kproxy's /metrics (0 when the series does not exist yet)."""
    sel = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    series = f"{name}{{{sel}}}" if sel else name
    m = re.search(rf"^{re.escape(series)} (\S+)$", rp.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


def list_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/configmaps"


_LIST_RV = re.compile(rb'^(\{"kind":"[A-Za-z]+List","apiVersion":"[^"]*","metadata":\{"resourceVersion":")[0-9]+"')


def unversioned(body: bytes) -> bytes:
    """A list body without its own resourceVersion, which is the cluster's current one and moves
    between two requests whenever anything writes (the apiserver renews its lease every 10 s)."""
    return _LIST_RV.sub(rb'\g<1>*"', body, count=1)


# --------------------------------------------------------------------------- lists: real clients


def test_kubectl_gets_compressed_lists_with_identical_objects(
    cproxy: RunningProxy, kubectl: Kubectl, listns: str
) -> None:
    before = metric(cproxy, "kproxy_compression_responses_total", encoding="gzip")
    via = kubectl.json(["get", "configmaps", "-n", listns], kubeconfig=cproxy.kubeconfig)
    direct = kubectl.json(["get", "configmaps", "-n", listns])
    assert len(via["items"]) == CONFIGMAPS
    assert via["items"] == direct["items"]
    # kubectl (Go's transport) asked for gzip and decoded it transparently.
    assert metric(cproxy, "kproxy_compression_responses_total", encoding="gzip") > before


def test_kubectl_disable_compression_opts_out(cproxy: RunningProxy, kubectl: Kubectl, listns: str) -> None:
    before_gzip = metric(cproxy, "kproxy_compression_responses_total", encoding="gzip")
    before_skip = metric(cproxy, "kproxy_compression_skipped_total", reason="not_accepted")
    via = kubectl.json(["get", "configmaps", "-n", listns, "--disable-compression"], kubeconfig=cproxy.kubeconfig)
    assert len(via["items"]) == CONFIGMAPS
    assert metric(cproxy, "kproxy_compression_responses_total", encoding="gzip") == before_gzip
    assert metric(cproxy, "kproxy_compression_skipped_total", reason="not_accepted") > before_skip


@pytest.mark.parametrize("coding", ["gzip", "zstd"])  # urllib3 decodes zstd with backports.zstd installed
def test_python_client_gets_compressed_lists_with_identical_objects(
    cproxy: RunningProxy, control_plane: ControlPlaneInfo, listns: str, coding: str
) -> None:
    cfg = client.Configuration()
    cfg.host = cproxy.url
    cfg.ssl_ca_cert = str(cproxy.ca_file)
    with client.ApiClient(cfg) as api:
        api.set_default_header("Accept-Encoding", coding)
        core = client.CoreV1Api(api)
        raw_resp = core.list_namespaced_config_map(listns, _preload_content=False)
        assert raw_resp.headers["Content-Encoding"] == coding
        via = json.loads(raw_resp.data)  # urllib3 decodes the body
        typed = core.list_namespaced_config_map(listns)
    status, direct_body = control_plane.request("GET", list_path(listns))
    assert status == 200
    assert via["items"] == items_of(direct_body)
    assert [cm.metadata.name for cm in typed.items] == [i["metadata"]["name"] for i in items_of(direct_body)]
    assert typed.items[7].data == via["items"][7]["data"]


def test_curl_compressed_decodes_to_the_same_bytes(cproxy: RunningProxy, listns: str, tmp_path: Path) -> None:
    url = cproxy.url + list_path(listns)
    hdr = tmp_path / "headers"
    compressed = subprocess.run(
        ["curl", "-sS", "--cacert", str(cproxy.ca_file), "--compressed", "-D", str(hdr), url],
        capture_output=True,
        check=True,
    ).stdout
    plain = subprocess.run(
        ["curl", "-sS", "--cacert", str(cproxy.ca_file), "-H", "Accept-Encoding: identity", url],
        capture_output=True,
        check=True,
    ).stdout
    assert compressed == plain
    assert len(items_of(plain)) == CONFIGMAPS
    # curl offers "deflate, gzip, br, zstd": zstd is kproxy's first preference.
    assert "content-encoding: zstd" in hdr.read_text().lower()


def test_explicit_zstd_and_gzip_decode_to_the_uncompressed_bytes(cproxy: RunningProxy, listns: str) -> None:
    plain = raw(cproxy, list_path(listns))
    assert plain.status == 200
    assert plain.header("Content-Encoding") is None
    for coding in ("zstd", "gzip"):
        r = raw(cproxy, list_path(listns), [("Accept-Encoding", coding)])
        assert r.status == 200
        assert r.header("Content-Encoding") == coding
        assert "Accept-Encoding" in r.all("Vary")
        assert r.header("Content-Length") is None  # streamed: chunked
        assert unversioned(decode(r.body, coding)) == unversioned(plain.body)
        assert len(r.body) * 5 < len(plain.body)
    # zstd gives the smaller body of the two.
    direct_zstd = raw(cproxy, list_path(listns), [("Accept-Encoding", "zstd")])
    direct_gzip = raw(cproxy, list_path(listns), [("Accept-Encoding", "gzip")])
    assert len(direct_zstd.body) < len(direct_gzip.body)


# --------------------------------------------------------------------------- negotiation


@pytest.mark.parametrize(
    ("accept_encoding", "expected"),
    [
        (["gzip;q=0"], None),  # gzip refused: the apiserver would not know
        (["gzip;q=0, zstd"], "zstd"),
        (["*;q=0"], None),  # nothing acceptable, identity refused: sent as is (200, no 406)
        (["identity;q=0"], None),  # nothing named that kproxy offers: as is
        (["br, identity;q=0"], None),
        (["*"], "zstd"),
        (["gzip, *;q=0"], "gzip"),
        (["gzip;q=0.5, zstd;q=0.4"], "gzip"),
        (["GZIP"], "gzip"),
        (["x-gzip"], "gzip"),
        (["br", "gzip"], "gzip"),  # several header lines are all read
        (["zstd, gzip"], "zstd"),  # tie: the configured preference (zstd first)
        (["gzip, zstd"], "zstd"),
        (["identity, gzip;q=0.5"], None),  # identity explicitly preferred
        (["foo, bar;q=0.5"], None),  # unknown codings are ignored, never an error
        (["foo;q=bogus, zstd;q=0.1"], "zstd"),
        ([""], None),  # empty: identity only
    ],
)
def test_accept_encoding_negotiation(
    cproxy: RunningProxy, listns: str, accept_encoding: list[str], expected: str | None
) -> None:
    plain = raw(cproxy, list_path(listns), [("Accept-Encoding", "identity")])
    r = raw(cproxy, list_path(listns), [("Accept-Encoding", v) for v in accept_encoding])
    assert r.status == 200
    assert r.header("Content-Encoding") == expected
    assert unversioned(decode(r.body, expected)) == unversioned(plain.body)


def test_identity_refused_compresses_even_small_bodies(cproxy: RunningProxy) -> None:
    path = "/api/v1/namespaces/default"
    small = raw(cproxy, path, [("Accept-Encoding", "gzip")])
    assert small.status == 200
    assert len(small.body) < 1024
    assert small.header("Content-Encoding") is None  # under the threshold
    r = raw(cproxy, path, [("Accept-Encoding", "gzip, identity;q=0")])
    assert r.header("Content-Encoding") == "gzip"
    assert unversioned(decode(r.body, "gzip")) == unversioned(raw(cproxy, path).body)


def test_small_bodies_stay_uncompressed(cproxy: RunningProxy, listns: str) -> None:
    before = metric(cproxy, "kproxy_compression_skipped_total", reason="small")
    r = raw(cproxy, "/api/v1/namespaces/default", [("Accept-Encoding", "gzip, zstd")])
    assert r.status == 200
    assert len(r.body) < 1024
    assert r.header("Content-Encoding") is None
    assert r.header("Vary") is None
    assert metric(cproxy, "kproxy_compression_skipped_total", reason="small") > before


def test_head_no_transform_and_errors(cproxy: RunningProxy, listns: str) -> None:
    before = metric(cproxy, "kproxy_compression_skipped_total", reason="head")
    head = raw(cproxy, list_path(listns), [("Accept-Encoding", "zstd")], method="HEAD")
    assert head.status == 405  # the apiserver's answer to HEAD on a resource, passed on as is
    assert head.header("Content-Encoding") is None
    assert metric(cproxy, "kproxy_compression_skipped_total", reason="head") == before + 1
    nt = raw(cproxy, list_path(listns), [("Accept-Encoding", "zstd"), ("Cache-Control", "no-transform")])
    assert nt.header("Content-Encoding") is None
    assert len(items_of(nt.body)) == CONFIGMAPS
    # A Status error large enough to compress is compressed like any body, and stays a Status.
    long_name = "x" * 2000
    err = raw(cproxy, f"{list_path(listns)}/{long_name}", [("Accept-Encoding", "gzip")])
    assert err.status == 404
    assert err.header("Content-Encoding") == "gzip"
    status = json.loads(decode(err.body, "gzip"))
    assert status["kind"] == "Status"
    assert status["reason"] == "NotFound"


def test_discovery_etag_is_kept_and_still_revalidates(cproxy: RunningProxy) -> None:
    r = raw(cproxy, "/apis", [("Accept", DISCOVERY), ("Accept-Encoding", "zstd")])
    assert r.status == 200
    assert r.header("Content-Encoding") == "zstd"
    etag = r.header("ETag")
    assert etag is not None
    assert etag.startswith('"')  # the apiserver's own tag (tests/e2e/test_conditional_requests.py)
    vary = ",".join(r.all("Vary"))
    assert "Accept-Encoding" in vary
    assert "Accept" in [v.strip() for v in vary.split(",")]  # the apiserver's own Vary kept
    again = raw(cproxy, "/apis", [("Accept", DISCOVERY), ("Accept-Encoding", "zstd"), ("If-None-Match", etag)])
    assert again.status == 304
    assert again.header("ETag") == etag
    assert again.body == b""


# --------------------------------------------------------------------------- watches


def _kubectl_watch(
    kubectl: Kubectl, kubeconfig: Path, namespace: str
) -> tuple[subprocess.Popen[str], dict[str, float], threading.Thread]:
    """``kubectl get configmaps --watch -o name``; each line's arrival time, by name."""
    argv = [
        str(kubectl.binary),
        f"--kubeconfig={kubeconfig}",
        f"--cache-dir={kubectl.cache_dir}",
        "get",
        "configmaps",
        "-n",
        namespace,
        "--watch",
        "-o",
        "name",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[str, float] = {}

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.setdefault(line.strip().removeprefix("configmap/"), time.monotonic())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return proc, seen, t


def _create(control_plane: ControlPlaneInfo, namespace: str, name: str) -> float:
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": name}})
    status, resp = control_plane.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=body.encode())
    assert status == 201, resp
    return time.monotonic()


def _events_arrive_promptly(
    control_plane: ControlPlaneInfo, namespace: str, seen: dict[str, float], first: str
) -> None:
    """Write ConfigMaps one at a time; each must be seen within a second of its write."""
    eventually(lambda: first in seen, 20, f"{first} through the watch")
    for i in range(5):
        name = f"ev-{i}"
        written = _create(control_plane, namespace, name)
        eventually(lambda name=name: name in seen, 10, f"{name} through the watch")  # type: ignore[misc]
        assert seen[name] - written < 1.0, f"{name} took {seen[name] - written:.3f}s"


def test_kubectl_watch_through_compression_sees_each_event_promptly(
    cproxy: RunningProxy, control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str
) -> None:
    _create(control_plane, namespace, "before")
    before = metric(cproxy, "kproxy_compression_responses_total", encoding="gzip")
    proc, seen, reader = _kubectl_watch(kubectl, cproxy.kubeconfig, namespace)
    try:
        _events_arrive_promptly(control_plane, namespace, seen, "before")
        # The watch itself (not only kubectl's initial list) went out gzip-compressed.
        assert metric(cproxy, "kproxy_compression_responses_total", encoding="gzip") >= before + 1
    finally:
        proc.kill()
        proc.wait()
        reader.join(5)


PROTOBUF_WATCH = "application/vnd.kubernetes.protobuf;stream=watch"


def _raw_watch(
    rp: RunningProxy, namespace: str, coding: str, accept: str = "application/json"
) -> tuple[dict[str, float], Callable[[], None]]:
    """A watch read with a plain HTTP client that decodes ``coding`` incrementally. JSON events
    are parsed; protobuf frames (4-byte length, then the event) are searched for the names this
    module's tests create."""
    conn = _connection(rp)
    conn.putrequest("GET", f"/api/v1/namespaces/{namespace}/configmaps?watch=1", skip_accept_encoding=True)
    conn.putheader("Accept", accept)
    conn.putheader("Accept-Encoding", coding)
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.headers["Content-Encoding"] == coding
    dec: Any = zlib.decompressobj(31) if coding == "gzip" else zstd.ZstdDecompressor()
    seen: dict[str, float] = {}
    protobuf = accept.startswith("application/vnd.kubernetes.protobuf")

    def frames(buf: bytes) -> tuple[list[bytes], bytes]:
        if not protobuf:
            *lines, rest = buf.split(b"\n")
            return lines, rest
        out = []
        while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
            n = int.from_bytes(buf[:4], "big")
            out.append(buf[4 : 4 + n])
            buf = buf[4 + n :]
        return out, buf

    def name_of(frame: bytes) -> str:
        if not protobuf:
            return str(json.loads(frame)["object"]["metadata"]["name"])
        m = re.search(rb"(ev-[0-9]+|before)", frame)
        assert m is not None
        return m.group(1).decode()

    def read() -> None:
        buf = b""
        try:
            while chunk := resp.read1(65536):
                buf += dec.decompress(chunk)
                done, buf = frames(buf)
                for frame in done:
                    seen.setdefault(name_of(frame), time.monotonic())
        except Exception:  # the stream ends when the test closes it, however http.client reports that
            return

    t = threading.Thread(target=read, daemon=True)
    t.start()

    def close() -> None:
        # Shut the socket down first: closing under the reading thread would wait for its read.
        if conn.sock is not None:
            conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        t.join(5)

    return seen, close


@pytest.mark.parametrize(
    ("coding", "accept"),
    [("gzip", "application/json"), ("zstd", "application/json"), ("zstd", PROTOBUF_WATCH)],
)
def test_raw_compressed_watch_decodes_each_event_promptly(
    cproxy: RunningProxy, control_plane: ControlPlaneInfo, namespace: str, coding: str, accept: str
) -> None:
    _create(control_plane, namespace, "before")
    seen, close = _raw_watch(cproxy, namespace, coding, accept)
    try:
        _events_arrive_promptly(control_plane, namespace, seen, "before")
    finally:
        close()


def test_python_client_watch_through_compression_sees_each_event_promptly(
    cproxy: RunningProxy, control_plane: ControlPlaneInfo, namespace: str
) -> None:
    """The official client's Watch reads the raw stream (decode_content=False), so it sends no
    Accept-Encoding on watches and gets them as they are, still each event at once."""
    cfg = client.Configuration()
    cfg.host = cproxy.url
    cfg.ssl_ca_cert = str(cproxy.ca_file)
    seen: dict[str, float] = {}
    _create(control_plane, namespace, "before")
    with client.ApiClient(cfg) as api:
        core = client.CoreV1Api(api)
        w = watch.Watch()

        def run() -> None:
            for ev in w.stream(core.list_namespaced_config_map, namespace, timeout_seconds=60):
                seen.setdefault(ev["object"].metadata.name, time.monotonic())
                if ev["object"].metadata.name == "ev-4":
                    w.stop()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        _events_arrive_promptly(control_plane, namespace, seen, "before")
        t.join(15)


def test_watch_compression_off_by_default_and_upstream_gzip(
    control_plane: ControlPlaneInfo, kubectl: Kubectl, listns: str, namespace: str, tmp_path: Path
) -> None:
    rp = _start(tmp_path / "up-gzip", control_plane, {"name": "compression", "upstream_gzip": True})
    try:
        plain = raw(rp, list_path(listns), [("Accept-Encoding", "identity")])
        # A gzip client gets the apiserver's own gzip (the list is over its 128 KiB threshold) as is.
        g = raw(rp, list_path(listns), [("Accept-Encoding", "gzip")])
        assert g.header("Content-Encoding") == "gzip"
        assert unversioned(decode(g.body, "gzip")) == unversioned(plain.body)
        assert metric(rp, "kproxy_compression_skipped_total", reason="upstream_encoded") >= 1
        # A zstd client: decoded once, re-encoded.
        z = raw(rp, list_path(listns), [("Accept-Encoding", "zstd")])
        assert z.header("Content-Encoding") == "zstd"
        assert unversioned(decode(z.body, "zstd")) == unversioned(plain.body)
        assert metric(rp, "kproxy_compression_cpu_seconds_total", encoding="gzip", operation="decompress") > 0
        # Watch compression is off unless configured: the watch goes out as the apiserver sent it.
        _create(control_plane, namespace, "before")
        proc, seen, reader = _kubectl_watch(kubectl, rp.kubeconfig, namespace)
        try:
            _events_arrive_promptly(control_plane, namespace, seen, "before")
            assert metric(rp, "kproxy_compression_skipped_total", reason="watch") >= 1
        finally:
            proc.kill()
            proc.wait()
            reader.join(5)
    finally:
        rp.stop()


def test_metrics_count_bytes_and_cpu(cproxy: RunningProxy, listns: str) -> None:
    raw(cproxy, list_path(listns), [("Accept-Encoding", "zstd")])
    bytes_in = metric(cproxy, "kproxy_compression_input_bytes_total", encoding="zstd")
    bytes_out = metric(cproxy, "kproxy_compression_output_bytes_total", encoding="zstd")
    assert bytes_in > 10 * bytes_out > 0
    assert metric(cproxy, "kproxy_compression_cpu_seconds_total", encoding="zstd", operation="compress") > 0
