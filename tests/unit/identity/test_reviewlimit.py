"""The TokenReview queues (kproxy/identity/reviewlimit.py): per client address, round robin."""

from __future__ import annotations

import asyncio

import pytest

from kproxy.core.fairness import TooManyRequests
from kproxy.identity.reviewlimit import ReviewLimiter


async def settle() -> None:
    """Let every task woken by a freed slot run (a turn reaches its waiter through a few callbacks)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_a_busy_address_waits_and_another_gets_the_next_slot() -> None:
    refused: list[str] = []
    limiter = ReviewLimiter(max_in_flight=2, max_in_flight_per_client=2, on_refused=refused.append, queue_per_client=2)
    a1, a2 = await limiter.acquire("10.0.0.1"), await limiter.acquire("10.0.0.1")
    # Two more from the sprayer wait in its own queue; a third is refused (its queue is full).
    sprayer = [asyncio.create_task(limiter.acquire("10.0.0.1")) for _ in range(2)]
    await settle()
    with pytest.raises(TooManyRequests) as err:
        await limiter.acquire("10.0.0.1")
    assert (err.value.code, err.value.message) == (429, "Too many requests, please try again later.")
    assert int(err.value.headers()["Retry-After"]) >= 1
    assert refused == ["client"]
    # A new address waits behind one of the sprayer's reviews, not behind its whole queue.
    other = asyncio.create_task(limiter.acquire("10.0.0.2"))
    await settle()
    a1()
    a1()  # a second release changes nothing
    await settle()
    assert sprayer[0].done() and not other.done() and not sprayer[1].done()
    a2()
    await settle()
    assert other.done() and not sprayer[1].done()
    other.result()()
    await settle()
    assert sprayer[1].done()
    sprayer[0].result()()
    sprayer[1].result()()
    assert limiter.in_flight == 0 and limiter.waiting == 0 and not limiter._waiting


async def test_a_review_that_waits_too_long_is_refused() -> None:
    refused: list[str] = []
    limiter = ReviewLimiter(max_in_flight=1, max_in_flight_per_client=1, on_refused=refused.append, queue_wait=0.01)
    held = await limiter.acquire("10.0.0.1")
    with pytest.raises(TooManyRequests):
        await limiter.acquire("10.0.0.2")
    assert refused == ["wait"]
    held()
    (await limiter.acquire("10.0.0.2"))()
    assert limiter.in_flight == 0
