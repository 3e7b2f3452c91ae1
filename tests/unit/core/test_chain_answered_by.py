"""The chain records which filter answered without calling the rest of it (read by the access
log and the request metrics' ``answered_by``; end to end in tests/e2e/test_metrics_conventions.py)."""

from __future__ import annotations

import contextlib
from typing import ClassVar

import pytest
from multidict import CIMultiDict

from kproxy.core.chain import ANSWERED_BY_FILTER, BytesBody, Chain, Exchange, FilterBase, Handler, Reply
from kproxy.core.status import StatusError
from kproxy.server.metrics import CHAIN_REPLIED, answered_by
from kproxy.testing.exchange import make_exchange


class Passes(FilterBase):
    name: ClassVar[str] = "passes"

    async def __call__(self, ex: Exchange, call_next: Handler) -> Reply:
        return await call_next(ex)


class Answers(FilterBase):
    name: ClassVar[str] = "watchcache"

    def __init__(self, answer: bool, raises: bool = False) -> None:
        self.answer, self.raises = answer, raises

    async def __call__(self, ex: Exchange, call_next: Handler) -> Reply:
        if self.raises:
            raise StatusError(400, "BadRequest", "no")
        if self.answer:
            return Reply(200, CIMultiDict(), BytesBody(b"local"))
        return await call_next(ex)


async def terminal(e: Exchange) -> Reply:
    return Reply(200, CIMultiDict(), BytesBody(b"upstream"))


@pytest.mark.parametrize("timed", [True, False])
async def test_the_innermost_filter_that_did_not_call_next_is_recorded(timed: bool) -> None:
    observe = (lambda name, seconds: None) if timed else None
    for inner, want in (
        (Answers(True), "watchcache"),
        (Answers(False), None),
        (Answers(False, raises=True), "watchcache"),
    ):
        e = make_exchange("GET", "/api/v1/pods")
        chain = Chain([Passes(), inner], terminal, observe=observe)
        with contextlib.suppress(StatusError):
            await chain.handle(e)
        assert e.state.get(ANSWERED_BY_FILTER) == want


def test_answered_by_names_cache_filter_upstream_or_kproxy() -> None:
    assert answered_by({ANSWERED_BY_FILTER: "watchcache"}) == "cache"
    assert answered_by({ANSWERED_BY_FILTER: "validation", CHAIN_REPLIED: True}) == "filter"
    assert answered_by({CHAIN_REPLIED: True}) == "upstream"
    assert answered_by({}) == "kproxy"
