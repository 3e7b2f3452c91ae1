"""Request heads that decide what kproxy reads as a caller's headers and body, as raw bytes to
kproxy (``credentials: forward``, no filter, no guard) and to the apiserver, both anonymous: kproxy
answers what Go's server in front of the apiserver answers (src/net/http/server.go
``readRequest``, src/net/textproto/reader.go ``readMIMEHeader``, src/net/http/transfer.go
``fixLength``). The companion of tests/adversarial/test_http_edge.py; the cases kproxy refuses
and Go takes are strict xfails naming the difference."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from .conftest import start_capped
from .wire import Endpoint, exchange

CONNECT = "kproxy refuses CONNECT with an authority-form target (400); Go reads it, the apiserver answers 403"

A = b"Accept: application/json\r\nConnection: close\r\n"
SSR = b'{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}'
POST = b"POST /apis/authentication.k8s.io/v1/selfsubjectreviews HTTP/1.1\r\nHost: localhost\r\n" + A
CT = b"Content-Type: application/json\r\n"
G = b"GET /version HTTP/1.1\r\nHost: localhost\r\n"
N = str(len(SSR)).encode()

CASES: dict[str, tuple[bytes, str | None]] = {
    "two-hosts": (G + b"Host: evil.example\r\n" + A + b"\r\n", None),
    "no-host": (b"GET /version HTTP/1.1\r\n" + A + b"\r\n", None),
    "http10-no-host": (b"GET /version HTTP/1.0\r\n" + A + b"\r\n", None),
    "name-non-ascii": (G + b"X-\xc3\xa9: 1\r\n" + A + b"\r\n", None),
    "name-space-before-colon": (G + b"Authorization : Bearer x\r\n" + A + b"\r\n", None),
    "name-empty": (G + b": x\r\n" + A + b"\r\n", None),
    "lf-line-endings": (b"GET /version HTTP/1.1\nHost: localhost\nAccept: application/json\nConnection: close\n\n",
                        None),
    "two-content-lengths-differ": (POST + CT + b"Content-Length: " + N + b"\r\nContent-Length: 1\r\n\r\n" + SSR, None),
    "two-content-lengths-equal": (POST + CT + b"Content-Length: " + N + b"\r\nContent-Length: " + N + b"\r\n\r\n" + SSR,
                                  None),
    "chunked-and-length": (POST + CT + b"Content-Length: " + N + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
                           + f"{len(SSR):x}\r\n".encode() + SSR + b"\r\n0\r\n\r\n", None),
    "connect-origin-form": (b"CONNECT /version HTTP/1.1\r\nHost: localhost\r\n" + A + b"\r\n", None),
    "connect-authority-form": (b"CONNECT localhost:443 HTTP/1.1\r\nHost: localhost\r\n" + A + b"\r\n", CONNECT),
    "nul-in-value": (G + b"X-A: a\x00b\r\n" + A + b"\r\n", None),
    "cr-in-value": (G + b"X-A: a\rb\r\n" + A + b"\r\n", None),
}  # fmt: skip


@pytest.fixture(scope="module")
def forward(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    rp = start_capped(tmp_path_factory.mktemp("inv-head"), control_plane, credentials="forward")
    yield rp
    rp.stop(signal.SIGKILL)


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[pytest.mark.xfail(strict=True, reason=r)] if r else []) for c, (_, r) in CASES.items()],
)
def test_head_answer_is_gos(case: str, forward: RunningProxy, control_plane: ControlPlaneInfo) -> None:
    raw = CASES[case][0]
    anonymous = control_plane.ssl_context(client_cert=False)
    direct = exchange(Endpoint("127.0.0.1", control_plane.apiserver_port, anonymous), raw)
    via = exchange(Endpoint.from_url(forward.url), raw)
    assert (via.status, via.is_status()) == (direct.status, direct.is_status()), (via.short(), direct.short(), raw)
    assert forward.proc.poll() is None
