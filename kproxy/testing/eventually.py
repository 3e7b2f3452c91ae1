"""Wait for a condition in tests: poll it until it holds or a deadline passes.

Tests wait on events, never on fixed sleeps; when what they wait for is only observable by asking
(an apiserver's answer, a metric, a file), they ask with :func:`eventually` (or
:func:`eventually_async` inside a coroutine), which fails with what was waited for and the last
value (or exception) the probe gave::

    eventually(lambda: rp.get(path)[0] == 200, 30, "the pods cache to be ready")
    obj = eventually(lambda: get(name), 10, "the object", until=lambda o: o is not None)
    await eventually_async(lambda: stream.closed, 5, "the stream to close")
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["Timeout", "eventually", "eventually_async"]

T = TypeVar("T")


class Timeout(AssertionError):
    """The condition did not hold before the deadline; ``last`` is the probe's last value or exception."""

    def __init__(self, what: str, timeout: float, last: object, attempts: int) -> None:
        self.what, self.timeout, self.last, self.attempts = what, timeout, last, attempts
        shown = repr(last)
        if len(shown) > 2000:
            shown = shown[:2000] + "..."
        kind = "last exception" if isinstance(last, BaseException) else "last value"
        super().__init__(f"timed out after {timeout:g}s ({attempts} tries) waiting for {what}; {kind}: {shown}")


_NOTHING = object()
#: Bound at import: a test may replace ``asyncio.sleep`` (a fake backoff) while it waits here.
_sleep = asyncio.sleep


def eventually(
    probe: Callable[[], T],
    timeout: float,
    what: str,
    interval: float = 0.05,
    *,
    until: Callable[[T], object] = bool,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``probe`` every ``interval`` seconds until ``until(value)`` is true (by default: until
    the value is truthy) and return that value; after ``timeout`` seconds raise :class:`Timeout`
    naming ``what`` and the last value. Exceptions of the types in ``ignore`` count as "not yet"
    (the last one is reported); any other propagates at once."""
    end = time.monotonic() + timeout
    last: object = _NOTHING
    attempts = 0
    while True:
        attempts += 1
        try:
            value = probe()
        except ignore as e:
            last = e
        else:
            if until(value):
                return value
            last = value
        if time.monotonic() >= end:
            raise Timeout(what, timeout, last, attempts)
        time.sleep(interval)


async def eventually_async(
    probe: Callable[[], T | Awaitable[T]],
    timeout: float,
    what: str,
    interval: float = 0.05,
    *,
    until: Callable[[T], object] = bool,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """:func:`eventually` inside a coroutine: ``probe`` may be a plain function or return an
    awaitable, and the loop yields to the event loop between tries (what it waits for usually
    happens on the same loop)."""
    end = time.monotonic() + timeout
    last: object = _NOTHING
    attempts = 0
    while True:
        attempts += 1
        try:
            got: Any = probe()
            value: T = await got if inspect.isawaitable(got) else got
        except ignore as e:
            last = e
        else:
            if until(value):
                return value
            last = value
        if time.monotonic() >= end:
            raise Timeout(what, timeout, last, attempts)
        await _sleep(interval)
