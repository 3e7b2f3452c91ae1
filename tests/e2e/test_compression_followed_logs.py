"""Followed pod logs through the compression filter, with the real kube-apiserver in front of a
stand-in kubelet (no pods run in the test control plane): a Node whose kubelet endpoint is a
small TLS server of the test, and a pod bound to it. The apiserver reads ``follow`` as it reads
every boolean query parameter (``runtime.Convert_Slice_string_To_bool``: present and not
``0``/``false``), so ``follow=yes`` or ``follow=`` stream the log exactly as ``follow=true``
does; kproxy must treat them as the open streams they are, not hold the head back to measure the
body against the size threshold.
"""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from kproxy.localcluster import certs
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.localcluster.processes import free_ports
from kproxy.testing.proxyproc import RunningProxy, start_proxy

LINE = b"hello from the stand-in kubelet\n"


class StandInKubelet:
    """Answers every request with a chunked 200 carrying LINE, then keeps the stream open (as a
    followed log of a quiet container does) until the test ends."""

    def __init__(self, tmp: Path) -> None:
        ca = certs.generate_ca("stand-in-kubelet-ca")
        leaf = certs.generate_serving_cert(ca, ("127.0.0.1",), "stand-in-kubelet")
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(
            certs.write_pem(tmp / "kubelet.crt", leaf.cert_pem, private=False),
            certs.write_pem(tmp / "kubelet.key", leaf.key_pem, private=True),
        )
        (self.port,) = free_ports(1)
        self.server = socket.create_server(("127.0.0.1", self.port))
        self.done = threading.Event()
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, raw: socket.socket) -> None:
        try:
            with self.ctx.wrap_socket(raw, server_side=True) as conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(4096)
                self.requests.append(head.split(b"\r\n", 1)[0])
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
                conn.sendall(b"%x\r\n%s\r\n" % (len(LINE), LINE))
                self.done.wait(60)
        except OSError:
            pass

    def close(self) -> None:
        self.done.set()
        self.server.close()


@pytest.fixture(scope="module")
def log_pod(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A pod bound to a Node whose kubelet is the stand-in; yields its log path."""
    kubelet = StandInKubelet(tmp_path_factory.mktemp("stand-in-kubelet"))
    cp = control_plane
    ns = f"compress-logs-{secrets.token_hex(3)}"
    node = f"stand-in-{secrets.token_hex(3)}"
    assert cp.request("POST", "/api/v1/namespaces", body=_doc("Namespace", ns))[0] == 201
    assert cp.request("POST", "/api/v1/nodes", body=_doc("Node", node))[0] == 201
    status = {
        "status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet.port}},
        }
    }
    code, _ = cp.request(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        body=json.dumps(status).encode(),
        content_type="application/merge-patch+json",
    )
    assert code == 200
    pod = {"nodeName": node, "containers": [{"name": "c", "image": "none"}]}
    assert cp.request("POST", f"/api/v1/namespaces/{ns}/pods", body=_doc("Pod", "logs", spec=pod))[0] == 201
    # The stand-in's certificate is its own: the apiserver is told not to verify it.
    yield f"/api/v1/namespaces/{ns}/pods/logs/log?insecureSkipTLSVerifyBackend=true"
    kubelet.close()
    cp.request("DELETE", f"/api/v1/namespaces/{ns}")
    cp.request("DELETE", f"/api/v1/nodes/{node}")


def _doc(kind: str, name: str, **extra: Any) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": kind, "metadata": {"name": name}, **extra}).encode()


@pytest.fixture(scope="module", params=[False, True], ids=["watch-off", "watch-on"])
def lproxy(
    request: pytest.FixtureRequest, control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """kproxy with the compression filter, watch (and followed log) compression off and on."""
    rp = start_proxy(
        tmp_path_factory.mktemp("kp-logs"),
        control_plane.admin_kubeconfig,
        extra={"filters": [{"name": "compression", "watch": request.param}]},
    )
    yield rp
    rp.stop()


def _first_line(conn: http.client.HTTPConnection, path: str, accept_encoding: str | None) -> tuple[int, bytes]:
    """Status and the start of the decoded body, read as it arrives (the stream never ends)."""
    conn.putrequest("GET", path, skip_accept_encoding=True)
    if accept_encoding:
        conn.putheader("Accept-Encoding", accept_encoding)
    conn.endheaders()
    resp = conn.getresponse()
    coding = resp.getheader("Content-Encoding")
    decoder = zlib.decompressobj(31) if coding == "gzip" else None
    data = b""
    while LINE not in data:
        chunk = resp.read1(65536)
        if not chunk:
            break
        data += decoder.decompress(chunk) if decoder else chunk
    return resp.status, data


@pytest.mark.parametrize("follow", ["true", "yes", "", "TRUE", "on"])
def test_followed_log_streams_through_compression(
    follow: str, log_pod: str, lproxy: RunningProxy, control_plane: ControlPlaneInfo
) -> None:
    path = f"{log_pod}&follow={follow}"
    direct = http.client.HTTPSConnection(
        "127.0.0.1", control_plane.apiserver_port, timeout=10, context=control_plane.ssl_context()
    )
    try:
        assert _first_line(direct, path, "gzip") == (200, LINE)  # the apiserver streams it
    finally:
        direct.close()
    u = urlsplit(lproxy.url)
    via = http.client.HTTPConnection(u.hostname or "", u.port, timeout=10)
    started = time.monotonic()
    try:
        assert _first_line(via, path, "gzip") == (200, LINE)
    finally:
        via.close()
    assert time.monotonic() - started < 5
