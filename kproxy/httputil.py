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


Headers = CIMultiDict[str] | CIMultiDictProxy[str] | list[tuple[str, str]]


#: What a request loses on its way upstream: the upstream's own Host is set when sending, and
#: ``Expect: 100-continue`` is answered by kproxy itself (the body is streamed on as it comes).
REQUEST_SKIP = HOP_BY_HOP | {"host", "expect"}
#: The same for an upgrade request, which must keep Connection and Upgrade.
UPGRADE_REQUEST_SKIP = REQUEST_SKIP - {"connection", "upgrade"}


def end_to_end(headers: Headers, skip: frozenset[str] = HOP_BY_HOP) -> CIMultiDict[str]:
    """A copy without the ``skip`` headers (lower-case names; hop-by-hop ones by default) and
    without the headers Connection names.

    Runs once for each request and each response: one C-level copy, then a few lookups.
    ``headers`` may be a multidict or the raw (name, value) pairs a parser produced.
    """
    out: CIMultiDict[str] = CIMultiDict(headers)
    names: Iterable[str] = skip
    if "Connection" in out:
        # Headers named in Connection go too, except the hop-by-hop ones the caller keeps.
        names = skip | (connection_tokens(out) - (HOP_BY_HOP - skip))
    for name in names:
        if name in out:
            out.popall(name)
    return out
