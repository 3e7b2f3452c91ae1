"""Reads through an outage: what the cache serves while the upstream cannot be reached.

Off by default. With ``outage.serve``, a cached resource named by ``outage.resources`` whose
upstream is unreachable -- the connection refused, reset or timed out; never an HTTP answer,
whatever its code: an apiserver that answers is asked as always -- serves the reads it can answer
from what it holds: ``resourceVersion=0`` lists and gets, not-older-than reads it has reached, and
consistent reads (which the apiserver cannot confirm: the Warning says so). Each such answer has a
``Warning: 299 - "..."`` header saying how long ago the cache was last confirmed equal to the
apiserver (a live watch feeding it). Past ``max_staleness`` seconds unconfirmed, nothing is served
this way. Callers are authorized offline only from decisions the apiserver gave within
``authorization_ttl`` (``kproxy.identity.offline``); anyone else gets the answer they get today.
Watches served from the cache need nothing here: they stay open and get their bookmarks, and the
reflector resumes the upstream watch from the cache's resource version when it can.
"""

from __future__ import annotations

import asyncio
import math
import time

import aiohttp
from prometheus_client import Gauge
from pydantic import BaseModel, ConfigDict, Field

from kproxy.core.context import FilterContext, ServiceKey
from kproxy.gocompat.strconv import go_quote

from .resource_cache import ResourceCache
from .resources import ResourceNames, ResourceSpec, parse_name

__all__ = ["Outage", "OutageSettings", "unconfirmed_gauge", "unreachable"]


class OutageSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    serve: bool = Field(
        False,
        description="Serve cached reads while the apiserver cannot be reached (refused, reset or timed-out "
        "connections; not its HTTP answers), with a Warning header saying how old the cache may be.",
    )
    resources: ResourceNames = Field(
        default_factory=lambda: ["*"],
        min_length=1,
        description="Which cached resources are served through an outage (names as in `resources`; `*`: all).",
    )
    max_staleness: float = Field(
        3600.0,
        gt=0,
        description="Seconds since the cache was last confirmed equal to the apiserver past which it serves "
        "nothing more through the outage (reads then get the outage answer).",
    )
    authorization_ttl: float = Field(
        300.0,
        gt=0,
        description="Seconds a caller's identity (TokenReview) and access decision (SubjectAccessReview) "
        "are trusted while the apiserver cannot be asked, counted from when the review was sent. A caller "
        "without both within this bound gets the outage answer; a revoked permission keeps reading through "
        "an outage for at most this long.",
    )


def unreachable(err: BaseException | None) -> bool:
    """Whether ``err`` (or what caused it) is the upstream not being reached -- a refused, reset or
    timed-out connection, one closed mid-answer -- rather than an HTTP answer it gave."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(
            err,
            OSError  # ConnectionError (refused, reset, kproxy's own pool's), TimeoutError
            | aiohttp.ClientConnectionError  # server disconnected, connector errors
            | aiohttp.ClientPayloadError  # the answer broke off
            | asyncio.IncompleteReadError,
        ):
            return True
        err = err.__cause__ or err.__context__
        seen += 1
    return False


def _matches(name: str, spec: ResourceSpec) -> bool:
    group, version, resource = parse_name(name)
    if resource == "*":
        return True
    return (
        spec.resource == resource
        and (group is None or group == spec.group)
        and (version is None or version == spec.version)
    )


class Outage:
    """The outage settings made real for one filter."""

    def __init__(self, settings: OutageSettings) -> None:
        self.settings = settings

    def serves(self, rc: ResourceCache) -> bool:
        """Whether ``rc`` is served through an outage at all (configured for it)."""
        return self.settings.serve and any(_matches(n, rc.spec) for n in self.settings.resources)

    @staticmethod
    def down(rc: ResourceCache) -> bool:
        """Whether ``rc``'s upstream watch is down because the upstream cannot be reached."""
        r = rc.reflector
        return not r.live and unreachable(r.last_exception)

    @staticmethod
    def unconfirmed(rc: ResourceCache) -> float:
        """Seconds since ``rc`` was last confirmed equal to the apiserver (inf: never)."""
        confirmed = rc.reflector.confirmed_at
        return max(time.time() - confirmed, 0.0) if confirmed else math.inf

    def within_bound(self, rc: ResourceCache) -> bool:
        return self.unconfirmed(rc) <= self.settings.max_staleness

    def warning(self, rc: ResourceCache, *, consistent: bool) -> str:
        """The ``Warning`` header value for a read served through an outage."""
        age = self.unconfirmed(rc)
        text = "the kube-apiserver is unreachable: served from kproxy's cache, "
        if math.isinf(age):
            text += "not confirmed up to date since kproxy started"
        else:
            text += f"last confirmed up to date {age:.0f}s ago"
        if consistent:
            text += "; this read asked for the latest state, which only the kube-apiserver can confirm"
        return f"299 - {go_quote(text)}"


def unconfirmed_gauge(ctx: FilterContext) -> Gauge:
    """``kproxy_watchcache_unconfirmed_seconds{resource}`` (registered once per registry)."""

    def make() -> Gauge:
        return Gauge(
            "kproxy_watchcache_unconfirmed_seconds",
            "Seconds since the watch cache was last confirmed equal to the apiserver (0 while its upstream "
            "watch is live; grows while it is down or relisting; +Inf before it ever was).",
            ["resource"],
            registry=ctx.registry,
        )

    return ctx.service(_UNCONFIRMED, make)


_UNCONFIRMED: ServiceKey[Gauge] = ServiceKey(f"{__name__}.unconfirmed")
