"""Who is calling: the caller's identity, as the apiserver itself would establish it.

Policy filters (``dryrun``, ``validation``) select rules by user and group, and the
``impersonate`` credentials mode acts on the caller's behalf; both need the identity the
apiserver would give the request, never a guess of kproxy's own. So kproxy asks the apiserver:

* ``credentials: forward`` -- the caller's bearer token goes to a ``TokenReview`` (made with
  kproxy's own credentials, which need ``create`` on ``tokenreviews``). Results are cached by a
  SHA-256 of the token (the token itself is never kept), accepted and rejected tokens in two
  separate bounded caches with their own lifetimes (a caller spraying rejected tokens never
  evicts an accepted one); concurrent requests with the same new token share one review, and
  reviews are shared fairly between client addresses (``kproxy.identity.reviewlimit``).
  A request without a token is the apiserver's anonymous user; an
  invalid token gets the apiserver's own ``401`` (reason ``Unauthorized``, message
  ``Unauthorized``), which is what the apiserver would have answered.
* ``credentials: proxy`` -- every caller acts as kproxy's own credentials, whose identity is
  learned once with a ``SelfSubjectReview``.

Tokens are found exactly as the apiserver's token authenticators find them, and tried in its order
(pkg/kubeapiserver/authenticator/config.go: ``bearertoken`` then the WebSocket protocol
authenticator, in a union that takes the first success; anonymous only when none of them failed):

* ``bearertoken.Authenticator`` (staging/src/k8s.io/apiserver/pkg/authentication/request/bearertoken/
  bearertoken.go): the first ``Authorization`` header, trimmed of Unicode white space, split on
  single spaces, scheme ``bearer`` in any case, the second part the token; an empty token counts
  as none;
* ``websocket.ProtocolAuthenticator`` (.../request/websocket/protocol.go), for WebSocket requests
  only (``wsstream.IsWebSocketRequest``: ``Upgrade`` equal to ``websocket`` under Unicode simple
  case folding, and a ``Connection`` value containing ``upgrade``): a ``Sec-WebSocket-Protocol`` entry
  ``base64url.bearer.authorization.k8s.io.<unpadded base64url token>`` next to at least one other
  protocol. A second such entry, bad base64, a token that is not UTF-8 or no other protocol is a
  failed authentication (``401``), not anonymity. On any other request the header means nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from multidict import CIMultiDict
from prometheus_client import Counter

from kproxy.core.chain import Exchange, Identity
from kproxy.core.context import FilterContext, ServiceKey
from kproxy.core.metricnames import counter
from kproxy.core.status import StatusError, internal_error, unauthorized
from kproxy.gocompat.strings import equal_fold, raw_url_decode, to_lower, trim_space
from kproxy.gocompat.utf8 import replaced
from kproxy.identity.impersonation_headers import impersonated
from kproxy.identity.reviewlimit import review_limiter
from kproxy.identity.ttlcache import TTLCache

__all__ = [
    "ANONYMOUS",
    "SERVICE_KEY",
    "Authenticator",
    "TokenReviewError",
    "authenticator",
    "bearer_token",
    "caller_tokens",
    "header_values",
    "identity_from_user_info",
    "is_upgrade_request",
    "is_websocket_request",
    "protocol_token",
    "reviewable",
    "without_token_protocol",
]

#: The identity the apiserver gives a request that carries no credentials (anonymous auth on).
ANONYMOUS = Identity(user="system:anonymous", groups=("system:unauthenticated",))

_TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
_SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
_WS_TOKEN_PREFIX = "base64url.bearer.authorization.k8s.io."
SERVICE_KEY: ServiceKey[Authenticator] = ServiceKey(f"{__name__}.Authenticator")
_METRICS_KEY: ServiceKey[tuple[Counter, Counter]] = ServiceKey(f"{__name__}.metrics")


class TokenReviewError(Exception):
    """The apiserver could not be asked (network error, non-2xx answer, unexpected body)."""


def caller_tokens(headers: Mapping[str, str]) -> tuple[list[tuple[str, bool]], bool]:
    """The tokens the apiserver's token authenticators would review for a request with these
    headers, in its order, each with whether it is the WebSocket bearer protocol's; and whether
    one of its authenticators fails before any review (a malformed WebSocket bearer protocol: the
    request is then ``401`` unless a token succeeds)."""
    tokens: list[tuple[str, bool]] = []
    failed = False
    token = bearer_token(headers.get("Authorization", ""))
    if token is not None:
        tokens.append((token, False))
    if is_websocket_request(headers):
        ws, failed, _ = protocol_token(header_values(headers, "Sec-WebSocket-Protocol"))
        if ws is not None:
            tokens.append((ws, True))
    return tokens, failed


def without_token_protocol(headers: CIMultiDict[str]) -> None:
    """Drop the bearer-token entry from ``Sec-WebSocket-Protocol``, as ``ProtocolAuthenticator``
    does once it has authenticated the request by it (the others, trimmed, joined with ``,``)."""
    _, _, kept = protocol_token(header_values(headers, "Sec-WebSocket-Protocol"))
    headers["Sec-WebSocket-Protocol"] = ",".join(kept)


def header_values(headers: Mapping[str, str], name: str) -> list[str]:
    """Every value of header ``name``, in order (Go's ``req.Header[name]``)."""
    getall = getattr(headers, "getall", None)
    if getall is not None:
        return [str(v) for v in getall(name, ())]
    value = headers.get(name)
    return [value] if value is not None else []


def bearer_token(authorization: str) -> str | None:
    """The token ``bearertoken.Authenticator`` (staging/src/k8s.io/apiserver/pkg/authentication/
    request/bearertoken/bearertoken.go) reviews for this first ``Authorization`` value, or None:
    ``strings.TrimSpace`` (Unicode white space), ``strings.SplitN(auth, " ", 3)``, the scheme
    ``strings.ToLower``-ed equal to ``bearer``, the second part non-empty."""
    auth = trim_space(authorization)
    if not auth:
        return None
    parts = auth.split(" ", 2)
    if len(parts) < 2 or to_lower(parts[0]) != "bearer" or not parts[1]:
        return None
    return parts[1]


def reviewable(token: str) -> bool:
    """Whether a ``TokenReview`` of ``token`` reviews that token: the apiserver's TokenReview
    handler (pkg/registry/authentication/tokenreview/storage.go) puts it behind ``Bearer `` in a
    fake request and reads it back with ``bearertoken.Authenticator``, so a token with an ASCII
    space, or with white space at its end (``strings.TrimSpace``), is reviewed as another one
    (``<token> x`` as ``<token>``), while the apiserver's own authenticators get it whole (the
    WebSocket protocol's token; an Authorization token followed by a space and more)."""
    return bearer_token("Bearer " + token) == token


def is_upgrade_request(headers: Mapping[str, str]) -> bool:
    """``httpstream.IsUpgradeRequest`` (staging/src/k8s.io/streaming/pkg/httpstream/httpstream.go):
    some ``Connection`` value, ``strings.ToLower``-ed, contains ``upgrade`` anywhere."""
    return any("upgrade" in to_lower(v) for v in header_values(headers, "Connection"))


def is_websocket_request(headers: Mapping[str, str]) -> bool:
    """``wsstream.IsWebSocketRequest`` (staging/src/k8s.io/streaming/pkg/httpstream/wsstream/
    conn.go): the first ``Upgrade`` value ``strings.EqualFold`` ``websocket`` (so ``websocket``
    spelled with U+017F LATIN SMALL LETTER LONG S is one), and :func:`is_upgrade_request`."""
    return equal_fold(headers.get("Upgrade", ""), "websocket") and is_upgrade_request(headers)


def protocol_token(values: list[str]) -> tuple[str | None, bool, list[str]]:
    """(token, failed, the other protocols) as ``ProtocolAuthenticator`` (staging/src/k8s.io/
    apiserver/pkg/authentication/request/websocket/protocol.go) reads ``Sec-WebSocket-Protocol``:
    every value split on ``,``, each entry ``strings.TrimSpace``-d; at most one
    ``base64url.bearer.authorization.k8s.io.`` entry, ``base64.RawURLEncoding`` of UTF-8."""
    token = ""
    seen = False
    others: list[str] = []
    for value in values:
        for proto in value.split(","):
            proto = trim_space(proto)
            if not proto.startswith(_WS_TOKEN_PREFIX):
                others.append(proto)
                continue
            if seen:
                return None, True, others  # "multiple base64.bearer.authorization tokens specified"
            seen = True
            raw = raw_url_decode(proto[len(_WS_TOKEN_PREFIX) :])
            if raw is None:
                return None, True, others  # "invalid base64.bearer.authorization token encoding"
            try:
                token = raw.decode("utf-8")  # utf8.Valid: no surrogates, no overlong forms
            except UnicodeDecodeError:
                return None, True, others  # "invalid base64.bearer.authorization token"
    if token and not others:
        return None, True, others  # "missing additional subprotocol"
    return (token or None), False, others


def identity_from_user_info(info: Mapping[str, Any]) -> Identity:
    """An ``Identity`` from a ``UserInfo`` object (TokenReview ``status.user``, SelfSubjectReview
    ``status.userInfo``)."""
    extra_raw = info.get("extra") or {}
    extra = {str(k): tuple(str(v) for v in (vals or ())) for k, vals in extra_raw.items()}
    return Identity(
        user=str(info.get("username", "")),
        groups=tuple(str(g) for g in info.get("groups") or ()),
        uid=str(info.get("uid", "")),
        extra=extra,
    )


class Authenticator:
    """The caller's identity for one kproxy (one per ``FilterContext``; see :func:`authenticator`).

    ``success_ttl``/``failure_ttl`` bound how long a token review is trusted: a revoked token
    keeps working through kproxy's policy decisions, and for reads the watch cache serves, for at
    most ``success_ttl`` (the apiserver
    itself still authenticates every forwarded request, so this only affects which rule applies).
    """

    def __init__(
        self,
        ctx: FilterContext,
        *,
        success_ttl: float = 10.0,
        failure_ttl: float = 5.0,
        max_entries: int = 4096,
        max_rejected_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self._clock = clock
        self.success_ttl = success_ttl
        self.failure_ttl = failure_ttl
        # Accepted and rejected tokens are kept apart: rejected ones cost a caller nothing to make
        # (random bytes), and must never push an accepted one out of the cache.
        self._cache: TTLCache[bytes, Identity] = TTLCache(max_entries)
        self._rejected: TTLCache[bytes, bool] = TTLCache(max_rejected_entries)
        self._inflight: dict[bytes, asyncio.Future[Identity | None]] = {}
        # Accepted tokens remembered for ``remember`` seconds after their review was sent (0:
        # none), for reads served while the apiserver cannot be asked (``kproxy.identity.offline``).
        self.remember = 0.0
        self._known: TTLCache[bytes, tuple[Identity, float]] = TTLCache(max_entries)
        self._own: Identity | None = None
        self._own_lock = asyncio.Lock()
        self._reviews, self._cache_hits = _metrics(ctx)
        self._limit = review_limiter(ctx)  # TokenReviews in flight, shared fairly between client addresses

    # ------------------------------------------------------------------ forward mode

    async def authenticate_token(self, token: str, source: str = "") -> Identity | None:
        """The identity the apiserver gives ``token``, or ``None`` when it rejects the token.

        Raises :class:`TokenReviewError` when the apiserver cannot be asked (nothing is cached then).
        """
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        now = self._clock()
        found, cached = self._cache.get(key, now)
        if found:
            self._cache_hits.inc()
            return cached
        if self._rejected.get(key, now)[0]:
            self._cache_hits.inc()
            return None
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Identity | None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        release: Callable[[], None] | None = None
        sent = now
        try:
            # A review on behalf of client address ``source``: it waits for that address's turn,
            # 429 when that address's own queue is full or it waited too long (reviewlimit).
            release = await self._limit.acquire(source)
            sent = self._clock()
            result = await self._review(token)
            self._reviews.labels("authenticated" if result is not None else "rejected").inc()
        except BaseException as err:
            if release is not None:
                self._reviews.labels("error").inc()
            fut.set_exception(err if isinstance(err, Exception) else TokenReviewError("cancelled"))
            fut.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        else:
            if result is not None:
                self._cache.put(key, result, self._clock() + self.success_ttl)
                if self.remember > 0:
                    self._known.put(key, (result, sent), sent + self.remember)
            else:
                self._rejected.put(key, True, self._clock() + self.failure_ttl)
                self._known.put(key, (ANONYMOUS, sent), sent)  # a rejection ends what was known
            fut.set_result(result)
            return result
        finally:
            del self._inflight[key]
            if release is not None:
                release()

    def known_identity(self, token: str, within: float) -> Identity | None:
        """The identity a review sent less than ``within`` (and ``remember``) seconds ago gave
        ``token``, if no review rejected it since; else None. Sends nothing."""
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        now = self._clock()
        found, known = self._known.get(key, now)
        if not found or known is None or now - known[1] >= within:
            return None
        return known[0]

    async def _review(self, token: str) -> Identity | None:
        # A token is any bytes to the apiserver's authenticators; JSON cannot carry those that are
        # not UTF-8, and Go's encoding/json writes U+FFFD for each (as the apiserver's own webhook
        # TokenReviews do), so kproxy sends what Go would (kproxy.gocompat.utf8.replaced).
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": replaced(token)}}
        try:
            status, answer = await self.ctx.api.json("POST", _TOKEN_REVIEWS, body)
        except Exception as err:  # OSError, TimeoutError, aiohttp.ClientError: the apiserver was not reached
            raise TokenReviewError(f"TokenReview failed: {err}") from err
        if status not in (200, 201) or not isinstance(answer, dict):
            raise TokenReviewError(f"TokenReview answered {status}: {_message(answer)}")
        result = answer.get("status") or {}
        if not result.get("authenticated"):
            return None
        return identity_from_user_info(result.get("user") or {})

    async def authenticate_request(self, headers: Mapping[str, str], source: str = "") -> tuple[Identity, bool]:
        """The identity the apiserver's token authenticators give a request with these headers, and
        whether it came from the WebSocket bearer protocol (the apiserver then removes that entry
        from ``Sec-WebSocket-Protocol``: :func:`without_token_protocol`).

        The tokens of :func:`caller_tokens` in order, the first accepted one wins; none: the
        anonymous user, unless a token was rejected or a WebSocket bearer protocol was malformed,
        which gets the apiserver's ``401`` (as does a caller without credentials when
        ``upstream.anonymous_auth`` is false). Raises :class:`TokenReviewError` (not asked).
        """
        tokens, failed = caller_tokens(headers)
        for token, by_protocol in tokens:
            if not reviewable(token):
                # A TokenReview would review another token than the one the apiserver's
                # authenticators get: kproxy cannot learn their verdict, and never guesses one.
                failed = True
                continue
            found = await self.authenticate_token(token, source)
            if found is not None:
                return found, by_protocol
            failed = True
        if failed or not self.ctx.anonymous_auth:
            # A rejected token; or no credentials at an apiserver whose anonymous auth is off
            # (``upstream.anonymous_auth: false``): its 401, the same Status either way.
            raise unauthorized("Unauthorized")
        return ANONYMOUS, False

    # ------------------------------------------------------------------ proxy mode

    async def own_identity(self) -> Identity:
        """kproxy's own identity (what every caller is in ``credentials: proxy``), asked once."""
        if self._own is not None:
            return self._own
        async with self._own_lock:
            if self._own is None:
                body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
                try:
                    status, answer = await self.ctx.api.json("POST", _SELF_SUBJECT_REVIEWS, body)
                except Exception as err:
                    raise TokenReviewError(f"SelfSubjectReview failed: {err}") from err
                if status not in (200, 201) or not isinstance(answer, dict):
                    raise TokenReviewError(f"SelfSubjectReview answered {status}: {_message(answer)}")
                self._own = identity_from_user_info((answer.get("status") or {}).get("userInfo") or {})
            return self._own

    # ------------------------------------------------------------------ per request

    async def identify(self, ex: Exchange) -> Identity:
        """Set and return ``ex.identity`` (kept if already set).

        Raises ``StatusError``: the apiserver's 401 for a token it rejects; a 500 Status when the
        apiserver cannot be asked (kproxy never guesses an identity). The caller's own
        ``Impersonate-*`` headers (``proxy``, ``forward``: they go upstream) make it the identity
        the apiserver acts as (``kproxy.identity.impersonation_headers``; its 400 for malformed ones).
        """
        if ex.identity is not None:
            return ex.identity
        try:
            if self.ctx.credentials == "proxy":
                identity = await self.own_identity()
            else:
                identity, _ = await self.authenticate_request(ex.headers, str(ex.client or ""))
        except TokenReviewError as err:
            raise _review_failed(err) from err
        if self.ctx.credentials in ("proxy", "forward"):
            identity = impersonated(ex.headers, identity)
        ex.identity = identity
        return identity


def _metrics(ctx: FilterContext) -> tuple[Counter, Counter]:
    """The authenticator metrics, registered once per registry (several Authenticators may share one)."""

    def make() -> tuple[Counter, Counter]:
        reviews = Counter(
            "kproxy_token_reviews_total",
            "TokenReviews kproxy sent to learn callers' identities, by result (authenticated, rejected, error).",
            ["result"],
            registry=ctx.registry,
        )
        hits = counter(
            "kproxy_token_reviews_cache_hits_total",
            "Caller identities answered from the TokenReview cache.",
            registry=ctx.registry,
        )
        return reviews, hits

    return ctx.service(_METRICS_KEY, make)


def _message(answer: Any) -> str:
    if isinstance(answer, dict):
        return str(answer.get("message", answer))
    return str(answer)[:200]


def _review_failed(err: TokenReviewError) -> StatusError:
    return internal_error(f"kproxy could not establish the caller's identity: {err}")


def authenticator(ctx: FilterContext) -> Authenticator:
    """The one ``Authenticator`` of this kproxy (created on first use, kept as a ``ctx`` service;
    ``credentials: impersonate`` puts its own there first, with its configured lifetimes)."""
    return ctx.service(SERVICE_KEY, lambda: Authenticator(ctx))
