"""Would the apiserver serve this caller? SubjectAccessReview decisions, cached.

Anything kproxy answers from its own memory (the watch cache's LIST and GET, the validation
filter's local Strict errors) skips the apiserver's authorization filter, so kproxy must ask the
question that filter asks, for the same caller and the same request attributes, before it answers.
It asks the apiserver itself with a ``SubjectAccessReview`` made with kproxy's own credentials
(which need ``create`` on ``subjectaccessreviews``): the review runs the apiserver's whole
authorizer chain (``system:masters``, Node, RBAC, webhooks), so the answer is the apiserver's own.

The review carries what ``GetAuthorizerAttributes`` (staging/src/k8s.io/apiserver/pkg/endpoints/
filters/authorization.go) gives the authorizer: user, groups, uid, extra; verb, API group, version,
resource, subresource, namespace, name; and, as ``AuthorizeWithSelectors`` does for
``list``/``watch``/``deletecollection``, the raw label and field selectors (the SAR endpoint parses
``rawSelector`` exactly as the filter parses the query, pkg/registry/authorization/util/helpers.go).
A decision is reused for exactly those attributes, never for a neighbour.

Decisions are cached with separate lifetimes: an allow for ``allow_ttl`` seconds (a revoked
permission keeps working through the cache for at most that long), a denial for ``deny_ttl``
seconds (a new grant takes at most that long to be seen). The lifetime counts from when the review
was sent, so it never outlasts the state the apiserver saw. The cache is an LRU bounded by
``max_entries``; concurrent checks of the same attributes share one review.

What is never cached and never allows:

* the apiserver could not be asked or answered something other than a SubjectAccessReview
  (:class:`AccessReviewError`);
* the authorizer had no unconditional answer (:class:`AccessUndecided`): a ``conditionalDecision``
  (conditional authorization evaluates conditions against the object, which only the apiserver
  can do), or a non-allow with an ``evaluationError`` -- for the real request the apiserver's
  authorization filter then answers a plain-text 500 rather than a 403. In both cases the exact
  answer is the apiserver's own, so a filter that can pass the request through should.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from kproxy.core.chain import Exchange, Identity
from kproxy.core.context import FilterContext, ServiceKey
from kproxy.core.requestinfo import RequestInfo
from kproxy.core.status import StatusError, forbidden_for_request, internal_error
from kproxy.identity.authn import authenticator
from kproxy.identity.ttlcache import TTLCache

__all__ = [
    "SUBJECT_ACCESS_REVIEWS",
    "AccessReviewError",
    "AccessReviewer",
    "AccessUndecided",
    "Decision",
    "OnDecision",
    "Review",
    "UndecidedError",
    "access_reviewer",
    "api_review",
    "authorize",
    "review_body",
]

SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

#: review(body) -> (HTTP status, decoded answer): a POST of ``body`` to subjectaccessreviews.
Review = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]

#: on_decision(decision, hit) after every check: ``decision`` is ``allowed``, ``denied`` or
#: ``error``; ``hit`` is True when the check sent no review of its own (cached, or shared with a
#: concurrent identical check).
OnDecision = Callable[[str, bool], None]

# What BuildEvaluationError adds for a selector the SAR endpoint could not parse. The apiserver's
# own authorization filter keeps such parse errors out of the authorizer's error (RBAC ignores
# selectors), so they say nothing about what the real request would get.
_SELECTOR_NOTES = frozenset(
    f"spec.resourceAttributes.{kind}Selector {how} due to parse error"
    for kind in ("field", "label")
    for how in ("ignored", "partially ignored")
)


@dataclass(frozen=True, slots=True)
class Decision:
    """The authorizer's answer for one check.

    ``reason`` is the authorizer's reason (``status.reason`` of the review; RBAC gives ``""`` when
    it has no opinion and no rule errors), appended to the apiserver's 403 message when non-empty.
    ``cached`` says the check sent no review of its own.
    """

    allowed: bool
    reason: str
    cached: bool


class AccessReviewError(Exception):
    """No reusable decision: the apiserver could not be asked, or answered unexpectedly."""


class AccessUndecided(AccessReviewError):
    """The authorizer gave no unconditional allow/deny (conditional decision, evaluation error)."""


class UndecidedError(StatusError):
    """Raised by :func:`authorize` for :class:`AccessUndecided`: a 500 Status if it reaches the caller.

    A filter that can pass the request through to the upstream should catch it and do so: the
    apiserver then authorizes the request itself and its answer reaches the caller word for word.
    """

    __slots__ = ()


Key = tuple[Any, ...]


class AccessReviewer:
    """SubjectAccessReview decisions for callers, cached (see the module docstring)."""

    def __init__(
        self,
        review: Review,
        *,
        allow_ttl: float = 10.0,
        deny_ttl: float = 5.0,
        max_entries: int = 10000,
        clock: Callable[[], float] = time.monotonic,
        on_decision: OnDecision | None = None,
    ) -> None:
        self._review = review
        self.allow_ttl = allow_ttl
        self.deny_ttl = deny_ttl
        self._clock = clock
        self._on_decision = on_decision
        self._cache: TTLCache[Key, tuple[bool, str]] = TTLCache(max_entries)
        # Allows remembered for ``remember`` seconds after their review was sent (0: none), for
        # reads served while the apiserver cannot be asked (``kproxy.identity.offline``); a later
        # denial of the same attributes removes one.
        self.remember = 0.0
        self._allowed_at: TTLCache[Key, float] = TTLCache(max_entries)
        self._inflight: dict[Key, asyncio.Task[tuple[bool, str]]] = {}
        #: Reviews sent (for tests and debugging).
        self.reviews = 0

    @property
    def max_entries(self) -> int:
        return self._cache.max_entries

    def __len__(self) -> int:
        return len(self._cache)

    async def check(
        self,
        identity: Identity,
        info: RequestInfo,
        *,
        verb: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> Decision:
        """May ``identity`` make the request ``info`` describes (with ``verb`` instead of its own)?

        Raises :class:`AccessReviewError` (or :class:`AccessUndecided`) when there is no decision.
        """
        v = verb if verb is not None else info.verb
        key = _key(identity, info, v, label_selector, field_selector)
        now = self._clock()
        found, hit = self._cache.get(key, now)
        if found:
            assert hit is not None
            self._record(hit[0], True)
            return Decision(hit[0], hit[1], True)
        task = self._inflight.get(key)
        shared = task is not None
        if task is None:
            body = review_body(identity, info, verb=v, label_selector=label_selector, field_selector=field_selector)
            task = asyncio.ensure_future(self._review_and_store(key, body))
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._done, key))
        try:
            # Shielded: a caller that goes away does not cancel the review others wait for.
            allowed, reason = await asyncio.shield(task)
        except AccessReviewError:
            if self._on_decision is not None:
                self._on_decision("error", shared)
            raise
        self._record(allowed, shared)
        return Decision(allowed, reason, shared)

    def _record(self, allowed: bool, hit: bool) -> None:
        if self._on_decision is not None:
            self._on_decision("allowed" if allowed else "denied", hit)

    def _done(self, key: Key, task: asyncio.Task[tuple[bool, str]]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" warning when every caller went away

    async def _review_and_store(self, key: Key, body: dict[str, Any]) -> tuple[bool, str]:
        sent = self._clock()
        self.reviews += 1
        try:
            status, answer = await self._review(body)
        except Exception as err:  # OSError, TimeoutError, aiohttp.ClientError: the apiserver was not reached
            raise AccessReviewError(f"SubjectAccessReview failed: {str(err) or type(err).__name__}") from err
        allowed, reason = decision_from_answer(status, answer)
        ttl = self.allow_ttl if allowed else self.deny_ttl
        self._cache.put(key, (allowed, reason), sent + ttl)
        if allowed and self.remember > 0:
            self._allowed_at.put(key, sent, sent + self.remember)
        elif not allowed:
            self._allowed_at.put(key, sent, sent)  # expired at once: a denial ends the last allow
        return allowed, reason

    def allowed_within(
        self,
        identity: Identity,
        info: RequestInfo,
        within: float,
        *,
        verb: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> float | None:
        """Seconds since the review that last allowed exactly these attributes was sent, if it was
        less than ``within`` (and less than ``remember``) seconds ago and no denial came after it;
        else None. Sends nothing."""
        v = verb if verb is not None else info.verb
        key = _key(identity, info, v, label_selector, field_selector)
        now = self._clock()
        found, sent = self._allowed_at.get(key, now)
        if not found or sent is None or now - sent >= within:
            return None
        return now - sent


def review_body(
    identity: Identity,
    info: RequestInfo,
    *,
    verb: str | None = None,
    label_selector: str = "",
    field_selector: str = "",
) -> dict[str, Any]:
    """The SubjectAccessReview that asks what the apiserver's authorization filter asks for ``info``."""
    v = verb if verb is not None else info.verb
    spec: dict[str, Any] = {}
    if info.is_resource_request:
        attrs: dict[str, Any] = {
            k: val
            for k, val in (
                ("namespace", info.namespace),
                ("verb", v),
                ("group", info.api_group),
                ("version", info.api_version),
                ("resource", info.resource),
                ("subresource", info.subresource),
                ("name", info.name),
            )
            if val
        }
        if field_selector:
            attrs["fieldSelector"] = {"rawSelector": field_selector}
        if label_selector:
            attrs["labelSelector"] = {"rawSelector": label_selector}
        spec["resourceAttributes"] = attrs
    else:
        spec["nonResourceAttributes"] = {"path": info.path, "verb": v}
    spec["user"] = identity.user
    spec["groups"] = list(identity.groups)
    if identity.uid:
        spec["uid"] = identity.uid
    if identity.extra:
        spec["extra"] = {k: list(vals) for k, vals in identity.extra.items()}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def _key(identity: Identity, info: RequestInfo, verb: str, label_selector: str, field_selector: str) -> Key:
    """Every attribute the review carries, hashable: two checks share a decision only if they ask the same."""
    extra = tuple(sorted(identity.extra.items())) if identity.extra else ()
    if not info.is_resource_request:
        return (False, identity.user, identity.groups, identity.uid, extra, verb, info.path)
    return (
        True,
        identity.user,
        identity.groups,
        identity.uid,
        extra,
        verb,
        info.api_group,
        info.api_version,
        info.resource,
        info.subresource,
        info.namespace,
        info.name,
        label_selector,
        field_selector,
    )


