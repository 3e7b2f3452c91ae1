"""Who may read the admin listener's ``/metrics``: as for the apiserver's own ``/metrics``.

kproxy's metrics say what it caches (object counts per resource, secrets included), when objects
change, and the names of policy rules; any pod that can reach the admin port could read them.
So, unless the admin listener is on loopback (``metrics_access``, kproxy.config), ``/metrics``
asks what the apiserver asks of a scrape of its own ``/metrics``
(staging/src/k8s.io/apiserver/pkg/endpoints/filters/authentication.go, then authorization.go;
controller-runtime's ``filters.WithAuthenticationAndAuthorization`` and kube-rbac-proxy do the
same): the caller's bearer token goes to a ``TokenReview`` (the apiserver's authenticators, in
its order: ``kproxy.identity.authn``), then a ``SubjectAccessReview`` asks whether that user may
``get`` the non-resource URL ``/metrics``. Both are sent with kproxy's own credentials and cached
briefly (tokens 10 s, decisions 10 s allowed, 5 s denied). The answers are the apiserver's: a
token it rejects gets ``401 Unauthorized``; a caller without a token is ``system:anonymous``; a
caller not allowed gets ``403 Forbidden`` (``forbidden: User "..." cannot get path "/metrics"``).

Prometheus scrapes with its service account's token, which the common ClusterRole for scraping
(``nonResourceURLs: ["/metrics"], verbs: ["get"]``) already allows (docs/monitoring.md).
The probes (``/healthz``, ``/livez``, ``/readyz``) stay open, as the apiserver's are (its
``system:public-info-viewer`` role): they say only whether kproxy is up and ready.
"""

from __future__ import annotations

from aiohttp import web

from kproxy.core.context import FilterContext
from kproxy.core.requestinfo import parse_request_info
from kproxy.core.status import StatusError, forbidden_for_request, internal_error
from kproxy.identity.access import AccessReviewer, AccessReviewError, api_review
from kproxy.identity.authn import TokenReviewError, authenticator

__all__ = ["MetricsAuthorizer"]

_METRICS = parse_request_info("GET", "/metrics")


class MetricsAuthorizer:
    """Decides whether a scrape of ``/metrics`` may be answered (module docstring)."""

    def __init__(self, ctx: FilterContext) -> None:
        self.ctx = ctx
        self.reviewer = AccessReviewer(api_review(ctx), max_entries=1024)

    async def refusal(self, request: web.BaseRequest) -> web.Response | None:
        """None if the caller may read ``/metrics``; else the apiserver's answer to give it."""
        try:
            identity, _ = await authenticator(self.ctx).authenticate_request(
                request.headers, str(request.remote or "")
            )
            decision = await self.reviewer.check(identity, _METRICS)
        except StatusError as err:
            return _reply(err)
        except (TokenReviewError, AccessReviewError) as err:
            return _reply(internal_error(f"kproxy could not authorize the scrape: {err}"))
        if decision.allowed:
            return None
        return _reply(forbidden_for_request(_METRICS, identity.user, decision.reason))


def _reply(err: StatusError) -> web.Response:
    return web.Response(status=err.http_status, body=err.body(), headers=err.headers())
