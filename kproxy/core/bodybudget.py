"""The memory request bodies may hold, all callers together and each caller alone.

A body kproxy checks (validation, dry-run rules) is read whole before it is decoded; up to the
3 MiB the apiserver accepts, per request. Without a bound, callers that send the start of many
bodies and then stall make kproxy hold them all. Every body read whole takes its bytes from a
:class:`BodyBudget` first, once its caller has been identified as the apiserver identifies it
before reading a body (a rejected token gets the apiserver's 401 and takes nothing): a caller
known by its user, the declared ``Content-Length`` at once (a chunked body, each piece as it
comes); a caller known only by its address (``credentials: proxy``), the bytes it has sent, so
that addresses declaring bodies they never send hold nothing. Given back when the request has
been answered. A body streamed through to the apiserver takes none (it holds no more than its
connection's read buffer). A body that would take the total
past ``limit``, or its caller's share past ``per_caller``, waits up to ``wait`` for bytes to be
given back (it is not read meanwhile: the client's bytes stay in the socket buffers), then is
answered with the apiserver's APF 429 (:class:`kproxy.core.fairness.TooManyRequests`).

So the bodies held stay under ``limit`` (a chunked body may overshoot by the one piece read
before its turn is taken: at most the listener's read buffer, 128 KiB), and one caller holds at
most ``per_caller``, whatever the number of its connections.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from kproxy.core.fairness import RetryAfter, TooManyRequests
from kproxy.core.status import StatusError, timeout

__all__ = ["BodyBudget", "BudgetLimits", "Lease", "body_timeout"]


def body_timeout() -> StatusError:
    """The apiserver's answer to a request not done within its request timeout
    (``staging/src/k8s.io/apiserver/pkg/server/filters/timeout.go``): 504 ``Timeout: request did not
    complete within the allotted timeout``, details ``{}``."""
    return timeout("request did not complete within the allotted timeout")


@dataclass(frozen=True, slots=True)
class BudgetLimits:
    #: Bytes all bodies being read may hold; 0 = no limit.
    limit: int = 64 << 20
    #: Bytes one caller's bodies may hold; 0 = no limit beyond ``limit``.
    per_caller: int = 16 << 20
    #: Longest a body waits for bytes to be given back before its 429 (seconds).
    wait: float = 1.0


class BodyBudget:
    def __init__(self, limits: BudgetLimits | None = None) -> None:
        self.limits = limits or BudgetLimits()
        self.held = 0
        self._by_caller: dict[str, int] = {}
        self._waiting: deque[tuple[str, int, asyncio.Future[None]]] = deque()
        self._waiting_for: dict[str, int] = {}
        self.retry_after = RetryAfter()
        self.rejected = 0

    def _fits(self, key: str, n: int) -> bool:
        lim = self.limits
        if lim.limit and self.held + n > lim.limit:
            return False
        return not (lim.per_caller and self._by_caller.get(key, 0) + n > lim.per_caller)

    def _take(self, key: str, n: int) -> None:
        self.held += n
        self._by_caller[key] = self._by_caller.get(key, 0) + n

    async def take(self, key: str, n: int) -> None:
        """Take ``n`` bytes for ``key``'s body: at once when they fit, else after others give
        some back (within ``wait``), else :class:`TooManyRequests`. A body larger than the limit
        itself is let through when nothing else is held (the request-size limit bounds it)."""
        if n <= 0:
            return
        # A body that fits goes in at once, unless its own caller has bodies waiting (they go
        # first): another caller's bodies waiting for bytes do not hold it up.
        if not self._waiting_for.get(key) and (self._fits(key, n) or (self.held == 0 and not self._waiting)):
            self._take(key, n)
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (key, n, turn)
        self._waiting.append(entry)
        self._waiting_for[key] = self._waiting_for.get(key, 0) + 1
        try:
            await asyncio.wait_for(asyncio.shield(turn), self.limits.wait)
        except BaseException as err:
            if turn.done() and not turn.cancelled():
                self.give(key, n)
            else:
                turn.cancel()
                self._waiting.remove(entry)
                self._unwait(key)
                self._grant()  # a big body leaving the line may let smaller ones behind it in
            if isinstance(err, TimeoutError):
                self.rejected += 1
                raise TooManyRequests(self.retry_after.record()) from None
            raise

    def give(self, key: str, n: int) -> None:
        if n <= 0:
            return
        self.held -= n
        left = self._by_caller.get(key, 0) - n
        if left > 0:
            self._by_caller[key] = left
        else:
            self._by_caller.pop(key, None)
        self._grant()

    def _unwait(self, key: str) -> None:
        left = self._waiting_for[key] - 1
        if left:
            self._waiting_for[key] = left
        else:
            del self._waiting_for[key]

    def _grant(self) -> None:
        """Let in the waiting bodies that now fit, each caller's in its order."""
        blocked: set[str] = set()
        for entry in list(self._waiting):
            key, n, turn = entry
            if key in blocked:
                continue
            if self._fits(key, n) or self.held == 0:
                self._waiting.remove(entry)
                self._unwait(key)
                self._take(key, n)
                turn.set_result(None)
            else:
                blocked.add(key)

    def lease(self, key: str) -> Lease:
        return Lease(self, key)


class Lease:
    """The bytes one request's body holds; :meth:`close` gives them all back."""

    __slots__ = ("_budget", "held", "key")

    def __init__(self, budget: BodyBudget, key: str) -> None:
        self._budget = budget
        self.key = key
        self.held = 0

    async def cover(self, total: int) -> None:
        """Hold at least ``total`` bytes (taking the difference from the budget)."""
        more = total - self.held
        if more > 0:
            await self._budget.take(self.key, more)
            self.held += more

    def close(self) -> None:
        held, self.held = self.held, 0
        self._budget.give(self.key, held)
