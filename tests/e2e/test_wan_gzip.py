"""kproxy across a slow link to the real kube-apiserver: reads ask the apiserver for gzip and its
bytes reach a gzip client as they left the apiserver; next to the apiserver nothing changes.

The link is toxiproxy (``kproxy.testing.toxiproxy``, built from its Go module) adding 20 ms each
way, so kproxy measures a round trip of about 40 ms to the apiserver (``upstream_gzip: auto``
asks for gzip from 10 ms). kproxy runs the chain a laptop user runs (compression, watchcache,
transcode), over TLS so that a client may speak HTTP/1.1 or HTTP/2 to it. The verdicts are read
at the apiserver's end: the bytes it sent across the link (the bytes toxiproxy relayed) and its own gzip
output, fetched directly, compared byte for byte with what the client got.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import ssl
import time
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from backports import zstd
from h2client import H2Client

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.proxyproc import RunningProxy, start_proxy
from kproxy.testing.toxiproxy import Link, Toxiproxy

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
#: ConfigMaps whose metadata (a 3 KB annotation each) makes their Table and list well over the
#: apiserver's 128 KiB gzip threshold (responsewriters.defaultGzipThresholdBytes).
CONFIGMAPS = 80
LAPTOP_CHAIN: list[dict[str, Any]] = [
    {"name": "compression", "watch": True},
    {"name": "watchcache", "resources": ["pods", "namespaces"]},
    {"name": "transcode", "upstream": "protobuf"},
]
#: 20 ms each way, no bandwidth cap (the test is about what is asked, not how long it takes).
LINK = Link("test", 40, None)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names, the last line of each
    body: bytes  # as on the wire: chunked framing removed, never a content coding

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def toxi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toxiproxy]:
    t = Toxiproxy(tmp_path_factory.mktemp("toxiproxy") / "toxiproxy.log")
    yield t
    t.stop()


@pytest.fixture(scope="module")
def bigns(control_plane: ControlPlaneInfo, kubectl: Kubectl) -> Iterator[str]:
    """A namespace of CONFIGMAPS ConfigMaps with large metadata (deleted after the module)."""
    name = f"wan-gzip-{int(time.time() * 1000) % 10**8}"
    kubectl(["create", "namespace", name])
    items = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"cm-{i:03d}",
                "annotations": {"note": "".join(f"line {j} of configmap {i}; " for j in range(120))},
            },
            "data": {"k": f"v{i}"},
        }
        for i in range(CONFIGMAPS)
    ]
    kubectl(["create", "-n", name, "-f", "-"], input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    yield name
    kubectl(["delete", "namespace", name, "--wait=false"], check=False)


def _through(toxi: Toxiproxy, control_plane: ControlPlaneInfo, tmp: Path, name: str, link: Link | None) -> Path:
    """A kubeconfig of the admin whose server is a new toxiproxy proxy shaped as ``link``."""
    dst = tmp / f"{name}.kubeconfig"
    return toxi.kubeconfig_through(name, control_plane.admin_kubeconfig, control_plane.apiserver_port, link, dst)


@pytest.fixture(scope="module")
def far(
    control_plane: ControlPlaneInfo, toxi: Toxiproxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """The laptop chain, 40 ms of round trip away from the apiserver."""
    tmp = tmp_path_factory.mktemp("kp-far")
    kubeconfig = _through(toxi, control_plane, tmp, "far", LINK)
    rp = start_proxy(tmp, kubeconfig, extra={"filters": LAPTOP_CHAIN}, tls=True, token="ignored-in-proxy-mode")
    yield rp
    rp.stop()


@pytest.fixture(scope="module")
def far_h1(
    control_plane: ControlPlaneInfo, toxi: Toxiproxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """The far kproxy with HTTP/1.1 to the apiserver (``upstream.http2: false``: its pool)."""
    tmp = tmp_path_factory.mktemp("kp-far-h1")
    kubeconfig = _through(toxi, control_plane, tmp, "far-h1", LINK)
    extra = {"filters": LAPTOP_CHAIN, "upstream": {"http2": False}}
    rp = start_proxy(tmp, kubeconfig, extra=extra, tls=True, token="ignored-in-proxy-mode")
    yield rp
    rp.stop()


@pytest.fixture(scope="module")
def near(
    control_plane: ControlPlaneInfo, toxi: Toxiproxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """The same chain, through a toxiproxy that adds nothing (a loopback relay)."""
    tmp = tmp_path_factory.mktemp("kp-near")
    kubeconfig = _through(toxi, control_plane, tmp, "near", None)
    rp = start_proxy(tmp, kubeconfig, extra={"filters": LAPTOP_CHAIN}, tls=True, token="ignored-in-proxy-mode")
    yield rp
    rp.stop()


# --------------------------------------------------------------------------- helpers


def _h1(rp: RunningProxy, path: str, headers: list[tuple[str, str]]) -> Answer:
    u = urlsplit(rp.url)
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    conn = http.client.HTTPSConnection(u.hostname or "127.0.0.1", u.port, timeout=60, context=ctx)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        for k, v in headers:
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def _h2(rp: RunningProxy, path: str, headers: list[tuple[str, str]]) -> Answer:
    async def go() -> Answer:
        client = await H2Client.connect(rp.url, str(rp.ca_file))
        try:
            resp = await client.request("GET", path, [(k.lower(), v) for k, v in headers])
            assert resp.reset is None, resp.reset
            return Answer(resp.status, dict(resp.headers), bytes(resp.body))
        finally:
            await client.close()

    return asyncio.run(go())


def _direct(cp: ControlPlaneInfo, path: str, headers: list[tuple[str, str]]) -> Answer:
    """The same request straight to the apiserver (admin certificate), as it answers it."""
    req = urllib.request.Request(cp.server + path, headers=dict(headers))
    with urllib.request.urlopen(req, context=cp.ssl_context(), timeout=60) as r:
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())


def _decode(body: bytes, coding: str | None) -> bytes:
    if coding is None:
        return body
    if coding == "gzip":
        return zlib.decompress(body, 31)
    if coding == "zstd":
        return zstd.decompress(body)
    raise AssertionError(f"unexpected Content-Encoding {coding}")


def _sent(toxi: Toxiproxy) -> int:
    """Bytes toxiproxy relayed so far (both ways, every proxy: the test's requests are sent one
    at a time, and what else crosses meanwhile, a bookmark or a lease renewal, is small)."""
    return toxi.relayed_bytes()


def _gauge(rp: RunningProxy, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", rp.metrics(), re.M)
    assert m, f"{name} not in kproxy's metrics"
    return float(m.group(1))


def _measured(rp: RunningProxy) -> float:
    """kproxy's round trip to the apiserver once it has answered a request (the version)."""
    code, _ = rp.get("/version")
    assert code == 200
    return _gauge(rp, "kproxy_upstream_round_trip_seconds")


