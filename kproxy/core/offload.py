"""CPU-bound work on a request body, kept off the event loop and shared fairly between callers.

Decoding a body a caller sent (YAML above all, and Go's JSON syntax check) costs time linear in
its size, up to the 3 MiB the apiserver accepts: seconds of pure Python for a hostile body. Run
on the event loop, that would stall every other request of the process. Small bodies are decoded
in place (the thread hop would cost more than the work); larger ones on a worker thread. The
workers are shared by every caller through a :class:`kproxy.core.fairness.FairPool`: each caller
has its own bounded queue, a freed worker goes to the next caller in turn, one caller runs at most
``per_caller`` decodes at once, large bodies never take every worker, and a full queue (or a wait
past ``queue_wait``) is answered with the apiserver's APF 429. A stream of hostile bodies from one
caller costs CPU, not other callers' turns. A worker thread holds the GIL only between the
interpreter's switch points (set to :data:`SWITCH_INTERVAL`, 1 ms), so the loop keeps running.

The server installs the pool with its configured limits (``bodies:`` in the config,
:func:`install`); without one (unit tests, tools) a pool with the default limits is made.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from kproxy.core.context import FilterContext, ServiceKey
from kproxy.core.fairness import FairLimits, FairPool, flow_of

if TYPE_CHECKING:
    from kproxy.core.chain import Exchange

__all__ = ["INLINE_BYTES", "SERVICE", "install", "pool", "run_body_work"]

T = TypeVar("T")

#: Bodies up to this size are decoded on the loop (a few milliseconds at worst).
INLINE_BYTES = 8 * 1024

#: The interpreter's switch interval while bodies are decoded on threads (seconds).
SWITCH_INTERVAL = 0.001

#: ``FilterContext`` service key of the process's one body-work pool.
SERVICE: ServiceKey[FairPool] = ServiceKey(f"{__name__}.body_work")


def install(ctx: FilterContext, limits: FairLimits) -> FairPool:
    """Set the body-work pool's limits (made now, or the running one updated on a reload)."""
    # A decode thread holds the interpreter until the loop has asked for it for a whole switch
    # interval: each of the loop's wake-ups (a socket ready, a TLS record) may wait that long, so a
    # request through a busy kproxy pays it dozens of times. 1 ms instead of Python's 5 halved a
    # victim's write latency under a flood of costly bodies (benchmarks/results/fairness-2026-11-28.md).
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
    current = ctx.find(SERVICE)
    if current is not None:
        current.limits = limits
        return current
    made = FairPool(limits)
    ctx.provide(SERVICE, made)
    return made


def pool(ctx: FilterContext) -> FairPool:
    return ctx.service(SERVICE, FairPool)


async def run_body_work(
    ctx: FilterContext | None, size: int, fn: Callable[..., T], *args: object, ex: Exchange | None = None
) -> T:
    """``fn(*args)``: in place for a body of ``size`` bytes up to :data:`INLINE_BYTES`, else on a
    worker thread in the turn of ``ex``'s caller (raises the APF 429 when its queue is full)."""
    if size <= INLINE_BYTES or ctx is None:
        return fn(*args)
    shared = pool(ctx)
    key = flow_of(ctx, ex)
    large = await shared.acquire(key, size)
    try:
        work = asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))
    except BaseException:
        shared.release(key, large)
        raise
    # The slot is the thread's until the work ends, even if the caller leaves first (a thread
    # cannot be stopped): its worker is not free before.
    work.add_done_callback(functools.partial(_done, shared, key, large))
    return await asyncio.shield(work)


def _done(shared: FairPool, key: str, large: bool, work: asyncio.Future[object]) -> None:
    shared.release(key, large)
    if not work.cancelled():
        work.exception()  # retrieved: a caller that left does not leave an unread error behind
