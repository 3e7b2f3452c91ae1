"""Request heads at the edge of HTTP/1.1, as raw bytes to kproxy and to the apiserver: kproxy
answers what Go's server in front of the apiserver answers (the status, and a Status body where
the apiserver writes one). One line per case; each is a reproduction."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.gooracle import GoOracle, b64
from kproxy.testing.proxyproc import RunningProxy

from .conftest import start_capped
from .wire import Endpoint, exchange

H = b"Host: localhost\r\nAccept: application/json\r\nConnection: close\r\n"
CASES = {
    "plain": (b"GET /version HTTP/1.1\r\n" + H + b"\r\n", None),
    "garbage-after-request": (b"GET /version HTTP/1.1\r\n" + H + b"\r\nGARBAGE\r\n\r\n", None),
    "second-chunked-terminator": (
        b"GET /version HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n0\r\n\r\n", None),
    "lower-case-method": (b"get /api/v1/namespaces HTTP/1.1\r\n" + H + b"\r\n", None),
    "scheme-without-host": (b"GET x:/api/v1/namespaces HTTP/1.1\r\n" + H + b"\r\n", None),
    "two-content-types": (
        b"PATCH /api/v1/namespaces/default HTTP/1.1\r\n" + H + b"Content-Type: application/merge-patch+json\r\n"
        b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", None),
    "obs-fold": (b"GET /version HTTP/1.1\r\n" + H + b"X-A: a\r\n b\r\n\r\n", None),
    "two-spaces-before-version": (b"GET /version  HTTP/1.1\r\n" + H + b"\r\n", None),
    "bad-target-and-unknown-coding": (
        b"POST /api/v1/namespaces% HTTP/1.1\r\n" + H + b"Transfer-Encoding: identity\r\n\r\n", None),
    "upgrade-with-unknown-coding": (
        b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: identity\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\n\r\n{}", None),
    "absolute-form": (b"GET http://localhost/version HTTP/1.1\r\n" + H + b"\r\n", None),
    "asterisk": (b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n", None),
}  # fmt: skip


@pytest.fixture(scope="module")
def plain(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    rp = start_capped(tmp_path_factory.mktemp("adv-edge"), control_plane)
    yield rp
    rp.stop()


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[pytest.mark.xfail(strict=True, reason=r)] if r else []) for c, (_, r) in CASES.items()],
)
def test_edge_answer_is_gos(case: str, plain: RunningProxy, control_plane: ControlPlaneInfo) -> None:
    raw = CASES[case][0]
    direct = exchange(Endpoint("127.0.0.1", control_plane.apiserver_port, control_plane.ssl_context()), raw)
    via = exchange(Endpoint.from_url(plain.url), raw)
    assert (via.status, via.is_status()) == (direct.status, direct.is_status()), (via.short(), direct.short(), raw)
    assert plain.proc.poll() is None


HALF_CLOSED = {
    "head-cut-off": b"GET /version HTTP/1.1\r\nHost: localhost\r\n",
    "request-line-cut-off": b"GET /vers",
    "three-bytes": b"GET",
}


@pytest.mark.parametrize("case", sorted(HALF_CLOSED))
def test_a_head_cut_off_by_the_clients_end_is_answered_as_go_answers(case: str, plain: RunningProxy) -> None:
    """The client sends part of a head, then ends its side of the connection (TCP half-close):
    Go's server answers the head it began reading with 400. The same bytes go to kproxy's
    listener and to Go's own server (tools/gooracle). (A request being served when the client
    ends its side is cancelled, as Go cancels its context: test_proxy_http.py's watch test.)"""
    raw = HALF_CLOSED[case]
    oracle = GoOracle()
    try:
        [go] = oracle.ask_many("serve", [raw.decode()])
    finally:
        oracle.close()
    expected = re.findall(rb"HTTP/1\.1 (\d{3})", b64(go["response"]))
    host, port = plain.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    assert re.findall(rb"HTTP/1\.1 (\d{3})", got) == expected, (got, b64(go["response"]))
