"""Go's ``net/url`` as the apiserver's HTTP server applies it to a request target and its query.

Ported from Go 1.26 ``src/net/url/url.go`` (the Go the pinned apiserver is built with):

* :func:`parse_request_uri` is ``url.ParseRequestURI`` (``parse(rawURL, viaRequest=true)``), which
  ``net/http``'s ``readRequest`` runs on every request line. It takes the origin form
  (``/api/v1/pods``), the absolute form (``http://any-host/api/v1/pods``: Go's server routes it by
  its path, ignoring the host), ``*``, and a scheme with an opaque rest; it refuses what Go refuses
  (control bytes, bad escapes, a bad authority), for which Go's server answers ``400 Bad Request``.
* :func:`parse_query` is ``url.ParseQuery``: pairs split on ``&``; a pair with ``;`` or a malformed
  escape is dropped; ``+`` is a space; more than 10,000 parameters and Go returns none at all
  (``URL.Query()`` ignores the error, so the apiserver then sees an empty query).

Decoded bytes that are not UTF-8 are kept as ``surrogateescape`` code points, so nothing is lost
and two different byte strings never decode to the same ``str``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

__all__ = [
    "MAX_QUERY_PARAMS",
    "InvalidRequestURIError",
    "QueryPair",
    "RequestURI",
    "TooManyQueryParams",
    "encode_query",
    "parse_query",
    "parse_request_uri",
    "query_values",
    "unescape_path",
    "with_param",
]

#: ``defaultMaxParams`` in url.go: a query with more ``&``-separated parts parses as empty.
MAX_QUERY_PARAMS = 10000


class InvalidRequestURIError(ValueError):
    """A request target Go's ``url.ParseRequestURI`` refuses; Go's server answers it 400."""


class TooManyQueryParams(ValueError):
    """Adding a parameter would take the query over Go's limit (the apiserver would read none)."""


# --- escaping modes (url.go ``encoding``; shouldEscape from gen_encoding_table.go) -------------------

_PATH = "path"
_QUERY = "query"
_HOST = "host"
_ZONE = "zone"
_USER = "userpassword"

_HEX = frozenset(b"0123456789abcdefABCDEF")
_HOST_ALLOWED = frozenset(b"!$&'()*+,;=:[]<>\"-_.~") | frozenset(
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
)
_CTL = re.compile("[\x00-\x1f\x7f]")


def _host_should_escape(c: int) -> bool:
    """``shouldEscape(c, encodeHost)`` (the same set for encodeZone)."""
    return c not in _HOST_ALLOWED


def _unescape(s: str, mode: str) -> str:
    """``url.unescape``: validate every ``%`` first (Go fails before decoding anything), then decode."""
    if "%" not in s and not (mode == _QUERY and "+" in s) and mode not in (_HOST, _ZONE):
        return s
    raw = s.encode("utf-8", "surrogateescape")
    n = len(raw)
    i = 0
    while i < n:
        c = raw[i]
        if c == 0x25:  # '%'
            if i + 2 >= n or raw[i + 1] not in _HEX or raw[i + 2] not in _HEX:
                raise InvalidRequestURIError(f"invalid URL escape {raw[i : i + 3].decode('latin-1')!r}")
            if mode == _HOST and int(raw[i + 1 : i + 2], 16) < 8 and raw[i : i + 3] != b"%25":
                raise InvalidRequestURIError(f"invalid URL escape {raw[i : i + 3].decode('latin-1')!r}")
            if mode == _ZONE:
                v = int(raw[i + 1 : i + 3], 16)
                if raw[i : i + 3] != b"%25" and v != 0x20 and _host_should_escape(v):
                    raise InvalidRequestURIError(f"invalid URL escape {raw[i : i + 3].decode('latin-1')!r}")
            i += 3
            continue
        if mode in (_HOST, _ZONE) and c < 0x80 and _host_should_escape(c):
            raise InvalidRequestURIError(f"invalid character {chr(c)!r} in host name")
        i += 1
    if b"%" not in raw and not (mode == _QUERY and b"+" in raw):
        return s
    out = bytearray()
    i = 0
    while i < n:
        c = raw[i]
        if c == 0x25:
            out.append(int(raw[i + 1 : i + 3], 16))
            i += 3
            continue
        out.append(0x20 if c == 0x2B and mode == _QUERY else c)
        i += 1
    return out.decode("utf-8", "surrogateescape")


