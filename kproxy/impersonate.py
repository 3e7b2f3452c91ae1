"""``credentials: impersonate``: kproxy authenticates each caller itself and calls the upstream
with its own credentials plus ``Impersonate-*`` headers naming the caller.

This is for a gateway whose callers' credentials cannot be forwarded (client certificates from
another CA, tokens the gateway must not pass on). The apiserver then authorizes every request as
the caller, so RBAC, audit and field managers see the caller, not kproxy.

Authentication follows the apiserver's own order (x509 first, then bearer tokens, then
anonymous; ``pkg/kubeapiserver/authenticator/config.go``):

- a client certificate verified against ``tls.client_ca_file`` during the handshake: the user
  is its Common Name, the groups its Organizations (the x509 authenticator's ``CommonNameUserConversion``);
- else a bearer token (``Authorization``, or a WebSocket request's bearer protocol, as the apiserver
  finds them: ``kproxy.auth.caller_tokens``), through a TokenReview (cached briefly, see
  ``impersonate.token_cache_ttl``); a token the apiserver rejects gets the apiserver's own ``401``;
- else the anonymous user, impersonated as such (the apiserver gives it exactly the anonymous
  user's rights). The apiserver would take an impersonation of ``system:anonymous`` from kproxy
  even with its own anonymous auth off, so ``upstream.anonymous_auth: false`` (the operator says
  it is off) makes such a caller the apiserver's ``401`` instead.

Any ``Impersonate-*`` header the caller sent is removed (kproxy's own impersonation must be the
only one; the caller is told in a ``Warning``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from multidict import CIMultiDict

from kproxy.auth import SERVICE_KEY, Authenticator, TokenReviewError, without_token_protocol
from kproxy.chain import Exchange, Identity
from kproxy.context import FilterContext
from kproxy.status import internal_error

AUTHENTICATED = "system:authenticated"
STRIPPED_WARNING = (
    '299 - "kproxy (credentials: impersonate) removed the Impersonate-* headers of this request: '
    'it acts as the caller it authenticated"'
)

# client-go's transport.headerKeyEscape: RFC 7230 token characters pass, every other byte (and
# '%') is percent-encoded; the apiserver undoes it with url.PathUnescape.
_TOKEN_CHARS = frozenset(b"!#$&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def escape_extra_key(key: str) -> str:
    return "".join(chr(b) if b in _TOKEN_CHARS else f"%{b:02X}" for b in key.encode())


def impersonation_headers(identity: Identity) -> list[tuple[str, str]]:
    """The ``Impersonate-*`` headers that make the apiserver act as ``identity``."""
    out = [("Impersonate-User", identity.user)]
    if identity.uid:
        out.append(("Impersonate-Uid", identity.uid))
    out += [("Impersonate-Group", g) for g in identity.groups]
    for key, values in identity.extra.items():
        name = "Impersonate-Extra-" + escape_extra_key(key)
        out += [(name, v) for v in values]
    return out


def has_impersonation(headers: Mapping[str, str]) -> bool:
    return any(k.lower().startswith("impersonate-") for k in headers)


def strip_impersonation(headers: CIMultiDict[str]) -> None:
    """Remove every ``Impersonate-*`` header."""
    for name in {k for k in headers if k.lower().startswith("impersonate-")}:
        headers.popall(name)


def identity_from_peercert(peercert: Any) -> Identity | None:
    """The apiserver's x509 user for a verified client certificate (``ssl`` ``getpeercert()``)."""
    if not peercert:
        return None
    user = ""
    groups: list[str] = []
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                user = value
            elif key == "organizationName":
                groups.append(value)
    if not user:
        return None  # the x509 authenticator refuses a certificate without a Common Name
    if AUTHENTICATED not in groups:
        groups.append(AUTHENTICATED)
    return Identity(user=user, groups=tuple(groups))


class CallerAuthenticator:
    """Establishes ``ex.identity`` for every request in impersonate mode (before the chain runs)."""

    def __init__(self, ctx: FilterContext, token_ttl: float, rejected_ttl: float) -> None:
        # Shared with the policy filters, which then see the same identity without another review.
        self.tokens = Authenticator(ctx, success_ttl=token_ttl, failure_ttl=rejected_ttl)
        ctx.services[SERVICE_KEY] = self.tokens

    async def identify(self, ex: Exchange, peercert: Any) -> Identity:
        """Set ``ex.identity``; raise the apiserver's 401 for a rejected token, 500 if the
        apiserver cannot be asked (kproxy never guesses an identity)."""
        identity = identity_from_peercert(peercert)
        if identity is None:
            try:
                identity, by_protocol = await self.tokens.authenticate_request(ex.headers)
            except TokenReviewError as err:
                raise internal_error(f"kproxy could not establish the caller's identity: {err}") from err
            if by_protocol:
                # As the apiserver does: the upstream's WebSocket handshake never sees the token.
                without_token_protocol(ex.headers)
        ex.identity = identity
        return identity
