"""validation in the real ProxyServer, in front of recorded apiserver answers (kproxy.testing.replay):
a Strict create with unknown fields is answered in kproxy from the recorded /openapi/v3, with the
apiserver's own recorded 400, and never reaches the upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from kproxy.testing.inprocess import InProcessProxy, inprocess_proxy
from kproxy.testing.replay import ReplayUpstream, recording

NS = "/api/v1/namespaces/rec"
STRICT = f"{NS}/configmaps?fieldValidation=Strict"


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[tuple[InProcessProxy, ReplayUpstream]]:
    rules = [{"name": "rec-is-strict", "match": {"namespaces": ["rec"]}, "level": "Strict"}]
    config = {"filters": [{"name": "validation", "rules": rules, "watch_crds": False}]}
    async with inprocess_proxy(config) as pair:
        yield pair


@pytest.mark.parametrize("accept", ["application/json", "application/yaml"])
async def test_strict_unknown_fields_are_answered_locally(
    proxy: tuple[InProcessProxy, ReplayUpstream], accept: str
) -> None:
    p, up = proxy
    want = recording(STRICT, accept, "POST")  # the apiserver's answer to this very body
    status, headers, body = await p.request(
        "POST", f"{NS}/configmaps", {"Accept": accept, "Content-Type": "application/json"}, want.request_body
    )
    assert (status, body) == (400, want.body)
    assert headers["Content-Type"] == want.header("Content-Type")
    # Decided from the recorded OpenAPI (after the recorded access review): no write went upstream.
    assert not up.requests(path=f"{NS}/configmaps")
    assert up.requests(path="/openapi/v3")


async def test_a_valid_create_goes_up_with_the_raised_level(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, up = proxy
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-new"}}).encode()
    await p.request(
        "POST", f"{NS}/configmaps", {"Accept": "application/json", "Content-Type": "application/json"}, body
    )
    sent = up.requests("POST")[-1]
    assert sent.query.get("fieldValidation") == ["Strict"] and sent.body == body


async def test_reads_pass_unchanged(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, _ = proxy
    status, _, body = await p.request("GET", f"{NS}/configmaps/cm-a", {"Accept": "application/json"})
    assert (status, body) == (200, recording(f"{NS}/configmaps/cm-a").body)