def decision_from_answer(status: int, answer: Any) -> tuple[bool, str]:
    """(allowed, reason) from the apiserver's answer to a SubjectAccessReview.

    Raises :class:`AccessReviewError` for anything but a SubjectAccessReview with an unconditional
    decision (see the module docstring).
    """
    if status not in (200, 201) or not isinstance(answer, dict):
        raise AccessReviewError(f"SubjectAccessReview answered {status}: {_message(answer)}")
    result = answer.get("status")
    if not isinstance(result, dict):
        raise AccessReviewError(f"SubjectAccessReview answered {status} without a status")
    if result.get("conditionalDecision"):
        raise AccessUndecided("the authorizer's decision is conditional on the object")
    reason = str(result.get("reason") or "")
    if result.get("allowed") is True:
        return True, reason
    errors = [e for e in str(result.get("evaluationError") or "").split("; ") if e and e not in _SELECTOR_NOTES]
    if errors:
        raise AccessUndecided(f"the authorizer failed: {'; '.join(errors)}")
    return False, reason


def _message(answer: Any) -> str:
    if isinstance(answer, dict):
        return str(answer.get("message", answer))
    return str(answer)[:200]


def api_review(ctx: FilterContext) -> Review:
    """A :data:`Review` through ``ctx.api`` (kproxy's own credentials, whatever the mode)."""

    async def review(body: dict[str, Any]) -> tuple[int, Any]:
        return await ctx.api.json("POST", SUBJECT_ACCESS_REVIEWS, body)

    return review