def _rows(table: bytes) -> list[Any]:
    """A Table's rows without the AGE cell (the last), which ticks between two requests."""
    return [(row["cells"][:-1], row["object"]) for row in json.loads(table)["rows"]]


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize(
    ("protocol", "upstream"),
    [("http1", "far"), ("h2", "far"), ("http1", "far_h1")],
    ids=["http1", "h2", "upstream-http1"],
)
def test_far_table_is_the_apiservers_gzip_passed_through(
    control_plane: ControlPlaneInfo,
    toxi: Toxiproxy,
    bigns: str,
    protocol: str,
    upstream: str,
    request: pytest.FixtureRequest,
) -> None:
    """kubectl's own request (a Table, as ``kubectl get`` asks; the transcode filter leaves it
    alone) across the slow link: the apiserver is asked for gzip, sends a fraction of the bytes,
    and the client gets exactly the apiserver's gzip bytes with the apiserver's headers. Over
    HTTP/1.1 or HTTP/2 to kproxy, and over HTTP/2 (the default) or HTTP/1.1 to the apiserver."""
    far: RunningProxy = request.getfixturevalue(upstream)
    assert _measured(far) >= 0.030
    path = f"/api/v1/namespaces/{bigns}/configmaps"
    headers = [("Accept", TABLE), ("Accept-Encoding", "gzip")]
    send = _h2 if protocol == "h2" else _h1
    plain = _direct(control_plane, path, [("Accept", TABLE)]).body
    assert len(plain) > 200_000  # over the apiserver's threshold, by a margin
    before = _sent(toxi)
    got = send(far, path, headers)
    link_bytes = _sent(toxi) - before
    assert got.status == 200, got.body[:500]
    assert got.header("Content-Encoding") == "gzip"
    assert "Accept-Encoding" in (got.header("Vary") or "")
    if got.header("Content-Length") is not None:
        assert int(got.header("Content-Length") or -1) == len(got.body)
    assert _rows(_decode(got.body, "gzip")) == _rows(plain)
    # The apiserver's gzip stream itself (kproxy's own compressor writes other bytes): the same
    # request straight to the apiserver right after gives the same bytes, once no AGE cell ticked
    # and nothing was written in between (then the decoded Tables are equal too).
    for _ in range(5):
        direct = _direct(control_plane, path, headers)
        assert direct.header("Content-Encoding") == "gzip"
        if _decode(direct.body, "gzip") == _decode(got.body, "gzip"):
            break
        got = send(far, path, headers)
    else:
        raise AssertionError("no two Tables in a row were the same")
    assert got.body == direct.body
    # What crossed the link was the compressed Table, not the Table.
    assert link_bytes < len(plain) / 3, (link_bytes, len(plain))


