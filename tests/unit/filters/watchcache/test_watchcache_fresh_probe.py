"""A read that stops waiting for the cache leaves its progress probe behind; when that probe
fails later (the apiserver restarted: ``Cannot write to closing transport`` on a pooled
connection), its error must end quietly, not as asyncio's "Task exception was never retrieved"
traceback in kproxy's log."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from kproxy.filters.watchcache.resource_cache import ResourceCache


class _Cache:
    ready = True
    rv = 1

    async def wait_until(self, rv: int, timeout: float) -> bool:
        await asyncio.sleep(timeout)
        return False


class _Reflector:
    live = True

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def request_progress(self) -> None:
        await asyncio.sleep(self.delay)
        raise ConnectionResetError("Cannot write to closing transport")


async def _unretrieved(delay: float, timeout: float) -> tuple[bool, list[dict[str, Any]]]:
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    rc = ResourceCache.__new__(ResourceCache)  # only what fresh() uses
    rc.cache = _Cache()  # type: ignore[assignment]
    rc.reflector = _Reflector(delay)  # type: ignore[assignment]
    fresh = await rc.fresh(5, timeout)
    await asyncio.sleep(delay + 0.1)  # the probe has failed by now
    gc.collect()
    await asyncio.sleep(0)
    return fresh, errors


async def test_a_probe_failing_after_the_read_gave_up_is_quiet() -> None:
    fresh, errors = await _unretrieved(delay=0.3, timeout=0.1)
    assert fresh is False
    assert not errors, [e.get("message") for e in errors]


async def test_a_probe_failing_while_waited_for_is_quiet() -> None:
    fresh, errors = await _unretrieved(delay=0.05, timeout=0.3)
    assert fresh is False
    assert not errors, [e.get("message") for e in errors]
