"""CPU-bound work on a request body, kept off the event loop.

Decoding a body a caller sent (YAML above all, and Go's JSON syntax check) costs time linear in
its size, up to the 3 MiB the apiserver accepts: seconds of pure Python for a hostile body. Run
on the event loop, that would stall every other request of the process. Small bodies are decoded
in place (the thread hop would cost more than the work); larger ones on a worker thread, at most
``MAX_CONCURRENT`` at a time per process (the rest wait without blocking the loop), so a stream of
hostile bodies costs CPU but not responsiveness. A worker thread holds the GIL only between the
interpreter's switch points (``sys.getswitchinterval()``, 5 ms), so the loop keeps running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from kproxy.core.context import FilterContext

__all__ = ["INLINE_BYTES", "MAX_CONCURRENT", "run_body_work"]

T = TypeVar("T")

#: Bodies up to this size are decoded on the loop (a few milliseconds at worst).
INLINE_BYTES = 8 * 1024
#: Body decodes running on worker threads at once, per process.
MAX_CONCURRENT = 2

_SERVICE = "kproxy.core.offload.body_work"


async def run_body_work(ctx: FilterContext | None, size: int, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``: in place for a body of ``size`` bytes up to :data:`INLINE_BYTES`, else on a
    worker thread under the process-wide limit."""
    if size <= INLINE_BYTES or ctx is None:
        return fn(*args)
    limit: asyncio.Semaphore = ctx.shared(_SERVICE, lambda: asyncio.Semaphore(MAX_CONCURRENT))
    async with limit:
        return await asyncio.to_thread(fn, *args)
