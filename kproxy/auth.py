"""Who is calling: the caller's identity, as the apiserver itself would establish it.

Policy filters (``dryrun``, ``validation``) select rules by user and group, and the
``impersonate`` credentials mode acts on the caller's behalf; both need the identity the
apiserver would give the request, never a guess of kproxy's own. So kproxy asks the apiserver:

* ``credentials: forward`` -- the caller's bearer token goes to a ``TokenReview`` (made with
  kproxy's own credentials, which need ``create`` on ``tokenreviews``). Results are cached by a
  SHA-256 of the token (the token itself is never kept), with separate lifetimes for accepted
  and rejected tokens and a bounded number of entries; concurrent requests with the same new
  token share one review. A request without a token is the apiserver's anonymous user; an
  invalid token gets the apiserver's own ``401`` (reason ``Unauthorized``, message
  ``Unauthorized``), which is what the apiserver would have answered.
* ``credentials: proxy`` -- every caller acts as kproxy's own credentials, whose identity is
  learned once with a ``SelfSubjectReview``.

The token is extracted exactly as ``bearertoken.Authenticator`` and the WebSocket protocol
authenticator do (staging/src/k8s.io/apiserver/pkg/authentication/request/bearertoken/bearertoken.go,
.../request/websocket/protocol.go): the first ``Authorization`` header, trimmed, split on single
spaces, scheme ``bearer`` in any case, the second part the token; an empty token counts as none.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import Counter

from kproxy.chain import Exchange, Identity
from kproxy.context import FilterContext
from kproxy.status import StatusError, internal_error, unauthorized

__all__ = [
    "ANONYMOUS",
    "SERVICE_KEY",
    "Authenticator",
    "TokenReviewError",
    "authenticator",
    "bearer_token",
    "identity_from_user_info",
]

#: The identity the apiserver gives a request that carries no credentials (anonymous auth on).
ANONYMOUS = Identity(user="system:anonymous", groups=("system:unauthenticated",))

_TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
_SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
_WS_TOKEN_PREFIX = "base64url.bearer.authorization.k8s.io."
SERVICE_KEY = "kproxy.auth.Authenticator"
_METRICS_KEY = "kproxy.auth.metrics"

# Go's strings.TrimSpace trims Unicode white space; Python's str.strip() agrees for these.
_GO_SPACE = "\t\n\v\f\r \x85\xa0"


class TokenReviewError(Exception):
    """The apiserver could not be asked (network error, non-2xx answer, unexpected body)."""


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The bearer token the apiserver would authenticate, or ``None`` when there is none.

    ``Authorization`` first (bearertoken.go), then a WebSocket ``Sec-WebSocket-Protocol`` entry
    ``base64url.bearer.authorization.k8s.io.<token>`` (protocol.go) for browser-style clients.
    """
    auth = headers.get("Authorization", "").strip(_GO_SPACE)
    if auth:
        parts = auth.split(" ")
        if len(parts) >= 2 and parts[0].lower() == "bearer" and parts[1]:
            return parts[1]
    return _websocket_token(headers.get("Sec-WebSocket-Protocol", ""))


def _websocket_token(header: str) -> str | None:
    if _WS_TOKEN_PREFIX not in header:
        return None
    for proto in header.split(","):
        proto = proto.strip()
        if proto.startswith(_WS_TOKEN_PREFIX):
            encoded = proto[len(_WS_TOKEN_PREFIX) :]
            try:
                token = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
            except (binascii.Error, UnicodeDecodeError):
                return None
            return token or None
    return None


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


class _TTLCache:
    """A small LRU with an expiry per entry: what ``authenticate_token`` remembers."""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._data: OrderedDict[bytes, tuple[float, Identity | None]] = OrderedDict()

    def get(self, key: bytes, now: float) -> tuple[bool, Identity | None]:
        hit = self._data.get(key)
        if hit is None:
            return False, None
        expires, value = hit
        if expires <= now:
            del self._data[key]
            return False, None
        self._data.move_to_end(key)
        return True, value

    def put(self, key: bytes, value: Identity | None, expires: float) -> None:
        self._data[key] = (expires, value)
        self._data.move_to_end(key)
        while len(self._data) > self._max:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self._clock = clock
        self.success_ttl = success_ttl
        self.failure_ttl = failure_ttl
        self._cache = _TTLCache(max_entries)
        self._inflight: dict[bytes, asyncio.Future[Identity | None]] = {}
        self._own: Identity | None = None
        self._own_lock = asyncio.Lock()
        self._reviews, self._cache_hits = _metrics(ctx)

    # ------------------------------------------------------------------ forward mode

    async def authenticate_token(self, token: str) -> Identity | None:
        """The identity the apiserver gives ``token``, or ``None`` when it rejects the token.

        Raises :class:`TokenReviewError` when the apiserver cannot be asked (nothing is cached then).
        """
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found, cached = self._cache.get(key, self._clock())
        if found:
            self._cache_hits.inc()
            return cached
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Identity | None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            result = await self._review(token)
            self._reviews.labels("authenticated" if result is not None else "rejected").inc()
        except BaseException as err:
            self._reviews.labels("error").inc()
            fut.set_exception(err if isinstance(err, Exception) else TokenReviewError("cancelled"))
            fut.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        else:
            ttl = self.success_ttl if result is not None else self.failure_ttl
            self._cache.put(key, result, self._clock() + ttl)
            fut.set_result(result)
            return result
        finally:
            del self._inflight[key]

    async def _review(self, token: str) -> Identity | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
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
        apiserver cannot be asked (kproxy never guesses an identity).
        """
        if ex.identity is not None:
            return ex.identity
        try:
            if self.ctx.credentials == "proxy":
                identity = await self.own_identity()
            else:
                token = bearer_token(ex.headers)
                if token is None:
                    identity = ANONYMOUS
                else:
                    found = await self.authenticate_token(token)
                    if found is None:
                        raise unauthorized("Unauthorized")
                    identity = found
        except TokenReviewError as err:
            raise _review_failed(err) from err
        ex.identity = identity
        return identity


def _metrics(ctx: FilterContext) -> tuple[Counter, Counter]:
    """The authenticator metrics, registered once per registry (several Authenticators may share one)."""

    def make() -> tuple[Counter, Counter]:
        reviews = Counter(
            "kproxy_token_reviews",
            "TokenReviews kproxy sent to learn callers' identities, by result (authenticated, rejected, error).",
            ["result"],
            registry=ctx.registry,
        )
        hits = Counter(
            "kproxy_token_review_cache_hits",
            "Caller identities answered from the TokenReview cache.",
            registry=ctx.registry,
        )
        return reviews, hits

    return ctx.shared(_METRICS_KEY, make)


def _message(answer: Any) -> str:
    if isinstance(answer, dict):
        return str(answer.get("message", answer))
    return str(answer)[:200]


def _review_failed(err: TokenReviewError) -> StatusError:
    return internal_error(f"kproxy could not establish the caller's identity: {err}")


def authenticator(ctx: FilterContext) -> Authenticator:
    """The one ``Authenticator`` of this kproxy (created on first use, kept in ``ctx.services``;
    ``credentials: impersonate`` puts its own there first, with its configured lifetimes)."""
    return ctx.shared(SERVICE_KEY, lambda: Authenticator(ctx))
