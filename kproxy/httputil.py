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
    return _tokens(headers.getall("Connection", ()))


def _tokens(values: Iterable[str]) -> set[str]:
    out: set[str] = set()
    for value in values:
        out.update(t.strip().lower() for t in value.split(",") if t.strip())
    return out


def is_upgrade(headers: CIMultiDict[str] | CIMultiDictProxy[str]) -> bool:
    """The apiserver's IsUpgradeRequest: Connection contains "upgrade" (any case) and Upgrade is set."""
    return "upgrade" in connection_tokens(headers) and bool(headers.get("Upgrade"))


Headers = CIMultiDict[str] | CIMultiDictProxy[str] | list[tuple[str, str]]


def end_to_end(headers: Headers, keep: Iterable[str] = (), drop: Iterable[str] = ()) -> CIMultiDict[str]:
    """A copy without hop-by-hop headers (and those Connection names), keeping ``keep``.

    Runs once for each request and each response, so the common case — no extra Connection
    tokens, nothing to keep — uses the precomputed set. ``headers`` may be a multidict or the
    raw (name, value) pairs a parser produced.
    """
    if isinstance(headers, list):
        pairs: Iterable[tuple[str, str]] = headers
        tokens = _tokens(v for k, v in headers if k.lower() == "connection")
    else:
        pairs = headers.items()
        tokens = connection_tokens(headers) if "Connection" in headers else set()
    skip = HOP_BY_HOP
    if tokens or keep or drop:
        skip = (skip | tokens | {d.lower() for d in drop}) - {k.lower() for k in keep}
    return CIMultiDict([(name, value) for name, value in pairs if name.lower() not in skip])
