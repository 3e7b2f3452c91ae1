"""Response and request header rules for a body kproxy re-encodes (RFC 9110).

- ``Content-Encoding`` names the coding; ``Content-Length`` goes (the new length is known only
  for bodies compressed whole, and the server frames those itself).
- ``Vary: Accept-Encoding`` is added beside any existing ``Vary`` (the apiserver's discovery
  sends ``Vary: Accept``), never replacing it, and not repeated.
- ``ETag`` stays as the upstream sent it, as the apiserver leaves it when it gzips
  (k8s.io/apiserver pkg/endpoints/handlers/responsewriters/writers.go ``deferredResponseWriter``;
  NYTimes gziphandler around kube-openapi's /openapi/v2). RFC 9110 8.8.3.3 asks for a distinct
  strong tag (or a weak one) per content coding, but the apiserver recognises only its own
  spelling: aggregated discovery compares ``If-None-Match`` with ``"<hash>"`` as an exact string
  (pkg/endpoints/discovery/aggregated/etag.go), and clients rebuild the tag from the hash (the
  e2e suite's OpenAPI poller). Any other tag loses the 304 whenever a revalidation is not mapped
  back on its way up (another ``Accept-Encoding``, a rebuilt tag). ``Vary: Accept-Encoding``
  keeps the codings apart in caches (RFC 9111 4.1), the apiserver's own argument for one tag
  across ``Accept`` types (aggregated/handler.go ``cachedGroupList``; kube-openapi handler.go),
  and a 206 is never compressed.
"""

from __future__ import annotations

from multidict import CIMultiDict


def _tokens(headers: CIMultiDict[str], name: str) -> list[str]:
    return [t.strip().lower() for v in headers.getall(name, ()) for t in v.split(",") if t.strip()]


def has_token(headers: CIMultiDict[str], name: str, token: str) -> bool:
    """Whether a comma-separated header (any of its lines) lists ``token`` (case-insensitive)."""
    return token in _tokens(headers, name)


def no_transform(headers: CIMultiDict[str]) -> bool:
    """``Cache-Control: no-transform`` (RFC 9111 5.2.1.6 / 5.2.2.6)."""
    return has_token(headers, "Cache-Control", "no-transform")


def add_vary(headers: CIMultiDict[str]) -> None:
    vary = _tokens(headers, "Vary")
    if "accept-encoding" not in vary and "*" not in vary:
        headers.add("Vary", "Accept-Encoding")


def mark_encoded(headers: CIMultiDict[str], coding: str) -> None:
    """Headers of a response whose body is now ``coding``-encoded."""
    headers["Content-Encoding"] = coding
    headers.popall("Content-Length", None)
    add_vary(headers)