def unescape_path(raw_path: str) -> str:
    """``url.unescape(p, encodePath)``: ``req.URL.Path`` from the path as sent (``+`` stays ``+``)."""
    return _unescape(raw_path, _PATH)


# --- the request target ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestURI:
    """A request target as Go's server reads it.

    ``escaped_path`` is the path exactly as sent (what goes upstream, in origin form); ``path`` is
    ``req.URL.Path`` (decoded: what the apiserver routes and classifies); ``host`` is the authority
    of an absolute-form target (Go then uses it as ``req.Host``, ignoring the Host header).
    ``opaque`` is set for ``scheme:rest`` without a leading ``/`` (``path`` is then empty).
    """

    escaped_path: str
    path: str
    raw_query: str = ""
    scheme: str = ""
    host: str = ""
    opaque: str = ""
    absolute: bool = False

    @property
    def origin_form(self) -> str:
        """The target to send upstream: what Go's server routes, in origin form."""
        return f"{self.escaped_path}?{self.raw_query}" if self.raw_query else self.escaped_path


def _get_scheme(raw: str) -> tuple[str, str]:
    """``getScheme``: a leading ``scheme:`` (letters first, then letters, digits, ``+-.``)."""
    for i, ch in enumerate(raw):
        if "a" <= ch <= "z" or "A" <= ch <= "Z":
            continue
        if "0" <= ch <= "9" or ch in "+-.":
            if i == 0:
                return "", raw
            continue
        if ch == ":":
            if i == 0:
                raise InvalidRequestURIError("missing protocol scheme")
            return raw[:i], raw[i + 1 :]
        return "", raw
    return "", raw


def _valid_optional_port(port: str) -> bool:
    return port == "" or (port[0] == ":" and all("0" <= ch <= "9" for ch in port[1:]))


def _parse_host(scheme: str, host: str) -> str:
    """``parseHost``: ``host[:port]``, ``[ipv6(%25zone)]:port``."""
    bracket = host.rfind("[")
    if bracket > 0:
        raise InvalidRequestURIError("invalid IP-literal")
    if bracket == 0:
        close = host.rfind("]")
        if close < 0:
            raise InvalidRequestURIError("missing ']' in host")
        colon_port = host[close + 1 :]
        if not _valid_optional_port(colon_port):
            raise InvalidRequestURIError(f"invalid port {colon_port!r} after host")
        colon_port = _unescape(colon_port, _HOST)
        hostname = host[1:close]
        zone = hostname.find("%25")
        if zone >= 0:
            unescaped = _unescape(hostname[:zone], _HOST) + _unescape(hostname[zone:], _ZONE)
        else:
            unescaped = _unescape(hostname, _HOST)
        try:
            addr = ipaddress.ip_address(unescaped)
        except ValueError as err:
            raise InvalidRequestURIError(f"invalid host: {err}") from None
        if addr.version == 4:
            raise InvalidRequestURIError("invalid IP-literal")
        return f"[{unescaped}]{colon_port}"
    i = host.find(":")
    if i != -1:
        last = host.rfind(":")
        if last != i and scheme not in ("http", "https"):
            i = last  # only http and https URLs keep strict colons (urlstrictcolons)
        if not _valid_optional_port(host[i:]):
            raise InvalidRequestURIError(f"invalid port {host[i:]!r} after host")
    return _unescape(host, _HOST)


_USERINFO_OK = frozenset("-._:~!$&'()*+,;=%@") | frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
)


def _parse_authority(scheme: str, authority: str) -> str:
    """``parseAuthority``: the host; the userinfo is only checked (the apiserver never reads it)."""
    at = authority.rfind("@")
    host = _parse_host(scheme, authority if at < 0 else authority[at + 1 :])
    if at >= 0:
        userinfo = authority[:at]
        if any(ch not in _USERINFO_OK for ch in userinfo):
            raise InvalidRequestURIError("net/url: invalid userinfo")
        for part in userinfo.split(":", 1):
            _unescape(part, _USER)
    return host