_WATCHCACHE_METRICS: ServiceKey[OnDecision] = ServiceKey(f"{__name__}.watchcache.metrics")


def _watchcache_metrics(ctx: FilterContext) -> OnDecision:
    """The watch cache's authorization counters (registered once per registry), as an ``on_decision``.

    Only :func:`access_reviewer` reports here: other users of :class:`AccessReviewer` (the
    validation filter) pass their own ``on_decision`` or none, so these count cached reads only.
    """

    def make() -> OnDecision:
        decisions = Counter(
            "kproxy_watchcache_authorization_decisions_total",
            "Authorization checks of reads served from the watch cache, by decision (allowed, denied, error).",
            ["decision"],
            registry=ctx.registry,
        )
        cache = Counter(
            "kproxy_watchcache_authorization_cache_total",
            "Authorization checks of cached reads answered without a SubjectAccessReview of their own (hit) "
            "or with one (miss).",
            ["result"],
            registry=ctx.registry,
        )
        for d in ("allowed", "denied", "error"):
            decisions.labels(d)
        for r in ("hit", "miss"):
            cache.labels(r)

        def on_decision(decision: str, hit: bool) -> None:
            decisions.labels(decision).inc()
            cache.labels("hit" if hit else "miss").inc()

        return on_decision

    return ctx.service(_WATCHCACHE_METRICS, make)