def test_far_other_codings_decoded_once(
    control_plane: ControlPlaneInfo, toxi: Toxiproxy, far: RunningProxy, bigns: str
) -> None:
    """A zstd client gets the apiserver's gzip decoded once and encoded in zstd (the apiserver
    sent gzip across the link); a client that asks for no coding gets plain JSON."""
    assert _measured(far) >= 0.030
    path = f"/api/v1/namespaces/{bigns}/configmaps"
    plain = _direct(control_plane, path, [("Accept", TABLE)]).body
    before = _sent(toxi)
    z = _h1(far, path, [("Accept", TABLE), ("Accept-Encoding", "zstd")])
    link_bytes = _sent(toxi) - before
    assert z.status == 200
    assert z.header("Content-Encoding") == "zstd"
    assert _rows(_decode(z.body, "zstd")) == _rows(plain)
    assert link_bytes < len(plain) / 3, (link_bytes, len(plain))
    ident = _h1(far, path, [("Accept", TABLE)])
    assert ident.status == 200
    assert ident.header("Content-Encoding") is None
    assert _rows(ident.body) == _rows(plain)


@pytest.mark.parametrize("protocol", ["http1", "h2"])
def test_far_transcoded_list_crosses_the_link_gzipped(
    control_plane: ControlPlaneInfo, toxi: Toxiproxy, far: RunningProxy, bigns: str, protocol: str
) -> None:
    """A JSON list the transcode filter asks in protobuf (ConfigMaps are not cached here): the
    apiserver is asked for gzip, its gzip protobuf crosses the link, and the client gets the JSON
    the apiserver would have sent, compressed by kproxy."""
    assert _measured(far) >= 0.030
    path = f"/api/v1/namespaces/{bigns}/configmaps"
    protobuf = _direct(control_plane, path, [("Accept", "application/vnd.kubernetes.protobuf")])
    assert protobuf.header("Content-Encoding") is None and len(protobuf.body) > 200_000
    send = _h2 if protocol == "h2" else _h1
    before = _sent(toxi)
    got = send(far, path, [("Accept", "application/json"), ("Accept-Encoding", "gzip")])
    link_bytes = _sent(toxi) - before
    assert got.status == 200, got.body[:500]
    assert got.header("Content-Encoding") == "gzip"
    assert got.header("Content-Type") == "application/json"
    direct = json.loads(_direct(control_plane, path, [("Accept", "application/json")]).body)
    ours = json.loads(_decode(got.body, "gzip"))
    assert ours["items"] == direct["items"]
    assert link_bytes < len(protobuf.body) / 3, (link_bytes, len(protobuf.body))


def test_far_kubectl_reads_are_whole(far: RunningProxy, kubectl: Kubectl, bigns: str) -> None:
    """kubectl itself through the far kproxy: its Table and its JSON list agree with the apiserver's."""
    ours = kubectl(["get", "configmaps", "-n", bigns, "--no-headers"], kubeconfig=far.kubeconfig).stdout
    theirs = kubectl(["get", "configmaps", "-n", bigns, "--no-headers"]).stdout
    names = [line.split()[0] for line in ours.splitlines()]
    assert names == [line.split()[0] for line in theirs.splitlines()]  # AGE may tick between the two
    assert names == [f"cm-{i:03d}" for i in range(CONFIGMAPS)]
    listed = json.loads(kubectl(["get", "configmaps", "-n", bigns, "-o", "json"], kubeconfig=far.kubeconfig).stdout)
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == [f"cm-{i:03d}" for i in range(CONFIGMAPS)]


def test_near_apiserver_is_not_asked_for_gzip(
    control_plane: ControlPlaneInfo, toxi: Toxiproxy, near: RunningProxy, bigns: str
) -> None:
    """Next to the apiserver (a relay adding nothing) the default asks for no gzip: the Table
    crosses the link whole and kproxy compresses it itself, as before ``upstream_gzip: auto``."""
    assert _measured(near) < 0.010
    path = f"/api/v1/namespaces/{bigns}/configmaps"
    plain = _direct(control_plane, path, [("Accept", TABLE)]).body
    before = _sent(toxi)
    got = _h1(near, path, [("Accept", TABLE), ("Accept-Encoding", "gzip")])
    link_bytes = _sent(toxi) - before
    assert got.status == 200
    assert got.header("Content-Encoding") == "gzip"
    assert _rows(_decode(got.body, "gzip")) == _rows(plain)
    assert link_bytes > len(plain) * 0.9, (link_bytes, len(plain))
