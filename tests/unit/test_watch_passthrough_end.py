"""Where a watch passed through from the apiserver may end (``WatchPassThrough``): after a whole
event, never inside one, whatever the reads the events arrive in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from multidict import CIMultiDict

from kproxy.server.upstream import WatchPassThrough


class FakeResponse:
    """An upstream response whose reads the test hands out; ``close()`` ends the pending one."""

    status = 200
    reason = "OK"
    content_length = None

    def __init__(self) -> None:
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.reads: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = False

    async def read(self) -> bytes:
        raise NotImplementedError

    async def chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self.reads.get()) is not None:
            yield chunk
        if self.closed:
            raise ConnectionResetError("closed")

    def close(self) -> None:
        self.closed = True
        self.reads.put_nowait(None)


async def _run(framing: str, before: list[bytes], after: list[bytes]) -> tuple[bytes, bytes]:
    """The bytes passed on before ``end()`` (once ``before`` was read) and after it."""
    resp = FakeResponse()
    watch = WatchPassThrough(resp, framing)
    it = watch.chunks()
    got = b""
    for chunk in before:
        resp.reads.put_nowait(chunk)
        got += await anext(it)
    watch.end()
    for chunk in after:
        resp.reads.put_nowait(chunk)
    rest = b"".join([c async for c in it])
    assert resp.closed
    return got, rest


def _frame(n: int, fill: bytes = b"x") -> bytes:
    return n.to_bytes(4, "big") + fill * n


async def test_an_idle_watch_ends_at_once() -> None:
    for framing, event in (("json", b'{"type":"ADDED"}\n'), ("protobuf", _frame(10))):
        got, rest = await _run(framing, [event], [])
        assert (got, rest) == (event, b"")


async def test_a_json_watch_inside_an_event_ends_after_it() -> None:
    got, rest = await _run("json", [b'{"a":1}\n{"type":"AD'], [b"DED", b'"}\n{"type":"MOD', b'IFIED"}\n'])
    assert got + rest == b'{"a":1}\n{"type":"ADDED"}\n'


async def test_a_protobuf_watch_ends_after_the_frame_even_split_in_its_length() -> None:
    one, two, three = _frame(5, b"a"), _frame(0), _frame(300, b"c")
    stream = one + two + three + _frame(7)
    # The end comes inside the second frame's length prefix, then inside the third frame.
    cut = len(one) + 2
    got, rest = await _run("protobuf", [stream[:cut]], [stream[cut : cut + 1], stream[cut + 1 :]])
    assert got + rest == one + two
    got, rest = await _run("protobuf", [stream[: len(one + two) + 100]], [stream[len(one + two) + 100 :]])
    assert got + rest == one + two + three
