"""The round trip to the upstream as kproxy observes it, for decisions that depend on the link.

A body the apiserver gzips costs its CPU and a little latency, and saves the transfer of most
of its bytes: across a WAN link (a laptop's kproxy in front of a remote cluster) that saving
dominates, next to the apiserver (loopback, the same node or data centre) it does not
(``kproxy.filters.compression``'s ``upstream_gzip: auto``).

The measure is taken where kproxy sees the upstream, at the HTTP level: the time from sending a
request to reading its response head (``kproxy.server.upstream``), for callers' requests and
kproxy's own. The smallest such time over the last one to two minutes is the round trip plus
the apiserver's quickest answer (a ``/version``, a SelfSubjectAccessReview, a watch's head: well
under a millisecond of its work). Kernel figures (TCP_INFO, the connect time) would measure only
the first hop, which on a laptop is often a local tunnel (``ssh -L``, a cloud provider's
IAP or a corporate proxy) in front of the WAN.

One :class:`UpstreamLink` per process, shared through ``FilterContext.services`` under
:data:`UPSTREAM_LINK`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from kproxy.core.context import ServiceKey

#: ``FilterContext`` service key of the process's one :class:`UpstreamLink`.
UPSTREAM_LINK: ServiceKey[UpstreamLink] = ServiceKey(f"{__name__}.UpstreamLink")

#: Samples are kept per window of this many seconds; the estimate is the minimum of the current
#: window and the one before, so it follows a link that changed (a laptop moving from the office
#: to a train) within two windows, and never rests on one sample taken a long time ago.
WINDOW = 60.0
#: Fewer samples than this in the two windows give no estimate: a first request's time includes
#: dialling (TCP, TLS) and whatever was cold on either side, and may be the only one for a while.
MIN_SAMPLES = 3


class UpstreamLink:
    """The smallest request-to-response-head time seen recently (seconds); None before
    :data:`MIN_SAMPLES` of them."""

    __slots__ = ("_clock", "_current", "_current_n", "_previous", "_previous_n", "_started")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._current = self._previous = math.inf
        self._current_n = self._previous_n = 0
        self._started = clock()

    def _roll(self, now: float) -> None:
        elapsed = now - self._started
        if elapsed < WINDOW:
            return
        # One window passed: the current becomes the previous; more than one: both are stale.
        if elapsed < 2 * WINDOW:
            self._previous, self._previous_n = self._current, self._current_n
        else:
            self._previous, self._previous_n = math.inf, 0
        self._current, self._current_n = math.inf, 0
        self._started = now

    def observe(self, seconds: float) -> None:
        """One request's time from being sent to its response head."""
        self._roll(self._clock())
        self._current_n += 1
        if seconds < self._current:
            self._current = seconds

    @property
    def rtt(self) -> float | None:
        """The estimate in seconds; None with fewer than MIN_SAMPLES in the last two windows."""
        self._roll(self._clock())
        if self._current_n + self._previous_n < MIN_SAMPLES:
            return None
        return min(self._current, self._previous)
