"""Fair TokenReviews: review capacity shared between client addresses, as the apiserver's priority
and fairness shares its seats between flows.

kproxy sends a caller's token to a ``TokenReview`` with its own credentials, so the apiserver's
priority and fairness (staging/src/k8s.io/apiserver/pkg/server/filters/priority-and-fairness.go)
charges every review to kproxy's flow, not to the caller. A caller spraying distinct random tokens
would make kproxy send one review per token: kproxy's flow would fill its queues and be rejected
with 429, and then no caller's identity could be learned at all. The cache and the sharing of
concurrent reviews of one token do not help against tokens that are all different.

So kproxy sends at most ``token_reviews.max_in_flight`` reviews at once, and shares them out as
APF shares seats (staging/src/k8s.io/apiserver/pkg/util/flowcontrol/fairqueuing/queueset), with
:class:`kproxy.core.fairness.FairPool`; the flow is the client address (``request.remote``: the
TCP peer), since the caller's identity is what the review is to learn:

* each address has its own FIFO queue of reviews; a freed slot goes to the next address in
  round-robin order that has a review waiting, so an address with many reviews waiting takes one
  turn per round, as an address with one does: a sprayer from any number of addresses delays a
  new caller by at most one review per spraying address, never refuses it;
* one address runs at most ``max_in_flight_per_client`` reviews at once;
* an address has at most ``QUEUE_PER_CLIENT`` reviews waiting, and a review waits at most
  ``QUEUE_WAIT`` seconds (APF's default: a quarter of the request timeout); past either, that
  caller, and only it, gets APF's answer: ``429 Too many requests, please try again later.`` with
  ``Retry-After`` (:class:`kproxy.core.fairness.TooManyRequests`), which client-go, kubectl and
  the Python client wait on and retry. ``QUEUE_TOTAL`` bounds the reviews waiting from every
  address together (the memory a sprayer with very many addresses can hold), far above what the
  connections kproxy keeps reach.

Only reviews wait: a token already reviewed (cached) or under review for another request costs
nothing. Callers behind one address (a NAT, a load balancer that does not keep the client's
address) share its queue and its share.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge

from kproxy.core.context import FilterContext, ServiceKey
from kproxy.core.fairness import FairLimits, FairPool, TooManyRequests

__all__ = ["QUEUE_PER_CLIENT", "QUEUE_TOTAL", "QUEUE_WAIT", "SERVICE_KEY", "ReviewLimiter", "review_limiter"]

SERVICE_KEY: ServiceKey[ReviewLimiter] = ServiceKey(f"{__name__}.ReviewLimiter")
#: Reviews one client address may have waiting; beyond it, its 429.
QUEUE_PER_CLIENT = 16
#: Reviews waiting from all addresses together; beyond it, a 429.
QUEUE_TOTAL = 8192
#: Longest a review waits for a slot before its caller's 429 (seconds; APF's default, 60 s / 4).
QUEUE_WAIT = 15.0
#: Why a caller was refused: its own queue was full, every queue together was, or it waited too long.
BOUNDS = ("client", "total", "wait")


class ReviewLimiter:
    """Per-address queues in front of ``max_in_flight`` review slots (module docstring)."""

    def __init__(
        self,
        max_in_flight: int = 32,
        max_in_flight_per_client: int = 4,
        on_refused: Callable[[str], None] | None = None,
        *,
        queue_per_client: int = QUEUE_PER_CLIENT,
        queue_total: int = QUEUE_TOTAL,
        queue_wait: float = QUEUE_WAIT,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.max_in_flight_per_client = max_in_flight_per_client
        self.pool = FairPool(
            FairLimits(
                workers=max_in_flight,
                per_caller=min(max_in_flight_per_client, max_in_flight),
                queue_per_caller=queue_per_client,
                queue_total=queue_total,
                queue_wait=queue_wait,
                large_bytes=1 << 62,  # every review weighs the same
            )
        )
        self._on_refused = on_refused
        #: Reviews waiting, per client address (the pool's own count, read before it refuses).
        self._waiting: dict[str, int] = {}

    @property
    def in_flight(self) -> int:
        return self.pool.running

    @property
    def waiting(self) -> int:
        return self.pool.waiting

    async def acquire(self, client: str) -> Callable[[], None]:
        """Wait for a slot for one review on behalf of ``client``; return its release (call it once).

        Raises :class:`TooManyRequests` when the client's own queue is full (or every queue
        together is), or it waited ``queue_wait`` seconds."""
        limits = self.pool.limits
        own_full = self._waiting.get(client, 0) >= limits.queue_per_caller
        all_full = self.pool.waiting >= limits.queue_total
        self._waiting[client] = self._waiting.get(client, 0) + 1
        try:
            await self.pool.acquire(client)
        except TooManyRequests:
            if self._on_refused is not None:
                self._on_refused("client" if own_full else "total" if all_full else "wait")
            raise
        finally:
            left = self._waiting[client] - 1
            if left:
                self._waiting[client] = left
            else:
                del self._waiting[client]
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self.pool.release(client)

        return release


def review_limiter(ctx: FilterContext, max_in_flight: int = 32, max_in_flight_per_client: int = 4) -> ReviewLimiter:
    """The one limiter of this kproxy (kept as a ``ctx`` service; the server puts the configured
    one there before anything authenticates), with its metrics."""

    def make() -> ReviewLimiter:
        refused = Counter(
            "kproxy_token_reviews_refused_total",
            "Callers answered 429 instead of a TokenReview of their token, by the bound reached "
            "(client: its own queue was full; total: every queue together was; wait: it waited too long).",
            ["bound"],
            registry=ctx.registry,
        )
        for bound in BOUNDS:
            refused.labels(bound)
        limiter = ReviewLimiter(max_in_flight, max_in_flight_per_client, lambda b: refused.labels(b).inc())
        in_flight = Gauge(
            "kproxy_token_reviews_in_flight",
            "TokenReviews sent and not yet answered.",
            registry=ctx.registry,
        )
        in_flight.set_function(lambda: limiter.in_flight)
        waiting = Gauge(
            "kproxy_token_reviews_waiting",
            "TokenReviews waiting for their client address's turn.",
            registry=ctx.registry,
        )
        waiting.set_function(lambda: limiter.waiting)
        return limiter

    return ctx.service(SERVICE_KEY, make)
