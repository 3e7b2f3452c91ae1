"""The filter chain and body types (pure logic, no network)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import ClassVar

import pytest
from multidict import CIMultiDict

from kproxy.core.chain import BytesBody, Chain, Exchange, FilterBase, Handler, Reply, StreamBody
from kproxy.core.status import StatusError
from kproxy.server.httputil import REQUEST_SKIP, UPGRADE_REQUEST_SKIP, end_to_end, is_upgrade
from kproxy.testing.exchange import make_exchange


def ex(target: str = "/api/v1/namespaces/ns/pods?labelSelector=a%3Db&watch=1", method: str = "GET") -> Exchange:
    return make_exchange(method, target)


class Tag(FilterBase):
    name: ClassVar[str] = "tag"

    def __init__(self, label: str, log: list[str]) -> None:
        self.label, self.log = label, log

    async def __call__(self, e: Exchange, call_next: Handler) -> Reply:
        self.log.append(f"in:{self.label}")
        reply = await call_next(e)
        self.log.append(f"out:{self.label}")
        reply.headers.add("X-Tag", self.label)
        return reply


async def terminal(e: Exchange) -> Reply:
    return Reply(200, CIMultiDict(), BytesBody(e.target.encode()))


async def test_onion_order_and_filter_timing() -> None:
    log: list[str] = []
    observed: list[str] = []
    chain = Chain([Tag("a", log), Tag("b", log)], terminal, observe=lambda name, secs: observed.append(name))
    reply = await chain.handle(ex())
    assert log == ["in:a", "in:b", "out:b", "out:a"]
    assert reply.headers.getall("X-Tag") == ["b", "a"]
    assert observed == ["tag", "tag"]


async def test_short_circuit_and_query_rewrite() -> None:
    class DryRun(FilterBase):
        name: ClassVar[str] = "dry"

        async def __call__(self, e: Exchange, call_next: Handler) -> Reply:
            q = e.query.copy()
            q["dryRun"] = "All"
            e.set_query(q)
            return await call_next(e)

    reply = await Chain([DryRun()], terminal).handle(ex("/api/v1/namespaces/ns/pods?x=a%2Fb", "POST"))
    assert isinstance(reply.body, BytesBody)
    assert reply.body.data == b"/api/v1/namespaces/ns/pods?x=a%2Fb&dryRun=All"
    # an untouched query is sent exactly as received
    untouched = await Chain([], terminal).handle(ex("/api/v1/pods?labelSelector=a%3Db"))
    assert isinstance(untouched.body, BytesBody) and untouched.body.data == b"/api/v1/pods?labelSelector=a%3Db"


async def test_status_reply_shape() -> None:
    reply = Reply.from_status(StatusError(503, "ServiceUnavailable", "down", retry_after=1), ex())
    assert reply.status == 503 and reply.headers["Retry-After"] == "1"
    assert isinstance(reply.body, BytesBody)
    assert json.loads(reply.body.data)["reason"] == "ServiceUnavailable"


async def _gen(*chunks: bytes) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


async def test_stream_body_limit_and_single_read() -> None:
    body = StreamBody(_gen(b"ab", b"cd"), None, "application/json", limit=10)
    assert await body.read() == b"abcd"
    assert await body.read() == b"abcd"  # read once, shared
    assert [c async for c in body.chunks()] == [b"abcd"]
    over = StreamBody(_gen(b"x" * 6, b"y" * 6), None, "", limit=10)
    with pytest.raises(StatusError) as err:
        await over.read()
    assert err.value.code == 413 and err.value.message == "Request entity too large: limit is 10"
    once = StreamBody(_gen(b"z"))
    assert [c async for c in once.chunks()] == [b"z"]
    with pytest.raises(RuntimeError):
        [c async for c in once.chunks()]


def test_hop_by_hop_headers() -> None:
    h: CIMultiDict[str] = CIMultiDict(
        [
            ("Connection", "keep-alive, X-Private"),
            ("X-Private", "1"),
            ("Keep-Alive", "5"),
            ("Warning", "299 - x"),
            ("Transfer-Encoding", "chunked"),
            ("Audit-Id", "a"),
            ("Warning", "299 - y"),
        ]
    )
    out = end_to_end(h)
    assert list(out.items()) == [("Warning", "299 - x"), ("Audit-Id", "a"), ("Warning", "299 - y")]
    up: CIMultiDict[str] = CIMultiDict([("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")])
    assert is_upgrade(up)
    assert list(end_to_end(up, UPGRADE_REQUEST_SKIP).items()) == [
        ("Connection", "Upgrade"),
        ("Upgrade", "SPDY/3.1"),
    ]
    assert not is_upgrade(CIMultiDict([("Connection", "keep-alive"), ("Upgrade", "x")]))
    req: CIMultiDict[str] = CIMultiDict([("Host", "h"), ("Connection", "Upgrade"), ("Upgrade", "x"), ("Accept", "a")])
    assert list(end_to_end(req, REQUEST_SKIP).items()) == [("Accept", "a")]
    assert list(end_to_end([("TE", "x"), ("Date", "d")]).items()) == [("Date", "d")]
