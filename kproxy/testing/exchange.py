"""``make_exchange``: an :class:`~kproxy.core.chain.Exchange` built as the server builds one.

The target is read as ``kproxy.server.proxy`` reads it (``kproxy.gocompat.url.parse_request_uri``,
then ``kproxy.core.requestinfo.request_info_for``): ``raw_path`` is the path exactly as sent,
``raw_query`` the query, ``host`` the authority of an absolute-form target, and a target
``NewRequestInfo`` refuses gets the RequestInfo the server would carry with it. Unit tests use it
instead of writing their own ``Exchange(...)``; the in-process tests use a real server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from multidict import CIMultiDict

from kproxy.core.chain import Body, BytesBody, Exchange
from kproxy.core.requestinfo import RequestInfo, RequestInfoError, request_info_for
from kproxy.gocompat.url import parse_request_uri

__all__ = ["make_exchange"]

Headers = Mapping[str, str] | Iterable[tuple[str, str]] | None


def make_exchange(
    method: str = "GET",
    target: str = "/api/v1/namespaces/default/pods",
    headers: Headers = None,
    body: bytes | Body = b"",
    *,
    media_type: str = "",
    info: RequestInfo | None = None,
    client: Any = None,
    upgrade: bool = False,
) -> Exchange:
    """An Exchange for ``method target`` with ``headers`` (a mapping or (name, value) pairs) and
    ``body`` (bytes, held with ``media_type``, or a ready Body). ``info`` replaces the RequestInfo
    read from the target. Raises ``InvalidRequestURIError`` for a target Go's server answers 400."""
    uri = parse_request_uri(target)
    if info is None:
        try:
            info = request_info_for(method, uri)
        except RequestInfoError as err:
            info = err.info
    h: CIMultiDict[str] = CIMultiDict()
    if headers is not None:
        h.extend(headers.items() if isinstance(headers, Mapping) else headers)
    b = BytesBody(body, media_type or h.get("Content-Type", "")) if isinstance(body, bytes) else body
    return Exchange(
        method,
        uri.escaped_path,
        uri.raw_query,
        h,
        b,
        info,
        client=client,
        upgrade=upgrade,
        host=uri.host or h.get("Host", ""),
    )
