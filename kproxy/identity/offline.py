"""Authorization of a cached read while the apiserver cannot be asked (the watch cache's outage
serving): only from decisions the apiserver gave recently, never a guess.

A caller is allowed offline when, within the bound the operator configured (``within``):

* its identity is known: the identity ``credentials: impersonate`` established before the chain
  (a client certificate needs no apiserver), or in ``credentials: forward`` an accepted
  ``TokenReview`` of the request's first bearer token (``Authenticator.known_identity``; a later
  rejection of the token ends it); a request without a token is the anonymous user, as the
  apiserver would make it;
* and a ``SubjectAccessReview`` with exactly the attributes of this request allowed it
  (``AccessReviewer.allowed_within``; a later denial of the same attributes ends it).

Anything else (a token never reviewed, a request never allowed, a decision older than the bound)
is None: the caller gets the answer it would get without the cache (the outage answer).
"""

from __future__ import annotations

from kproxy.core.chain import Exchange, Identity
from kproxy.core.context import FilterContext
from kproxy.core.status import StatusError
from kproxy.identity.access import AccessReviewer
from kproxy.identity.authn import ANONYMOUS, authenticator, caller_tokens, reviewable
from kproxy.identity.impersonation_headers import impersonated

__all__ = ["allowed_offline", "remember_for"]


def remember_for(ctx: FilterContext, reviewer: AccessReviewer, seconds: float) -> None:
    """Keep accepted token reviews and allowed access reviews for ``seconds`` (at least: the
    longest any configuration asked for is kept)."""
    auth = authenticator(ctx)
    auth.remember = max(auth.remember, seconds)
    reviewer.remember = max(reviewer.remember, seconds)


def known_identity(ctx: FilterContext, ex: Exchange, within: float) -> Identity | None:
    """The identity the apiserver gave this request's caller within ``within`` seconds, or None."""
    if ex.identity is not None:
        return ex.identity
    if ctx.credentials != "forward":
        return None
    tokens, failed = caller_tokens(ex.headers)
    if tokens:
        token, _ = tokens[0]
        if not reviewable(token):
            return None
        identity = authenticator(ctx).known_identity(token, within)
        if identity is None:
            return None  # never reviewed, reviewed too long ago, or rejected
    elif failed or not ctx.anonymous_auth:
        return None  # the apiserver's 401
    else:
        identity = ANONYMOUS
    try:
        return impersonated(ex.headers, identity)
    except StatusError:
        return None  # malformed impersonation: the apiserver's own answer, never the cache's


def allowed_offline(ctx: FilterContext, reviewer: AccessReviewer, ex: Exchange, within: float) -> float | None:
    """Seconds since the access review that allowed ``ex`` for its caller was sent, when both the
    caller's identity and that decision are known from the last ``within`` seconds; else None."""
    identity = known_identity(ctx, ex, within)
    if identity is None:
        return None
    info = ex.info
    return reviewer.allowed_within(
        identity, info, within, label_selector=info.label_selector, field_selector=info.field_selector
    )