def parse_request_uri(raw: str) -> RequestURI:
    """``url.ParseRequestURI(raw)``; raises :class:`InvalidRequestURIError` where Go fails."""
    if _CTL.search(raw) is not None:
        raise InvalidRequestURIError("net/url: invalid control character in URL")
    if raw == "":
        raise InvalidRequestURIError("empty url")
    if raw == "*":
        return RequestURI("*", "*")
    scheme, rest = _get_scheme(raw) if not raw.startswith("/") else ("", raw)
    scheme = scheme.lower()
    if rest.endswith("?") and rest.count("?") == 1:
        rest, raw_query = rest[:-1], ""
    else:
        rest, _, raw_query = rest.partition("?")
    if not rest.startswith("/"):
        if scheme:
            return RequestURI("", "", raw_query, scheme, opaque=rest, absolute=True)
        raise InvalidRequestURIError(f"parse {raw!r}: invalid URI for request")
    host = ""
    if scheme and rest.startswith("//"):
        authority, slash, tail = rest[2:].partition("/")
        rest = slash + tail
        host = _parse_authority(scheme, authority)
    return RequestURI(rest, unescape_path(rest), raw_query, scheme, host, absolute=bool(scheme))


# --- the query -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueryPair:
    """One ``&``-separated part of a raw query, as sent, and what Go makes of it.

    ``key`` and ``value`` are ``None`` where ``url.ParseQuery`` drops the part (a ``;`` in it, a
    malformed escape, or a query over :data:`MAX_QUERY_PARAMS` parts, which Go drops whole)."""

    raw: str
    key: str | None
    value: str | None


def parse_query(raw_query: str) -> list[QueryPair]:
    """Every non-empty part of ``raw_query`` with Go's reading of it (see :class:`QueryPair`)."""
    if not raw_query:
        return []
    parts = raw_query.split("&")
    if len(parts) > MAX_QUERY_PARAMS:
        return [QueryPair(p, None, None) for p in parts if p]
    out: list[QueryPair] = []
    for part in parts:
        if not part:
            continue
        if ";" in part:
            out.append(QueryPair(part, None, None))
            continue
        key, _, value = part.partition("=")
        try:
            out.append(QueryPair(part, _unescape(key, _QUERY), _unescape(value, _QUERY)))
        except InvalidRequestURIError:
            out.append(QueryPair(part, None, None))
    return out


def query_values(raw_query: str) -> dict[str, list[str]]:
    """``req.URL.Query()``: every value of every key Go keeps, in order."""
    values: dict[str, list[str]] = {}
    for pair in parse_query(raw_query):
        if pair.key is not None and pair.value is not None:
            values.setdefault(pair.key, []).append(pair.value)
    return values


def _escape_query_component(s: str) -> str:
    """``url.QueryEscape``."""
    out = []
    for b in s.encode("utf-8", "surrogateescape"):
        ch = chr(b)
        if ch.isascii() and (ch.isalnum() or ch in "-_.~"):
            out.append(ch)
        elif b == 0x20:
            out.append("+")
        else:
            out.append(f"%{b:02X}")
    return "".join(out)


def encode_query(pairs: list[tuple[str, str]]) -> str:
    """``url.Values.Encode`` without its sorting: each pair query-escaped, in the given order."""
    return "&".join(f"{_escape_query_component(k)}={_escape_query_component(v)}" for k, v in pairs)


def with_param(raw_query: str, key: str, value: str, *, fold_case: bool = False) -> str:
    """``raw_query`` with every spelling of ``key`` replaced by one ``key=value`` at the end.

    A part Go reads as ``key`` goes, however it is encoded (``dry%52un``), and with ``fold_case``
    in any letter case too. The other parts are kept byte for byte (those Go drops too: they mean
    nothing to the apiserver either way). Over Go's parameter limit the apiserver reads no parameter
    at all, so only the enforced one is kept: the result always means to the apiserver exactly
    the query it meant, plus ``key=value``. Raises :class:`TooManyQueryParams` where the added
    part would itself take the query over the limit."""
    wanted = key.lower() if fold_case else key
    kept = []
    if raw_query.count("&") < MAX_QUERY_PARAMS:
        for pair in parse_query(raw_query):
            if pair.key is None or (pair.key.lower() if fold_case else pair.key) != wanted:
                kept.append(pair.raw)
    if len(kept) >= MAX_QUERY_PARAMS:
        # One more part and Go would read none of them, the enforced one included.
        raise TooManyQueryParams(f"number of URL query parameters exceeded limit ({MAX_QUERY_PARAMS})")
    kept.append(f"{_escape_query_component(key)}={_escape_query_component(value)}")
    return "&".join(kept)
