"""HTTP helpers shared by the listener and the upstream side: hop-by-hop headers (RFC 9110 7.6.1)."""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    )
)


def connection_tokens(headers: CIMultiDict[str] | CIMultiDictProxy[str]) -> set[str]:
    """Header names listed in Connection (they are hop-by-hop too)."""
    out: set[str] = set()
    for value in headers.getall("Connection", ()):
        out.update(t.strip().lower() for t in value.split(",") if t.strip())
    return out


def is_upgrade(headers: CIMultiDict[str] | CIMultiDictProxy[str]) -> bool:
    """The apiserver's IsUpgradeRequest: Connection contains "upgrade" (any case) and Upgrade is set."""
    return "upgrade" in connection_tokens(headers) and bool(headers.get("Upgrade"))


def end_to_end(
    headers: CIMultiDict[str] | CIMultiDictProxy[str],
    keep: Iterable[str] = (),
    drop: Iterable[str] = (),
) -> CIMultiDict[str]:
    """A copy without hop-by-hop headers (and those Connection names), keeping ``keep``.

    Runs twice per request (request and response headers), so the common case — no extra
    Connection tokens, nothing to keep — uses the precomputed set.
    """
    skip = HOP_BY_HOP
    tokens = connection_tokens(headers) if "Connection" in headers else None
    if tokens or keep or drop:
        skip = (skip | (tokens or set()) | {d.lower() for d in drop}) - {k.lower() for k in keep}
    return CIMultiDict([(name, value) for name, value in headers.items() if name.lower() not in skip])
