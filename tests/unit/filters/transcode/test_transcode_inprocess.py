"""transcode in the real ProxyServer, in front of recorded apiserver answers (kproxy.testing.replay):
a JSON or YAML client, a protobuf upstream (the recorded protobuf answer), and the client gets
what the apiserver itself answered it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kproxy.testing.inprocess import InProcessProxy, inprocess_proxy
from kproxy.testing.replay import ReplayUpstream, recording

NS = "/api/v1/namespaces/rec"
PROTOBUF = "application/vnd.kubernetes.protobuf"


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[tuple[InProcessProxy, ReplayUpstream]]:
    async with inprocess_proxy({"filters": [{"name": "transcode", "upstream": "protobuf"}]}) as pair:
        yield pair


@pytest.mark.parametrize(
    "target", [f"{NS}/configmaps/cm-a", f"{NS}/pods", f"{NS}/pods/pod-a", "/api/v1/namespaces", NS]
)
async def test_a_json_client_gets_the_apiservers_json_from_protobuf(
    proxy: tuple[InProcessProxy, ReplayUpstream], target: str
) -> None:
    p, up = proxy
    status, headers, body = await p.request("GET", target, {"Accept": "application/json"})
    sent = up.requests(path=target)[-1]
    assert sent.headers["Accept"].startswith(PROTOBUF)
    assert sent.answered_by is not None and sent.answered_by.request_headers["Accept"] == PROTOBUF
    want = recording(target)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert body == want.body  # byte for byte: the Go JSON encoder, ported


async def test_a_protobuf_client_gets_the_protobuf_untouched(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, _ = proxy
    status, _, body = await p.request("GET", f"{NS}/pods", {"Accept": PROTOBUF})
    assert (status, body) == (200, recording(f"{NS}/pods", PROTOBUF).body)


async def test_a_404_status_is_transcoded(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, _ = proxy
    target = f"{NS}/configmaps/missing"
    status, headers, body = await p.request("GET", target, {"Accept": "application/json"})
    assert status == 404 and headers["Content-Type"] == "application/json"
    assert body == recording(target).body


async def test_a_json_watch_from_a_protobuf_watch(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, _ = proxy
    want = recording("", watch=True)
    status, _, body = await p.request("GET", want.target, {"Accept": "application/json"})
    assert status == 200
    assert body == want.body
