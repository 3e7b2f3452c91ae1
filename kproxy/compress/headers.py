"""Response and request header rules for a body kproxy re-encodes (RFC 9110).

- ``Content-Encoding`` names the coding; ``Content-Length`` goes (the new length is known only
  for bodies compressed whole, and the server frames those itself).
- ``Vary: Accept-Encoding`` is added beside any existing ``Vary`` (the apiserver's discovery
  sends ``Vary: Accept``), never replacing it, and not repeated.
- A strong ``ETag`` becomes weak: the compressed bytes are not the bytes the strong validator
  names (RFC 9110 8.8.1). The apiserver compares ``If-None-Match`` as an exact string, so a
  request's weak validators are made strong again on the way up (``strong_if_none_match``) and
  discovery clients keep getting their 304s.
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


def weaken_etag(headers: CIMultiDict[str]) -> None:
    etag = headers.get("ETag")
    if etag is not None and etag.startswith('"'):
        headers["ETag"] = "W/" + etag


def mark_encoded(headers: CIMultiDict[str], coding: str) -> None:
    """Headers of a response whose body is now ``coding``-encoded."""
    headers["Content-Encoding"] = coding
    headers.popall("Content-Length", None)
    add_vary(headers)
    weaken_etag(headers)


def strong_if_none_match(headers: CIMultiDict[str]) -> None:
    """``If-None-Match: W/"x"`` -> ``"x"`` (a validator kproxy weakened, see the module doc)."""
    values = headers.getall("If-None-Match", ())
    if not any("W/" in v for v in values):
        return
    fixed = [", ".join(t.strip().removeprefix("W/") for t in v.split(",")) for v in values]
    headers.popall("If-None-Match")
    for v in fixed:
        headers.add("If-None-Match", v)
