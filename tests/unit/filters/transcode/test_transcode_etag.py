"""Validators through transcode (why: the module doc of kproxy.filters.transcode). The real
kube-apiserver sets ETags only on discovery and OpenAPI, which transcode never rewrites (their
round trips through every filter: tests/e2e/test_conditional_requests.py); an aggregated API
may set them on resources, so its answers are stood in for here by recorded protobuf answers
given an ETag."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from multidict import CIMultiDictProxy

from kproxy.testing.inprocess import InProcessProxy, inprocess_proxy
from kproxy.testing.replay import ReplayUpstream, recording

TARGET = "/api/v1/namespaces/rec/configmaps/cm-a"
PROTOBUF = "application/vnd.kubernetes.protobuf"
TAG = '"5F3A9C"'


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[InProcessProxy, ReplayUpstream]]:
    async with inprocess_proxy({"filters": [{"name": "transcode", "upstream": "protobuf"}]}) as pair:
        yield pair


async def test_a_transcoded_answer_keeps_the_upstreams_tag(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, up = proxy
    pb = recording(TARGET, PROTOBUF)
    up.add([replace(pb, headers=[*pb.headers, ("ETag", TAG)])])
    status, headers, body = await p.request("GET", TARGET, {"Accept": "application/json", "If-None-Match": '"old"'})
    assert isinstance(headers, CIMultiDictProxy)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert body == recording(TARGET).body  # transcoded, byte for byte the apiserver's JSON
    assert headers.getall("ETag") == [TAG]
    sent = up.requests(path=TARGET)[-1]
    assert sent.headers["Accept"].startswith(PROTOBUF)  # the representation the tag names
    assert sent.headers.getall("If-None-Match") == ['"old"']


@pytest.mark.parametrize("accept", ["application/json", "application/yaml"])
async def test_a_304_passes_as_the_200_it_stands_for(proxy: tuple[InProcessProxy, ReplayUpstream], accept: str) -> None:
    p, up = proxy
    pb = recording(TARGET, PROTOBUF)
    not_modified = [("Content-Type", PROTOBUF), ("ETag", TAG), ("Content-Length", "0")]
    up.add([replace(pb, status=304, headers=not_modified, chunks=[])])
    status, headers, body = await p.request("GET", TARGET, {"Accept": accept, "If-None-Match": TAG})
    assert isinstance(headers, CIMultiDictProxy)
    assert (status, body) == (304, b"")  # not a 500 from decoding an empty body
    assert headers.getall("ETag") == [TAG]
    assert headers["Content-Type"] == accept  # as the 200 would have said, never protobuf
    assert up.requests(path=TARGET)[-1].headers.getall("If-None-Match") == [TAG]
