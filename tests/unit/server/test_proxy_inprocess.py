"""The real ProxyServer (no filter) in the test process, in front of recorded apiserver answers
(kproxy.testing.replay): what passes through passes byte for byte; what Go's server or the
proxy guard refuses never reaches the upstream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kproxy.testing.inprocess import InProcessProxy, inprocess_proxy
from kproxy.testing.replay import Recorded, ReplayUpstream, load_recordings

NS = "/api/v1/namespaces/rec"
PROTOBUF = "application/vnd.kubernetes.protobuf"


def recorded(target: str, accept: str = "application/json", method: str = "GET") -> Recorded:
    for r in load_recordings():
        if r.method == method and r.target == target and r.request_headers.get("Accept") == accept:
            return r
    raise LookupError(target)


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[tuple[InProcessProxy, ReplayUpstream]]:
    async with inprocess_proxy() as pair:
        yield pair


@pytest.mark.parametrize(
    ("target", "accept"),
    [
        (f"{NS}/configmaps/cm-a", "application/json"),
        (f"{NS}/configmaps/cm-a", "application/yaml"),
        (f"{NS}/configmaps/cm-a", PROTOBUF),
        (f"{NS}/configmaps", "application/json"),
        (f"{NS}/pods", PROTOBUF),
        ("/api/v1/namespaces", "application/json"),
        ("/apis", "application/json"),
    ],
)
async def test_get_and_list_pass_byte_for_byte(
    proxy: tuple[InProcessProxy, ReplayUpstream], target: str, accept: str
) -> None:
    p, _ = proxy
    want = recorded(target, accept)
    status, headers, body = await p.request("GET", target, {"Accept": accept})
    assert (status, body) == (want.status, want.body)
    assert headers["Content-Type"] == want.header("Content-Type")
    assert "Server" not in headers


@pytest.mark.parametrize("accept", ["application/json", PROTOBUF])
async def test_a_404_status_passes_through(proxy: tuple[InProcessProxy, ReplayUpstream], accept: str) -> None:
    p, _ = proxy
    want = recorded(f"{NS}/configmaps/missing", accept)
    status, headers, body = await p.request("GET", f"{NS}/configmaps/missing", {"Accept": accept})
    assert (status, body) == (404, want.body)
    assert headers["Content-Type"] == want.header("Content-Type")


async def test_a_403_and_a_422_pass_through(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, up = proxy
    status, _, body = await p.request(
        "GET", f"{NS}/configmaps", {"Accept": "application/json", "Impersonate-User": "kproxy-user"}
    )
    assert (status, body) == (403, _403().body)
    bad = _422()
    status, _, body = await p.request(
        "POST", bad.target, {"Content-Type": "application/json", "Accept": "application/json"}, bad.request_body
    )
    assert (status, body) == (422, bad.body)
    assert up.requests("POST")[-1].body == bad.request_body  # the request body went upstream as sent


def _403() -> Recorded:
    return next(r for r in load_recordings() if r.status == 403)


def _422() -> Recorded:
    return next(r for r in load_recordings() if r.status == 422)


@pytest.mark.parametrize("accept", ["application/json", PROTOBUF])
async def test_a_watch_streams_the_recorded_events(proxy: tuple[InProcessProxy, ReplayUpstream], accept: str) -> None:
    p, _ = proxy
    want = next(r for r in load_recordings() if r.is_watch and r.request_headers["Accept"] == accept)
    status, headers, body = await p.request("GET", want.target, {"Accept": accept})
    assert (status, body) == (200, want.body)
    assert headers.get("Transfer-Encoding") == "chunked"
    if accept == "application/json":
        assert [line.split(b'"')[3] for line in body.splitlines()] == [b"ADDED", b"MODIFIED", b"DELETED"]


async def test_the_target_goes_upstream_as_sent(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, up = proxy
    target = f"{NS}/configmaps?labelSelector=a%3Db&limit=5&x=%7e"
    await p.request("GET", target)
    assert up.requests(path=f"{NS}/configmaps")[-1].target == target
    # An absolute-form target goes upstream in origin form (what Go's server routes); its
    # authority is the host the proxy guard checks.
    reader, writer = await asyncio.open_connection(*p.server.bound)  # type: ignore[misc]
    request_line = f"GET http://localhost:8001{NS}/configmaps/cm-a HTTP/1.1"
    head_lines = [request_line, "Host: localhost", "Accept: application/json"]
    writer.write(("\r\n".join(head_lines) + "\r\n\r\n").encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert up.requests(path=f"{NS}/configmaps/cm-a")[-1].target == f"{NS}/configmaps/cm-a"


async def test_what_go_refuses_never_reaches_the_upstream(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, up = proxy
    for line in (b"GET api/v1/nodes HTTP/1.1\r\nHost: localhost", b"GET /api/v1/nodes HTTP/1.1\r\nHost: a b"):
        reader, writer = await asyncio.open_connection(*p.server.bound)  # type: ignore[misc]
        writer.write(line + b"\r\n\r\n")
        await writer.drain()
        head = await reader.read(200)
        writer.close()
        assert head.startswith(b"HTTP/1.1 400"), head
    assert not [r for r in up.received if "nodes" in r.target]


async def test_the_proxy_guard_refuses_a_foreign_host(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, up = proxy
    status, _, body = await p.request("GET", f"{NS}/serviceaccounts", {"Host": "evil.example"})
    assert status == 403 and body  # kubectl proxy's accept_hosts (credentials: proxy)
    assert not up.requests(path=f"{NS}/serviceaccounts")
