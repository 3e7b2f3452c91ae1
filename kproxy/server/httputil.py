"""HTTP helpers shared by the listener and the upstream side: hop-by-hop headers (RFC 9110 7.6.1)
and the one writer of the request heads kproxy sends upstream (:func:`request_head`)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from multidict import CIMultiDict, CIMultiDictProxy

from kproxy.core.status import StatusError, bad_request
from kproxy.gocompat.httpguts import (
    TOKEN_CHARS,
    first_invalid_name,
    first_invalid_value,
    valid_host_header,
)
from kproxy.gocompat.strconv import go_quote
from kproxy.gocompat.strings import to_lower

#: How header bytes become text and back: aiohttp's server decodes them as UTF-8 with
#: ``surrogateescape`` (a byte that is not UTF-8 becomes a lone surrogate), and the request-head
#: writer encodes them back the same way, so a caller's bytes (Go's obs-text, 0x80-0xff) go
#: upstream unchanged, valid UTF-8 or not.
HEADER_CHARSET = "utf-8"

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
    """Header names listed in Connection (they are hop-by-hop too), lower-cased, as Go's
    ``httputil.ReverseProxy`` finds them (net/http/httputil/reverseproxy.go
    ``removeHopByHopHeaders``): each value split on ``,``, ``textproto.TrimString`` (ASCII white
    space only), non-empty. ``Header.Del`` matches names in ASCII case only, and a name that is
    not a token matches no header, so only token names are kept (``str.lower`` would fold U+212A
    KELVIN SIGN into ``k`` and name a header Go leaves in place)."""
    out: set[str] = set()
    for value in headers.getall("Connection", ()):
        for t in value.split(","):
            name = t.strip(" \t\r\n")
            if name and TOKEN_CHARS.issuperset(name):
                out.add(name.lower())
    return out


def is_upgrade(headers: CIMultiDict[str] | CIMultiDictProxy[str]) -> bool:
    """Whether the request goes upstream as an upgrade (its Connection and Upgrade kept, the
    connection spliced after a 101): the apiserver's ``httpstream.IsUpgradeRequest``
    (staging/src/k8s.io/streaming/pkg/httpstream/httpstream.go, which its upgrade-aware proxy
    and WebSocket detection use: some Connection value, ``strings.ToLower``-ed, contains
    ``upgrade``), with an Upgrade header to ask for. Any other request loses both headers, so the
    apiserver sees no upgrade either."""
    return bool(headers.get("Upgrade")) and any("upgrade" in to_lower(v) for v in headers.getall("Connection", ()))


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


# A request target never holds a control byte, a space or DEL (Go's RequestURI is escaped).
_INVALID_TARGET = re.compile(r"[\x00-\x20\x7f]")


class InvalidRequestHead(ValueError):
    """A request head kproxy refuses to write: a header name or value (or the request line) that
    Go's ``Transport`` would not send and the apiserver's ``net/http`` would not read. The text
    is Go's (``net/http: invalid header field value for "Name"``) and never quotes the value,
    which may be a credential (Go's ``validateHeaders`` leaves it out for the same reason)."""

    def status(self) -> StatusError:
        """The caller's answer. What is left for the writer to refuse comes from the caller's own
        request (kproxy's identities and credentials are checked where they are made), so it is
        the caller's 400, as Go's server in front of the apiserver refuses a head it cannot read
        (``400 Bad Request: invalid header value``); nothing was written upstream."""
        return bad_request(f"kproxy cannot send this request upstream: {self}")


def request_head(method: str, target: str, host: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """An HTTP/1.1 request head: request line, Host, the given headers, blank line.

    The one writer of request heads kproxy sends upstream (the pool and the upgrade path): it
    refuses, with :class:`InvalidRequestHead`, every name that is not an RFC 7230 token and every
    value with a byte Go's ``httpguts.ValidHeaderFieldValue`` refuses (CR, LF, NUL, other
    controls, DEL), as Go's ``Transport`` does before writing anything (``net/http/transport.go``
    ``validateHeaders``). Text is encoded back to the bytes it was read from (``HEADER_CHARSET``
    with ``surrogateescape``); text that no bytes were read as (a lone surrogate outside the
    escapes) is refused too.

    The values are checked on the encoded head in one C loop: its control bytes must be exactly
    the CR LF ending each line (a CR, LF, NUL, ... inside any field adds one). This runs on every
    request; the per-field checks of ``kproxy.gocompat.httpguts`` only name the field that failed.
    """
    if not method or not TOKEN_CHARS.issuperset(method):
        raise InvalidRequestHead(f"net/http: invalid method {go_quote(method)}")
    if not target or " " in target:
        # Go writes URL.RequestURI(), which is escaped: never a space (nor a control byte, below).
        raise InvalidRequestHead("net/http: invalid request target")
    if not valid_host_header(host):
        raise InvalidRequestHead("http: invalid Host header")
    pairs = headers if isinstance(headers, list) else list(headers)
    bad_name = first_invalid_name([k for k, _ in pairs])
    if bad_name is not None:
        raise InvalidRequestHead(f"net/http: invalid header field name {go_quote(bad_name)}")
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"]
    lines += [f"{k}: {v}\r\n" for k, v in pairs]
    lines.append("\r\n")
    try:
        head = "".join(lines).encode(HEADER_CHARSET, "surrogateescape")
    except UnicodeEncodeError:
        raise _which(target, host, pairs) from None
    line_ends = 2 * (len(pairs) + 3)  # request line, Host, the headers, the blank line
    if len(head) - len(head.translate(None, _CONTROLS)) != line_ends:
        raise _which(target, host, pairs)
    return head


# httpguts' isCTL && !isLWS: the bytes no field may hold (CR and LF only end lines).
_CONTROLS = bytes([*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F])


def _which(target: str, host: str, pairs: list[tuple[str, str]]) -> InvalidRequestHead:
    """The error naming the first field of a refused head."""
    if not _encodes(target) or _INVALID_TARGET.search(target) is not None:
        return InvalidRequestHead("net/http: invalid request target")
    if not valid_host_header(host):
        return InvalidRequestHead("http: invalid Host header")
    bad = first_invalid_value([v for _, v in pairs])
    if bad is None:
        bad = next((i for i, (_, v) in enumerate(pairs) if not _encodes(v)), None)
    if bad is None:
        return InvalidRequestHead("net/http: invalid request head")
    return InvalidRequestHead(f"net/http: invalid header field value for {go_quote(pairs[bad][0])}")


def _encodes(text: str) -> bool:
    try:
        text.encode(HEADER_CHARSET, "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True