def access_reviewer(
    ctx: FilterContext, *, allow_ttl: float = 10.0, deny_ttl: float = 5.0, max_entries: int = 10000
) -> AccessReviewer:
    """The watch cache's reviewer: reviews through ``ctx.api``, counted in the watch cache metrics.

    Shared per process and settings, so a config reload that keeps them keeps the decisions.
    """
    on_decision = _watchcache_metrics(ctx)
    return ctx.service(
        ServiceKey[AccessReviewer](f"{__name__}.reviewer:{allow_ttl}:{deny_ttl}:{max_entries}"),
        lambda: AccessReviewer(
            api_review(ctx),
            allow_ttl=allow_ttl,
            deny_ttl=deny_ttl,
            max_entries=max_entries,
            on_decision=on_decision,
        ),
    )


async def authorize(ctx: FilterContext, reviewer: AccessReviewer, ex: Exchange, *, verb: str | None = None) -> None:
    """Return if the apiserver would authorize ``ex`` (with ``verb`` instead of its own), else raise.

    ``credentials: proxy``: every caller is kproxy itself, nothing to check. Otherwise the caller
    is identified as the apiserver would (``kproxy.identity.authn``: the TokenReview of the bearer token in
    ``forward``, the identity ``impersonate`` already established) and reviewed.

    Raises ``StatusError``: the apiserver's own 401 for a token it rejects; its own 403 (message,
    details and ``nosniff`` as ``responsewriters.Forbidden`` writes them, authorizer reason
    appended) for a denial; :class:`UndecidedError` (500) when the authorizer gave no reusable
    answer; a 500 Status when the apiserver cannot be asked (kproxy never guesses).
    """
    if ctx.credentials == "proxy":
        return
    identity = await authenticator(ctx).identify(ex)
    info = ex.info if verb is None or verb == ex.info.verb else dataclasses.replace(ex.info, verb=verb)
    try:
        decision = await reviewer.check(
            identity, info, label_selector=info.label_selector, field_selector=info.field_selector
        )
    except AccessUndecided as err:
        base = internal_error(f"kproxy cannot authorize this request itself: {err}")
        raise UndecidedError(base.code, base.reason, base.message, base.details) from err
    except AccessReviewError as err:
        raise internal_error(f"kproxy could not authorize the request: {err}") from err
    if not decision.allowed:
        raise forbidden_for_request(info, identity.user, decision.reason)
