"""``upstream_gzip`` and Content-Encoding confusion: kproxy asks the apiserver for gzip whatever
the client asked (``upstream_gzip: true``), so every answer must still carry a coding the client's
``Accept-Encoding`` accepts (RFC 9110 12.5.3: q=0 refuses, ``*`` stands for the rest, identity is
acceptable unless refused) and decode to the apiserver's own list, whatever the header's spelling.
The verdict is the apiserver's plain answer for the same list, fetched directly.
"""

from __future__ import annotations

import http.client
import json
import secrets
import signal
import zlib
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from backports import zstd

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy, start_proxy

#: Accept-Encoding lines as a client sends them (several entries: several lines).
SPELLINGS: dict[str, list[str]] = {
    "none": [],
    "identity": ["identity"],
    "gzip q=0": ["gzip;q=0"],
    "gzip q=0.0 spaced": ["gzip ; q=0.0"],
    "gzip refused, zstd": ["gzip;q=0, zstd"],
    "both refused": ["zstd;q=0, gzip;q=0"],
    "gzip, deflate": ["gzip, deflate"],
    "upper case": ["GZIP"],
    "x-gzip": ["x-gzip"],
    "star": ["*"],
    "star refused, identity": ["*;q=0, identity"],
    "unknown only": ["br"],
    "identity first line, gzip second": ["identity", "gzip"],
    "gzip refused on a second line": ["gzip", "gzip;q=0"],
    "identity preferred": ["identity, gzip;q=0.5"],
}


def _accepts(lines: list[str], coding: str) -> bool:
    """Whether a coding (``identity`` for none) is acceptable under these Accept-Encoding lines."""
    if not lines:
        return coding == "identity"
    q: dict[str, float] = {}
    for line in lines:
        for part in line.split(","):
            name, _, params = part.partition(";")
            name = name.strip().lower()
            if not name:
                continue
            value = 1.0
            key, _, v = params.strip().partition("=")
            if key.strip().lower() == "q":
                value = float(v)
            q.setdefault(name, value)  # a coding named twice: its first (the apiserver reads the first line)
    if coding == "gzip" and "gzip" not in q and "x-gzip" in q:
        return q["x-gzip"] > 0
    if coding in q:
        return q[coding] > 0
    if "*" in q:
        return q["*"] > 0
    return coding == "identity"


@pytest.fixture(scope="module")
def big_ns(control_plane: ControlPlaneInfo) -> Iterator[str]:
    """ConfigMaps whose list is well over the apiserver's 128 KiB gzip threshold."""
    ns = f"rt3-ce-{secrets.token_hex(3)}"
    cp = control_plane
    assert cp.request("POST", "/api/v1/namespaces", body=json.dumps({"metadata": {"name": ns}}).encode())[0] == 201
    try:
        for i in range(6):
            cm = {"metadata": {"name": f"c{i}"}, "data": {"v": secrets.token_hex(20_000)}}
            body = json.dumps(cm).encode()
            assert cp.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body=body)[0] == 201
        yield ns
    finally:
        cp.request("DELETE", f"/api/v1/namespaces/{ns}/configmaps")
        cp.request("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.fixture(scope="module")
def asking(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    filters = [{"name": "compression", "encodings": ["zstd", "gzip"], "upstream_gzip": True}]
    rp = start_proxy(tmp_path_factory.mktemp("rt3-ce"), control_plane.admin_kubeconfig, extra={"filters": filters})
    yield rp
    rp.stop(signal.SIGKILL)


def _send(rp: RunningProxy, method: str, path: str, lines: list[str]) -> tuple[int, dict[str, str], bytes]:
    u = urlsplit(rp.url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=60)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for line in lines:
            conn.putheader("Accept-Encoding", line)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def _items(body: bytes) -> list[tuple[str, str]]:
    return [(i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in json.loads(body)["items"]]


@pytest.mark.parametrize("spelling", list(SPELLINGS), ids=list(SPELLINGS))
def test_every_answer_is_in_a_coding_the_client_accepts(
    spelling: str, asking: RunningProxy, control_plane: ControlPlaneInfo, big_ns: str
) -> None:
    lines = SPELLINGS[spelling]
    path = f"/api/v1/namespaces/{big_ns}/configmaps"
    status, direct = control_plane.request("GET", path)
    assert status == 200
    status, headers, body = _send(asking, "GET", path, lines)
    assert status == 200, body[:300]
    coding = headers.get("content-encoding", "identity").lower()
    assert _accepts(lines, coding), (lines, coding)
    plain = {"identity": lambda b: b, "gzip": lambda b: zlib.decompress(b, 31), "zstd": zstd.decompress}[coding](body)
    assert _items(plain) == _items(direct)
    # HEAD: the apiserver's answer (it serves no HEAD of a list), never a body.
    want, _ = control_plane.request("HEAD", path)
    status, headers, body = _send(asking, "HEAD", path, lines)
    assert status == want and body == b"", (status, want, body[:200])
    assert _accepts(lines, headers.get("content-encoding", "identity").lower()), headers
