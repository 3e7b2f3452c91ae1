"""Fair shares of work that every caller's requests draw on.

The apiserver bounds the work it takes on at once with priority and fairness (APF): requests wait in
per-flow queues (``staging/src/k8s.io/apiserver/pkg/util/flowcontrol/fairqueuing/queueset``), a
flow being one caller (its FlowSchema's distinguisher: by user), are dispatched so that each flow
gets its share of the seats, and are refused with a 429 when their queue is full or they waited
too long (``staging/src/k8s.io/apiserver/pkg/server/filters/priority-and-fairness.go``). kproxy has
work of its own that callers share (decoding bodies it checks, see :mod:`kproxy.core.offload`);
:class:`FairPool` shares it out the same way:

* each caller (its flow: :func:`flow_of`) has its own FIFO queue; a freed worker goes to the next
  caller in round-robin order that has work waiting, so a caller with many requests waiting takes
  one turn per round, as a caller with one does;
* a caller runs at most ``per_caller`` jobs at once, so one caller alone cannot hold every worker:
  with the defaults (two workers, one per caller) a second caller always finds a worker free while
  only one other caller is busy;
* jobs are weighed by the size of their body, as APF weighs requests by their estimated work:
  large ones (``large_bytes`` and more, the costly decodes: a 3 MB YAML body takes most of a
  second) take at most ``workers - 1`` workers together, so a small body never waits behind large
  ones, whichever callers send them, and at most that many threads compete with the event loop for
  the interpreter at a time;
* queues are bounded per caller and in total, and a job waits at most ``queue_wait`` (APF's is the
  request timeout / 4, 15 s); past either, the apiserver's APF answer: 429 ``Too many requests,
  please try again later.`` with ``Retry-After`` (:class:`TooManyRequests`).

A caller is its authenticated user when kproxy knows it (``credentials: impersonate``, or
``forward`` once a filter has identified it), else its network address: ``credentials: proxy``
has one user for every caller (kproxy's own), so there the address is the caller.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kproxy.core.status import StatusError, StatusReason

if TYPE_CHECKING:
    from kproxy.core.chain import Exchange
    from kproxy.core.context import FilterContext

__all__ = ["FairLimits", "FairPool", "RetryAfter", "TooManyRequests", "flow_of"]

#: ``priority-and-fairness.go`` ``tooManyRequests``: the text of APF's 429.
TOO_MANY_MESSAGE = "Too many requests, please try again later."


class TooManyRequests(StatusError):
    """APF's rejection exactly as the apiserver writes it: Go's ``http.Error`` (plain text, the
    message and a newline, ``X-Content-Type-Options: nosniff``) with ``Retry-After``, under
    ``WithCacheControl`` (``Cache-Control: no-cache, private``). Not a Status object: the apiserver
    answers APF rejections before any serializer is involved
    (``staging/src/k8s.io/apiserver/pkg/server/filters/priority-and-fairness.go``,
    ``tooManyRequests``); client-go retries a 429 after its ``Retry-After`` whatever the body."""

    #: Read by ``Reply.from_status``: written as is, never negotiated.
    plain_text = True

    def __init__(self, retry_after: int) -> None:
        super().__init__(429, StatusReason.TOO_MANY_REQUESTS, TOO_MANY_MESSAGE, None, retry_after)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.retry_after,))

    def body(self, pretty: bool = False) -> bytes:
        return (self.message + "\n").encode()

    def headers(self) -> dict[str, str]:
        return {
            "Cache-Control": "no-cache, private",
            "Content-Type": "text/plain; charset=utf-8",
            "Retry-After": str(self.retry_after or 1),
            "X-Content-Type-Options": "nosniff",
        }


class RetryAfter:
    """The ``Retry-After`` APF suggests, as ``droppedRequestsTracker`` computes it
    (``staging/src/k8s.io/apiserver/pkg/util/flowcontrol/dropped_requests_tracker.go``): 1 s, doubled
    (up to 32) when at least 3 x that many requests were refused within the last that-many
    seconds, lowered by one when fewer than that many were."""

    MAX = 32

    def __init__(self, clock: Any = time.time) -> None:
        self._clock = clock
        self._history: deque[tuple[int, int]] = deque()
        self._current_unix = 0
        self._current_count = 0
        self._retry_after = 1
        self._updated_unix = 0

    @property
    def value(self) -> int:
        return self._retry_after

    def record(self) -> int:
        """Note one refusal; the ``Retry-After`` to send with it."""
        now = int(self._clock())
        if now == self._current_unix:
            self._current_count += 1
            return self._retry_after
        self._history.append((self._current_unix, self._current_count))
        keep = min(2 * self._retry_after, self.MAX)
        while self._history and now - self._history[0][0] > keep:
            self._history.popleft()
        self._current_unix, self._current_count = now, 1
        retry = self._retry_after
        dropped = sum(n for at, n in self._history if now - at <= retry and at < now)
        if now - self._updated_unix >= retry and dropped >= 3 * retry:
            self._retry_after = min(retry * 2, self.MAX)
            self._updated_unix = now
        elif dropped < retry and retry > 1:
            self._retry_after = retry - 1
        return self._retry_after


@dataclass(frozen=True, slots=True)
class FairLimits:
    #: Jobs running at once, all callers together.
    workers: int = 2
    #: Jobs one caller runs at once (at most ``workers``).
    per_caller: int = 1
    #: Jobs one caller may have waiting; beyond it, a 429.
    queue_per_caller: int = 8
    #: Jobs waiting, all callers together; beyond it, a 429.
    queue_total: int = 128
    #: Longest a job waits for a worker before its 429 (seconds).
    queue_wait: float = 15.0
    #: Bodies of this size and more are large: together they take at most ``workers - 1`` workers.
    large_bytes: int = 256 * 1024


class _Flow:
    __slots__ = ("running", "waiting")

    def __init__(self) -> None:
        self.running = 0
        #: Each waiting job: whether it is large, and the future that starts it.
        self.waiting: deque[tuple[bool, asyncio.Future[None]]] = deque()


class FairPool:
    """Per-caller queues in front of ``limits.workers`` slots, dispatched round robin (see the
    module docstring). :meth:`acquire` waits for a slot or raises :class:`TooManyRequests`;
    :meth:`release` gives it back."""

    def __init__(self, limits: FairLimits | None = None) -> None:
        self.limits = limits or FairLimits()
        self._flows: dict[str, _Flow] = {}
        #: Flows with jobs waiting, in the order they get their next turn.
        self._ring: OrderedDict[str, None] = OrderedDict()
        self.running = 0
        self.running_large = 0
        self.waiting = 0
        self.retry_after = RetryAfter()
        self.rejected = 0

    def _flow(self, key: str) -> _Flow:
        flow = self._flows.get(key)
        if flow is None:
            flow = self._flows[key] = _Flow()
        return flow

    def _forget(self, key: str, flow: _Flow) -> None:
        if flow.running == 0 and not flow.waiting:
            self._flows.pop(key, None)
            self._ring.pop(key, None)

    def _reject(self) -> TooManyRequests:
        self.rejected += 1
        return TooManyRequests(self.retry_after.record())

    def _free_for(self, flow: _Flow, large: bool) -> bool:
        lim = self.limits
        workers = max(lim.workers, 1)
        if self.running >= workers or flow.running >= max(min(lim.per_caller, workers), 1):
            return False
        return not large or self.running_large < max(workers - 1, 1)

    def _start(self, flow: _Flow, large: bool) -> None:
        flow.running += 1
        self.running += 1
        self.running_large += large

    async def acquire(self, key: str, size: int = 0) -> bool:
        """Wait for a worker for a job on a body of ``size`` bytes; returns whether it counts as
        large (pass it back to :meth:`release`)."""
        lim = self.limits
        large = size >= lim.large_bytes
        flow = self._flow(key)
        if not flow.waiting and self._free_for(flow, large):
            self._start(flow, large)
            return large
        if len(flow.waiting) >= lim.queue_per_caller or self.waiting >= lim.queue_total:
            self._forget(key, flow)
            raise self._reject()
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (large, turn)
        flow.waiting.append(entry)
        self.waiting += 1
        self._ring.setdefault(key, None)
        try:
            await asyncio.wait_for(asyncio.shield(turn), lim.queue_wait if lim.queue_wait > 0 else None)
        except BaseException as err:
            if turn.done() and not turn.cancelled():
                self.release(key, large)  # granted as it timed out or was cancelled: hand the slot on
            else:
                turn.cancel()
                flow.waiting.remove(entry)
                self.waiting -= 1
                if not flow.waiting:
                    self._ring.pop(key, None)
                self._forget(key, flow)
                self._dispatch()  # a large job leaving may let a small one behind it in
            if isinstance(err, TimeoutError):
                raise self._reject() from None
            raise
        return large

    def release(self, key: str, large: bool = False) -> None:
        flow = self._flows[key]
        flow.running -= 1
        self.running -= 1
        self.running_large -= large
        self._forget(key, flow)
        self._dispatch()

    def _dispatch(self) -> None:
        """Give free slots to waiting jobs, one per caller per round, in ring order (a caller
        whose next job cannot start yet keeps its place)."""
        while self.running < max(self.limits.workers, 1) and self._ring:
            for key in self._ring:
                flow = self._flows[key]
                if self._free_for(flow, flow.waiting[0][0]):
                    break
            else:
                return  # every caller with work waiting is at its own limit, or only large jobs wait
            large, turn = flow.waiting.popleft()
            self.waiting -= 1
            self._ring.pop(key)
            if flow.waiting:
                self._ring[key] = None  # its next job waits for everyone else's turn
            self._start(flow, large)
            turn.set_result(None)


def flow_of(ctx: FilterContext | None, ex: Exchange | None) -> str:
    """The caller ``ex`` is charged to: its user when known and not kproxy's own (``credentials:
    proxy``), else its network address."""
    if ex is None:
        return ""
    if ex.identity is not None and (ctx is None or ctx.credentials != "proxy"):
        return "user:" + ex.identity.user
    return "addr:" + str(ex.client or "")
