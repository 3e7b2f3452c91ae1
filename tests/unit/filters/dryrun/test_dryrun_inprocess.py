"""dryrun in the real ProxyServer, in front of recorded apiserver answers (kproxy.testing.replay):
what the upstream received is checked, not only what the client got."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kproxy.testing.inprocess import InProcessProxy, inprocess_proxy
from kproxy.testing.replay import ReplayUpstream, load_recordings

NS = "/api/v1/namespaces/rec"
JSON = {"Accept": "application/json", "Content-Type": "application/json"}
CM = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-new"},"data":{"k":"v"}}'


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[tuple[InProcessProxy, ReplayUpstream]]:
    rules = [
        {"name": "rec-is-dry", "match": {"namespaces": ["rec"]}, "action": "enforce"},
        {"name": "no-writes-elsewhere", "match": {"namespaces": ["prod"]}, "action": "reject"},
    ]
    async with inprocess_proxy({"filters": [{"name": "dryrun", "rules": rules}]}) as pair:
        yield pair


async def test_enforce_sends_the_create_as_a_dry_run(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, up = proxy
    dry = next(r for r in load_recordings() if r.target.endswith("?dryRun=All"))
    status, headers, body = await p.request("POST", f"{NS}/configmaps", JSON, CM)
    sent = up.requests("POST")[-1]
    assert (sent.method, sent.target, sent.body) == ("POST", f"{NS}/configmaps?dryRun=All", CM)
    assert (status, body) == (201, dry.body)  # the apiserver's dry-run answer, untouched
    assert "rec-is-dry" in headers["Warning"]


async def test_a_client_dry_run_value_is_replaced_by_all(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, up = proxy
    await p.request("POST", f"{NS}/configmaps?dryrun=x&fieldManager=me", JSON, CM)
    assert up.requests("POST")[-1].query == {"fieldManager": ["me"], "dryRun": ["All"]}


async def test_reads_pass_unchanged(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, up = proxy
    status, _, _ = await p.request("GET", f"{NS}/configmaps/cm-a", {"Accept": "application/json"})
    assert status == 200 and up.requests(path=f"{NS}/configmaps/cm-a")[-1].target == f"{NS}/configmaps/cm-a"


@pytest.mark.parametrize("accept", ["application/json", "application/yaml"])
async def test_reject_answers_without_the_upstream(proxy: tuple[InProcessProxy, ReplayUpstream], accept: str) -> None:
    p, up = proxy
    status, _, body = await p.request(
        "POST", "/api/v1/namespaces/prod/configmaps", {"Accept": accept, "Content-Type": "application/json"}, CM
    )
    assert status == 403 and b"no-writes-elsewhere" in body
    assert not up.requests(path="/api/v1/namespaces/prod/configmaps")
