"""Fair TokenReviews: a bound on the reviews kproxy sends at once, per client address and in total.

kproxy sends a caller's token to a ``TokenReview`` with its own credentials, so the apiserver's
priority and fairness (staging/src/k8s.io/apiserver/pkg/server/filters/priority-and-fairness.go)
charges every review to kproxy's flow, not to the caller. A caller spraying distinct random tokens
would make kproxy send one review per token: kproxy's flow would fill its queues and be rejected
with 429, and then no caller's identity could be learned at all. The cache and the sharing of
concurrent reviews of one token do not help against tokens that are all different.

So reviews are bounded the way the apiserver bounds requests, by concurrency: at most
``token_reviews.max_in_flight`` at once in total, at most ``max_in_flight_per_client`` for one
client address (``request.remote``: the TCP peer). A review beyond either bound is not sent:
the request is answered ``429 Too Many Requests`` with ``Retry-After: 1``, which client-go,
kubectl and the Python client wait on and retry, as for the apiserver's own rejection
(``tooManyRequests``: the same message, in a Status). Only reviews are bounded: a token already
reviewed (cached) or under review for another request costs nothing and is never refused, so a
sprayer is throttled while known callers, and new callers from other addresses, proceed.

Callers behind one address (a NAT, a load balancer that does not keep the client's address)
share its bound; the total bound still keeps kproxy's flow at the apiserver within its share.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge

from kproxy.core.context import FilterContext
from kproxy.core.status import StatusError, too_many_requests

__all__ = ["SERVICE_KEY", "ReviewLimiter", "review_limiter"]

SERVICE_KEY = "kproxy.identity.reviewlimit.ReviewLimiter"
#: The apiserver's rejection text (priority-and-fairness.go, maxinflight.go ``tooManyRequests``).
MESSAGE = "Too many requests, please try again later."
RETRY_AFTER_SECONDS = 1


class ReviewLimiter:
    """Counts the TokenReviews in flight, per client address and in total (module docstring)."""

    def __init__(
        self,
        max_in_flight: int = 32,
        max_in_flight_per_client: int = 4,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.max_in_flight_per_client = max_in_flight_per_client
        self._on_refused = on_refused
        self._by_client: dict[str, int] = {}
        self.in_flight = 0

    def acquire(self, client: str) -> Callable[[], None]:
        """Take a slot for one review on behalf of ``client``; return its release (call it once).

        Raises the 429 ``StatusError`` when the client's or the total bound is reached."""
        held = self._by_client.get(client, 0)
        if held >= self.max_in_flight_per_client:
            raise self._refuse("client")
        if self.in_flight >= self.max_in_flight:
            raise self._refuse("total")
        self._by_client[client] = held + 1
        self.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self.in_flight -= 1
            left = self._by_client[client] - 1
            if left:
                self._by_client[client] = left
            else:
                del self._by_client[client]

        return release

    def _refuse(self, bound: str) -> StatusError:
        if self._on_refused is not None:
            self._on_refused(bound)
        return too_many_requests(MESSAGE, RETRY_AFTER_SECONDS)


def review_limiter(ctx: FilterContext, max_in_flight: int = 32, max_in_flight_per_client: int = 4) -> ReviewLimiter:
    """The one limiter of this kproxy (kept in ``ctx.services``; the server puts the configured
    one there before anything authenticates), with its metrics."""

    def make() -> ReviewLimiter:
        refused = Counter(
            "kproxy_token_reviews_refused",
            "Callers answered 429 instead of a TokenReview of their token, by the bound reached (client, total).",
            ["bound"],
            registry=ctx.registry,
        )
        for bound in ("client", "total"):
            refused.labels(bound)
        limiter = ReviewLimiter(max_in_flight, max_in_flight_per_client, lambda b: refused.labels(b).inc())
        in_flight = Gauge(
            "kproxy_token_reviews_in_flight",
            "TokenReviews sent and not yet answered.",
            registry=ctx.registry,
        )
        in_flight.set_function(lambda: limiter.in_flight)
        return limiter

    return ctx.shared(SERVICE_KEY, make)
