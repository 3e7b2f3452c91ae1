"""The TokenReview bound (kproxy/identity/reviewlimit.py): per client address and in total."""

from __future__ import annotations

import pytest

from kproxy.core.status import StatusError
from kproxy.identity.reviewlimit import ReviewLimiter


def test_per_client_and_total_bounds() -> None:
    refused: list[str] = []
    limiter = ReviewLimiter(max_in_flight=3, max_in_flight_per_client=2, on_refused=refused.append)
    a1, a2 = limiter.acquire("10.0.0.1"), limiter.acquire("10.0.0.1")
    with pytest.raises(StatusError) as err:
        limiter.acquire("10.0.0.1")
    assert (err.value.code, err.value.reason, err.value.message) == (
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
    )
    assert err.value.headers()["Retry-After"] == "1"
    b1 = limiter.acquire("10.0.0.2")  # another client still gets a slot
    with pytest.raises(StatusError):
        limiter.acquire("10.0.0.3")  # the total is reached
    assert refused == ["client", "total"]
    a1()
    a1()  # a second release changes nothing
    assert limiter.in_flight == 2
    limiter.acquire("10.0.0.3")()
    a2()
    b1()
    assert limiter.in_flight == 0 and not limiter._by_client
