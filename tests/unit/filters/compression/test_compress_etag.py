"""Validators through the compression filter: the apiserver's ETag goes out as it came, and the
client's If-None-Match goes up as it was sent (why: kproxy.compress.headers; the real
round trips: tests/e2e/test_conditional_requests.py)."""

from __future__ import annotations

import gzip
from collections.abc import Callable

import pytest
from multidict import CIMultiDict
from test_compress_filter import BIG, Upstream, body_of, chain, json_reply

from kproxy.core.chain import BytesBody, Reply, StreamBody
from kproxy.testing.exchange import make_exchange

TAG = '"C1F1010597FE58AB"'  # the shape of the apiserver's: strconv.Quote of a hex hash


def _whole() -> Reply:
    return json_reply(BIG, ETag=TAG, Vary="Accept")


def _streamed() -> Reply:
    return json_reply(BIG, stream=True, length=False, ETag=TAG, Vary="Accept")


def _upstream_gzip() -> Reply:
    return json_reply(gzip.compress(BIG), stream=True, length=False, ETag=TAG, Content_Encoding="gzip")


@pytest.mark.parametrize("make", [_whole, _streamed, _upstream_gzip])
@pytest.mark.parametrize("coding", ["gzip", "zstd", None])
async def test_etag_left_as_the_upstream_sent_it(make: Callable[[], Reply], coding: str | None) -> None:
    up = Upstream(make)
    reply = await chain(up, upstream_gzip=make is _upstream_gzip).handle(
        make_exchange("GET", "/apis", {} if coding is None else {"Accept-Encoding": coding})
    )
    assert reply.status == 200
    assert reply.headers.getall("ETag") == [TAG]
    if coding is not None:
        assert reply.headers["Content-Encoding"] == coding  # compressed, and still the same tag
        await body_of(reply)


@pytest.mark.parametrize("coding", ["gzip", "zstd", None])
@pytest.mark.parametrize(
    "sent",
    [
        [TAG],
        ['W/"C1F1010597FE58AB"'],  # a tag some earlier hop weakened: the apiserver decides
        ['"W/"C1F1010597FE58AB"'],  # what a client that trims quotes rebuilds from a weak tag
        ['"a", W/"b"', '"c"'],  # a list, over two lines
        ["*"],
    ],
)
async def test_if_none_match_goes_up_as_sent(coding: str | None, sent: list[str]) -> None:
    up = Upstream(lambda: Reply(304, CIMultiDict([("ETag", TAG), ("Vary", "Accept")]), BytesBody(b"")))
    headers = [("If-None-Match", v) for v in sent]
    if coding is not None:
        headers.append(("Accept-Encoding", coding))
    reply = await chain(up).handle(make_exchange("GET", "/apis", CIMultiDict(headers)))
    assert up.seen is not None
    assert up.seen.headers.getall("If-None-Match") == sent
    # The apiserver's 304 comes back as it is: its tag, no coding, no body.
    assert reply.status == 304
    assert reply.headers.getall("ETag") == [TAG]
    assert "Content-Encoding" not in reply.headers
    assert isinstance(reply.body, (BytesBody, StreamBody))
    assert await body_of(reply) == b""
