"""The resources the apiserver serves, from its discovery: the bounded set of ``resource`` labels.

A request's resource is whatever its path says; labelling metrics with it as it is lets any caller
add a series per random name (8,000 such requests made /metrics 21 MB and each scrape block the
loop for seconds). The apiserver counts requests only on the routes it installed, one per
resource it serves (staging/src/k8s.io/apiserver/pkg/endpoints/metrics/metrics.go
``InstrumentRouteFunc``, called by endpoints/installer.go). kproxy does the same from discovery:
a resource the apiserver serves keeps its name, any other is ``other``.

Discovery is the process's one reader (``kproxy.core.discovery``), read with kproxy's own
credentials when it starts, and again when a request names a resource not known yet (a new
custom resource), at most once per ``REFRESH_INTERVAL``: random names cost at most that one read
per interval. The watch cache's rediscovery refreshes the same labels.
"""

from __future__ import annotations

from kproxy.core.discovery import Discovery

#: The label of any resource the apiserver does not serve (or not known yet).
OTHER = "other"
#: At most one discovery refresh per this many seconds, whatever requests arrive.
REFRESH_INTERVAL = 30.0


class ServedResources:
    """The set of ``resource`` labels, as discovery last read it (empty until it was first read)."""

    def __init__(self) -> None:
        self._discovery: Discovery | None = None
        self._known: frozenset[str] = frozenset()

    @property
    def known(self) -> frozenset[str]:
        """``resource[.group]`` and ``resource/subresource[.group]`` of what the apiserver serves."""
        return self._discovery.labels if self._discovery is not None else self._known

    @known.setter
    def known(self, labels: frozenset[str]) -> None:  # before start (tests)
        self._known = labels

    def label(self, resource: str) -> str:
        """``resource`` if the apiserver serves it (or ``""``, a non-resource request), else
        ``other`` (and discovery is read again if it was not read for a while)."""
        if not resource or resource in self.known:
            return resource
        if self._discovery is not None:
            self._discovery.read_soon(REFRESH_INTERVAL)
        return OTHER

    def start(self, discovery: Discovery) -> None:
        """Follow ``discovery``: read now (in the background, retried until it succeeds) and on misses."""
        self._discovery = discovery
        discovery.keep_reading(REFRESH_INTERVAL)

    async def stop(self) -> None:
        self._discovery = None
