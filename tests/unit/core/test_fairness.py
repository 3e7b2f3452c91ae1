"""The fair body-work pool and the body budget: turns go round the callers, queues and bytes are
bounded, and a refusal is the apiserver's APF 429."""

from __future__ import annotations

import asyncio

import pytest

from kproxy.core.bodybudget import BodyBudget, BudgetLimits
from kproxy.core.chain import Reply
from kproxy.core.fairness import FairLimits, FairPool, RetryAfter, TooManyRequests
from kproxy.testing.exchange import make_exchange


async def test_a_second_caller_finds_a_worker_while_one_caller_floods() -> None:
    pool = FairPool(FairLimits(workers=2, per_caller=1, queue_per_caller=100))
    await pool.acquire("attacker")
    flood = [asyncio.ensure_future(pool.acquire("attacker")) for _ in range(10)]
    await asyncio.sleep(0)
    assert not any(f.done() for f in flood)  # one worker at a time for one caller
    await asyncio.wait_for(pool.acquire("victim"), 0.1)  # the other worker is free
    assert pool.running == 2
    for f in flood:
        f.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    assert pool.waiting == 0


async def test_turns_go_round_robin() -> None:
    pool = FairPool(FairLimits(workers=1, per_caller=1, queue_per_caller=10))
    await pool.acquire("a")
    order: list[str] = []

    async def job(key: str) -> None:
        await pool.acquire(key)
        order.append(key)
        pool.release(key)

    tasks = [asyncio.ensure_future(job("a")) for _ in range(3)]
    await asyncio.sleep(0)
    tasks += [asyncio.ensure_future(job("b")) for _ in range(3)]
    await asyncio.sleep(0)
    pool.release("a")
    await asyncio.gather(*tasks)
    assert order == ["a", "b", "a", "b", "a", "b"]


async def test_full_queues_and_long_waits_get_apf_429() -> None:
    pool = FairPool(FairLimits(workers=1, per_caller=1, queue_per_caller=1, queue_total=2, queue_wait=0.05))
    await pool.acquire("a")
    waiting = asyncio.ensure_future(pool.acquire("a"))
    await asyncio.sleep(0)
    with pytest.raises(TooManyRequests):
        await pool.acquire("a")  # its own queue is full
    with pytest.raises(TooManyRequests) as err:
        await waiting  # waited past queue_wait
    # APF's 429 is plain text whatever the caller accepts (a protobuf client here)
    reply = Reply.from_status(err.value, make_exchange(headers={"Accept": "application/vnd.kubernetes.protobuf"}))
    assert reply.status == 429
    assert reply.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert reply.headers["Retry-After"] == "1"
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
    assert reply.body.data == b"Too many requests, please try again later.\n"  # type: ignore[union-attr]
    pool.release("a")
    assert pool.running == 0 and pool.waiting == 0 and not pool._flows


def test_retry_after_grows_and_shrinks_as_the_apiservers() -> None:
    now = [1000.0]
    ra = RetryAfter(clock=lambda: now[0])
    for _ in range(5):
        ra.record()
    now[0] += 1
    assert ra.record() == 2  # >= 3 drops in the last second: doubled
    now[0] += 10
    ra.record()
    now[0] += 1
    assert ra.record() == 1  # quiet since: lowered


async def test_budget_bounds_bytes_per_caller_and_in_total() -> None:
    budget = BodyBudget(BudgetLimits(limit=10, per_caller=6, wait=0.05))
    a = budget.lease("a")
    await a.cover(6)
    with pytest.raises(TooManyRequests):
        await budget.lease("a").cover(1)  # a's share is spent
    b = budget.lease("b")
    await b.cover(4)
    with pytest.raises(TooManyRequests):
        await budget.lease("c").cover(1)  # the total is spent
    later = asyncio.ensure_future(budget.lease("c").cover(3))
    await asyncio.sleep(0)
    a.close()
    await asyncio.wait_for(later, 1)
    assert budget.held == 7


async def test_a_small_body_never_waits_behind_large_ones() -> None:
    """Two callers' large bodies take one worker between them; the other stays free for small ones."""
    pool = FairPool(FairLimits(workers=2, per_caller=1, queue_per_caller=10, large_bytes=100))
    assert await pool.acquire("a", 1000) is True
    second = asyncio.ensure_future(pool.acquire("b", 1000))
    await asyncio.sleep(0)
    assert not second.done()  # large bodies hold at most workers - 1
    assert await asyncio.wait_for(pool.acquire("victim", 10), 0.1) is False
    pool.release("victim", False)
    pool.release("a", True)
    assert await asyncio.wait_for(second, 0.1) is True  # b's turn comes when a's large body is done
    pool.release("b", True)
    assert pool.running == pool.running_large == pool.waiting == 0


async def test_a_body_that_fits_does_not_wait_behind_another_callers() -> None:
    budget = BodyBudget(BudgetLimits(limit=100, per_caller=10, wait=5))
    await budget.lease("attacker").cover(10)
    waiting = asyncio.ensure_future(budget.lease("attacker").cover(5))  # over its share: waits
    await asyncio.sleep(0)
    assert not waiting.done()
    await asyncio.wait_for(budget.lease("victim").cover(5), 0.1)  # not behind the attacker's
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert budget.held == 15
