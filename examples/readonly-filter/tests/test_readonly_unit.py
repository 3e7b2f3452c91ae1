"""Unit tests of the example filter with a fake downstream (its e2e test is tests/e2e/test_example_filter.py)."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict

from kproxy.config import ConfigError, parse_config
from kproxy.core.chain import Chain
from kproxy.filterapi import BytesBody, Exchange, Reply
from kproxy.filters import build_filters
from kproxy.testing.exchange import make_exchange


def exchange(method: str, target: str) -> Exchange:
    return make_exchange(method, target)


async def upstream(ex: Exchange) -> Reply:
    return Reply(200, CIMultiDict(), BytesBody(b"upstream"))


def chain(**settings: object) -> Chain:
    cfg = parse_config({"filters": [{"name": "readonly", **settings}]})
    return Chain(build_filters(cfg), upstream)


async def test_reads_pass_and_writes_outside_allowed_namespaces_are_forbidden() -> None:
    c = chain(allow_namespaces=["dev-*"])
    assert (await c.handle(exchange("GET", "/api/v1/namespaces/prod/pods"))).status == 200
    assert (await c.handle(exchange("POST", "/api/v1/namespaces/dev-1/configmaps"))).status == 200
    reply = await c.handle(exchange("DELETE", "/apis/apps/v1/namespaces/prod/deployments/web"))
    assert reply.status == 403
    assert isinstance(reply.body, BytesBody)
    st = json.loads(reply.body.data)
    assert st["message"] == (
        'deployments.apps "web" is forbidden: kproxy readonly filter: writes are allowed only in dev-*'
    )
    assert st["details"] == {"name": "web", "group": "apps", "kind": "deployments"}
    # cluster-scoped writes are never in an allowed namespace
    assert (await c.handle(exchange("POST", "/api/v1/namespaces"))).status == 403


def test_unknown_setting_is_named() -> None:
    with pytest.raises(ConfigError, match=r"filters\[0\].allow_namespace: unknown key"):
        chain(allow_namespace=["x"])
